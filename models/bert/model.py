"""BERT for pretraining, with parameter names identical to Hugging Face's ``BertForPreTraining``.

Post-LN encoder; attention through ``F.scaled_dot_product_attention`` (flash/memory-efficient kernels on
GPU); the MLM head runs only on the masked positions when they are given; the decoder is tied to the word
embeddings. Nothing here imports DeepSpeed or torch.distributed: parallelism is applied from outside.

The encoder runs in two modes with the same modules and weights: padded, ``(B, T)`` tokens and an attention
mask, or padding-free, the real tokens of every row back to back as ``(N,)`` with a ``Unpadding`` that says where
each row's tokens are. In padding-free mode every GEMM sees only the real tokens; the embeddings (lookups and a
LayerNorm) run on the padded grid (``Unpadding.pad``), and attention, which mixes positions, through the kernel
``models.attention`` chose: on the padded grid under a mask, or on the unpadded tokens (variable-length flash
attention on CUDA).

Packed documents (rows ``[CLS] d1 [SEP] d2 [SEP] …``) may be kept apart: with ``document_ids`` a token attends
only to the tokens of its own document (a block-diagonal mask), and ``position_ids`` restart the positions at
each document, so every document is encoded as if it were alone in its row.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from models.attention import SDPA_PADDED_GRID, VARLEN, Unpadding, document_mask, varlen_attention


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS = {"gelu": F.gelu, "gelu_new": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh, "relu": F.relu}


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0

    def __post_init__(self):
        if self.num_attention_heads < 1:
            raise ValueError(f"num_attention_heads is {self.num_attention_heads}; it must be at least 1")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {sorted(_ACTIVATIONS)}")


PRESETS = {
    "tiny": BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "base": BertConfig(),
    "large": BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def preset(name: str, **overrides) -> BertConfig:
    """A named size ("tiny", "base", "large") with field overrides, e.g. vocab_size of the tokenizer."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if position_ids is None:
            positions = self.position_embeddings(torch.arange(input_ids.shape[1], device=input_ids.device))[None]
        else:
            positions = self.position_embeddings(position_ids)  # (B, T, H)
        x = self.word_embeddings(input_ids) + positions + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))  # (B, T, H)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob
        self.unpadded_kernel = SDPA_PADDED_GRID  # padding-free mode's kernel (``models.attention.use``)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        """x: (B, T, H), or unpadded (N, H): then the projections see the real tokens, and attention the padded grid
        (``sdpa-padded-grid``) or the unpadded tokens within each segment (``varlen``)."""
        if unpadding is not None and self.unpadded_kernel == VARLEN:
            if self.training and self.dropout_p > 0:
                raise ValueError("the varlen attention kernel has no dropout; models.attention.choose gives it "
                                 "only to models without attention dropout")
            qkv = self._unpadded_projections(x).view(x.shape[0], 3, self.num_heads, -1)
            out = varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], unpadding.segment_starts, unpadding.longest_segment)
            return out.reshape(x.shape)
        if unpadding is None:
            batch, length, hidden = x.shape
            heads = lambda t: t.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)  # noqa: E731
            q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))  # (B, nh, T, hs)
        else:
            batch, length, hidden = unpadding.batch, unpadding.length, x.shape[-1]
            q, k, v = self._unpadded_heads(x, unpadding)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        out = out.transpose(1, 2).reshape(batch, length, hidden)
        return out if unpadding is None else unpadding.unpad(out)

    def forward_with_scores(self, x: torch.Tensor,
                            attn_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` in padded mode with attention written out, since SDPA returns no scores: the output and the
        unnormalised scores Q K^T / sqrt(head size), (B, nh, T, T), before the mask (distillation fits them:
        TinyBERT). The same operations as SDPA's math, so equal to ``forward`` to rounding; ``forward`` is untouched."""
        batch, length, hidden = x.shape
        heads = lambda t: t.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))  # (B, nh, T, hs)
        scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5)  # (B, nh, T, T)
        weights = scores if attn_mask is None else scores.masked_fill(~attn_mask, float("-inf"))
        weights = F.dropout(weights.softmax(-1), self.dropout_p, self.training)
        return (weights @ v).transpose(1, 2).reshape(batch, length, hidden), scores

    def _unpadded_heads(self, x: torch.Tensor, unpadding: Unpadding) -> torch.Tensor:
        """Query, key and value of unpadded rows (N, H), each (B, nh, T, hs) on the padded grid, from one GEMM.

        One GEMM for the three projections is how finetuning has always computed them: its backward sums the three
        input gradients inside the GEMM, where three GEMMs would add three sums, and that last-bit difference grows
        over training into different scores. The parameters stay three (the checkpoints' names, and the operation
        order of the padded mode that pretraining's losses come from), so their weights are joined for the GEMM.
        """
        qkv = unpadding.pad(self._unpadded_projections(x))  # (B, T, 3H)
        return qkv.view(unpadding.batch, unpadding.length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)

    def _unpadded_projections(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        return F.linear(x, weight, bias)  # (N, 3H)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, unpadding: Unpadding | None = None) -> torch.Tensor:
        x = self.dense(x)
        x = self.dropout(x) if unpadding is None else unpadding.dropout(x, self.dropout)
        return self.LayerNorm(x + residual)  # post-LN


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        return self.output(self.self(x, attn_mask, unpadding), x, unpadding)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertOutput(BertSelfOutput):
    def __init__(self, cfg: BertConfig):
        super().__init__(cfg)
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        x = self.attention(x, attn_mask, unpadding)
        return self.output(self.intermediate(x), x, unpadding)

    def forward_with_scores(self, x: torch.Tensor,
                            attn_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` in padded mode, with the attention's unnormalised scores (``BertSelfAttention``'s)."""
        attended, scores = self.attention.self.forward_with_scores(x, attn_mask)
        x = self.attention.output(attended, x)
        return self.output(self.intermediate(x), x), scores


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.gradient_checkpointing = False  # recompute each layer's activations in backward to save memory

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        for layer in self.layer:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, attn_mask, unpadding, use_reentrant=False)
            else:
                x = layer(x, attn_mask, unpadding)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor, unpadding: Unpadding | None = None) -> torch.Tensor:
        first = hidden[:, 0] if unpadding is None else hidden.index_select(0, unpadding.cu_seqlens[:-1])
        return torch.tanh(self.dense(first))  # the [CLS] position


def embed(embeddings: BertEmbeddings, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
          attention_mask: torch.Tensor | None, unpadding: Unpadding | None, *, position_ids: torch.Tensor | None = None,
          document_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, Unpadding | None]:
    """An encoder's input in either mode (``BertModel.forward``'s arguments): the embedded tokens, (B, T, E) or
    unpadded (N, E), the attention mask, and the unpadding (cut into documents for the varlen kernel when
    ``document_ids`` keep packed documents apart). BERT's, ALBERT's and ELECTRA's encoders all start here."""
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    if unpadding is None:
        if document_ids is not None:
            real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
            attn_mask = document_mask(document_ids, real)
        else:  # Boolean (B, 1, 1, T): True where a key may be attended to. None: SDPA's fastest path.
            attn_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        return embeddings(input_ids, token_type_ids, position_ids), attn_mask, None
    if attention_mask is not None:
        raise ValueError("give attention_mask (padded mode) or unpadding (padding-free mode), not both")
    attn_mask = unpadding.key_mask
    if document_ids is not None:
        attn_mask = document_mask(unpadding.pad(document_ids), unpadding.key_mask[:, 0, 0])
        unpadding = unpadding.within_documents(document_ids)
    if position_ids is not None:
        position_ids = unpadding.pad(position_ids)
    # The embeddings (lookups and a LayerNorm, no GEMM) run on the padded grid: their gradients are sums over its
    # rows, in the order every finetuning result so far was trained with.
    return (unpadding.unpad(embeddings(unpadding.pad(input_ids), unpadding.pad(token_type_ids), position_ids)),
            attn_mask, unpadding)


class BertModel(nn.Module):
    """The encoder: ``(sequence output (B, T, H), pooled [CLS] (B, H))``, or padding-free ``((N, H), (B, H))``."""

    def __init__(self, cfg: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if add_pooling_layer else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, unpadding: Unpadding | None = None, *,
                position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Padded: ``input_ids`` (B, T) with ``attention_mask`` (B, T) or None for no padding.
        Padding-free: ``input_ids`` (N,), every row's real tokens back to back, with their ``unpadding`` (no mask).
        ``position_ids`` (default 0, 1, … along the row) and ``document_ids`` (default: one document per row; a
        token attends to its own document only) are shaped like ``input_ids``."""
        x, attn_mask, unpadding = embed(self.embeddings, input_ids, token_type_ids, attention_mask, unpadding,
                                      position_ids=position_ids, document_ids=document_ids)
        hidden = self.encoder(x, attn_mask, unpadding)
        return hidden, (self.pooler(hidden, unpadding) if self.pooler is not None else None)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)  # weight tied to word embeddings
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x)) + self.bias


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """Encoder + MLM head (tied decoder) + NSP head on the pooled [CLS]."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        self.cls = BertPreTrainingHeads(cfg)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, masked_positions: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                unpadding: Unpadding | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """MLM logits and NSP logits.

        Args:
            masked_positions: flat indices into the (B*T) tokens, or with ``unpadding`` into the unpadded (N) tokens
                (``Unpadding.positions``); the MLM head then runs on those rows only and returns (M, V). Without
                it, logits for every position are returned as (B, T, V), or (N, V) with ``unpadding``.
            position_ids, document_ids: packed documents kept apart (``BertModel.forward``).
            unpadding: padding-free mode (``BertModel.forward``): every input shaped (N,), no ``attention_mask``.
        """
        hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask, unpadding, position_ids=position_ids,
                                   document_ids=document_ids)
        if masked_positions is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions)
        return self.cls.predictions(hidden), self.cls.seq_relationship(pooled)


def count_parameters(cfg: BertConfig) -> int:
    """Trainable parameters of ``BertForPreTraining(cfg)`` (the tied decoder once), built on the meta device: shapes
    only, no memory."""
    with torch.device("meta"):
        model = BertForPreTraining(cfg)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def flops_per_token(cfg: BertConfig, seq_len: int, masked_fraction: float = 0.15) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), for MFU estimates."""
    h, layers, ffn = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    per_layer = 2 * (4 * h * h + 2 * h * ffn) + 2 * 2 * seq_len * h  # projections + FFN + attention scores/values
    head = 2 * (h * h + h * cfg.vocab_size) * masked_fraction
    return 3.0 * (layers * per_layer + head)


__all__ = ["BertConfig", "BertForPreTraining", "BertModel", "PRESETS", "Unpadding", "document_mask", "embed",
           "flops_per_token", "preset"]
