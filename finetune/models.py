"""Task heads on our BERT encoder, with Hugging Face's parameter names (``classifier``, ``qa_outputs``).

The heads run the encoder through ``encode``: the same layers and weights as ``BertModel.forward``, but
every dense layer sees only the real tokens of the batch (padding is dropped before the projections and
the feed-forward block and put back only around attention). Batches padded to their longest row are
about half padding on GLUE and two thirds on CoNLL-2003, so training steps take 1.3-1.8x less time on CPU
(bench/finetune.py). Dropout draws its masks over the padded shape, so from the same random state
training takes exactly the steps the padded encoder (and ``transformers``' BERT) would take.

Nothing here imports DeepSpeed or torch.distributed.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from pretrain.hf_compat import load_pretrained
from pretrain.model import BertLayer, BertModel


def load_encoder(directory: Path, dropout: float | None = None) -> BertModel:
    """The encoder of a Hugging Face BERT directory (pretraining heads dropped)."""
    pretraining, _ = load_pretrained(directory)
    encoder = pretraining.bert
    if dropout is not None:
        for module in encoder.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
        for layer in encoder.encoder.layer:
            layer.attention.self.dropout_p = dropout
    return encoder


def encode(bert: BertModel, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
           attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``bert(input_ids, token_type_ids, attention_mask)`` computed on the real tokens only.

    Returns the same ``(hidden (B, T, H), pooled (B, H))``; ``hidden`` is zero at padded positions
    (``BertModel`` leaves values there that nothing may use).
    """
    if attention_mask is None:
        return bert(input_ids, token_type_ids, None)
    batch, length = input_ids.shape
    real = attention_mask.reshape(-1).nonzero().squeeze(1)       # flat indices of the real tokens
    attn_mask = attention_mask.bool()[:, None, None, :]          # keys that may be attended to
    x = bert.embeddings(input_ids, token_type_ids).reshape(batch * length, -1).index_select(0, real)
    for layer in bert.encoder.layer:
        if bert.encoder.gradient_checkpointing and bert.training:
            x = torch.utils.checkpoint.checkpoint(_packed_layer, layer, x, real, batch, length, attn_mask,
                                                  use_reentrant=False)
        else:
            x = _packed_layer(layer, x, real, batch, length, attn_mask)
    hidden = _unpack(x, real, batch, length)
    return hidden, (bert.pooler(hidden) if bert.pooler is not None else None)


def _unpack(x: torch.Tensor, real: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """Packed rows (N, C) back to (B, T, C), zeros at padded positions."""
    return x.new_zeros(batch * length, x.shape[-1]).index_copy(0, real, x).view(batch, length, -1)


def _dropout(x: torch.Tensor, module: nn.Dropout, padded_rows: int, real: torch.Tensor) -> torch.Tensor:
    """Dropout of packed rows, with the mask dropout would draw for the padded (B*T, H) tensor.

    On CPU ``F.dropout`` draws ``bernoulli_(1 - p)`` over the whole tensor; drawing the same and keeping
    the real rows leaves the random stream, and so every later mask, as in the padded computation. The
    mask is float32 so that 1 / (1 - p) is not rounded to bf16 under autocast.
    """
    p = module.p
    if not module.training or p == 0.0:
        return x
    keep = torch.empty(padded_rows, x.shape[-1], dtype=torch.float32, device=x.device).bernoulli_(1 - p)
    return (x * keep.index_select(0, real).div_(1 - p)).to(x.dtype)


def _packed_layer(layer: BertLayer, x: torch.Tensor, real: torch.Tensor, batch: int, length: int,
                  attn_mask: torch.Tensor) -> torch.Tensor:
    """One post-LN encoder layer on packed rows (N, H); attention runs padded, as it mixes positions."""
    attention, hidden = layer.attention.self, x.shape[-1]
    head_size = hidden // attention.num_heads
    # One projection GEMM for query, key and value instead of three.
    weight = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight])
    bias = torch.cat([attention.query.bias, attention.key.bias, attention.value.bias])
    qkv = _unpack(F.linear(x, weight, bias), real, batch, length)
    q, k, v = qkv.view(batch, length, 3, attention.num_heads, head_size).permute(2, 0, 3, 1, 4)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=attention.dropout_p if attention.training else 0.0)
    context = context.transpose(1, 2).reshape(batch * length, hidden).index_select(0, real)
    rows = batch * length
    projected = layer.attention.output
    x = projected.LayerNorm(_dropout(projected.dense(context), projected.dropout, rows, real) + x)
    feed_forward = layer.output
    out = feed_forward.dense(layer.intermediate(x))
    return feed_forward.LayerNorm(_dropout(out, feed_forward.dropout, rows, real) + x)


def _init(linear: nn.Linear, std: float) -> nn.Linear:
    nn.init.normal_(linear.weight, std=std)
    nn.init.zeros_(linear.bias)
    return linear


class SequenceClassifier(nn.Module):
    """GLUE: a linear layer on the pooled [CLS]; one output is regression (STS-B, mean squared error)."""

    def __init__(self, bert: BertModel, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.bert, self.num_labels = bert, num_labels
        self.dropout = nn.Dropout(dropout)
        self.classifier = _init(nn.Linear(bert.config.hidden_size, num_labels), bert.config.initializer_range)

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None):
        _, pooled = encode(self.bert, input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(pooled)).float()
        if labels is None:
            return logits
        if self.num_labels == 1:
            return F.mse_loss(logits.squeeze(-1), labels.float()), logits
        return F.cross_entropy(logits, labels), logits


class SpanExtractor(nn.Module):
    """SQuAD: start and end logits per token."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert
        self.qa_outputs = _init(nn.Linear(bert.config.hidden_size, 2), bert.config.initializer_range)

    def forward(self, input_ids, token_type_ids, attention_mask, start_positions=None, end_positions=None):
        hidden, _ = encode(self.bert, input_ids, token_type_ids, attention_mask)
        start, end = self.qa_outputs(hidden).float().unbind(-1)
        # Padding can never be an answer.
        start = start.masked_fill(attention_mask == 0, -1e4)
        end = end.masked_fill(attention_mask == 0, -1e4)
        if start_positions is None:
            return start, end
        loss = (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2
        return loss, (start, end)


class TokenClassifier(nn.Module):
    """CoNLL-2003: a label per token; only first sub-tokens carry labels (-100 elsewhere)."""

    def __init__(self, bert: BertModel, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.bert = bert
        self.dropout = nn.Dropout(dropout)
        self.classifier = _init(nn.Linear(bert.config.hidden_size, num_labels), bert.config.initializer_range)

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None):
        hidden, _ = encode(self.bert, input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(hidden)).float()
        if labels is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100), logits


def pad_batch(rows: list[dict], pad_id: int, multiple: int = 8) -> dict[str, torch.Tensor]:
    """Stack feature dicts, padding the per-token lists to the longest row (rounded up to ``multiple``)."""
    width = max(len(r["input_ids"]) for r in rows)
    width = -(-width // multiple) * multiple
    batch = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if isinstance(values[0], (list, tuple)):
            fill = pad_id if key == "input_ids" else (-100 if key == "labels" else 0)
            batch[key] = torch.tensor([list(v) + [fill] * (width - len(v)) for v in values])
        else:
            batch[key] = torch.tensor(values)
    batch["attention_mask"] = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"]))
                                            for r in rows])
    return batch
