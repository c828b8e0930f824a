"""Task heads on our BERT encoder, with Hugging Face's parameter names (``classifier``, ``qa_outputs``).

The heads run the encoder in its packed mode (``pretrain.model.Packing``): every dense layer sees only the
batch's real tokens, as batches padded to their longest row are largely padding. Dropout draws its masks over
the padded shape, so from the same random state training takes the steps the padded encoder (and
``transformers``' BERT) would take.

Nothing here imports DeepSpeed or torch.distributed.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pretrain.hf_compat import load_pretrained
from pretrain.model import BertModel, Packing


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


def _encode_packed(bert: BertModel, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, Packing]:
    """The encoder on the real tokens of a right-padded batch: (hidden (N, H), pooled (B, H), their packing)."""
    packing = Packing.from_attention_mask(attention_mask)
    hidden, pooled = bert(packing.pack(input_ids), packing.pack(token_type_ids), packing=packing)
    return hidden, pooled, packing


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
        _, pooled, _ = _encode_packed(self.bert, input_ids, token_type_ids, attention_mask)
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
        hidden, _, packing = _encode_packed(self.bert, input_ids, token_type_ids, attention_mask)
        hidden = packing.unpack(hidden)  # (B, T, H), zeros at padding
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
        hidden, _, packing = _encode_packed(self.bert, input_ids, token_type_ids, attention_mask)
        hidden = packing.unpack(hidden)  # (B, T, H), zeros at padding
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
