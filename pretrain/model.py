"""BERT for pretraining, with parameter names identical to Hugging Face's ``BertForPreTraining``.

Post-LN encoder; attention through ``F.scaled_dot_product_attention`` (flash/memory-efficient kernels on
GPU); the MLM head runs only on the masked positions when they are given; the decoder is tied to the word
embeddings. Nothing here imports DeepSpeed or torch.distributed: parallelism is applied from outside.

The encoder runs in two modes with the same modules and weights: padded, ``(B, T)`` tokens and an attention
mask, or packed, the real tokens of every row back to back as ``(N,)`` with a ``Packing`` that says where
each row's tokens are. In packed mode every GEMM sees only the real tokens; the embeddings (lookups and a
LayerNorm) and attention, which mixes positions, run on the padded grid (``Packing.unpack``). A padding-free
attention kernel taking ``cu_seqlens`` (flash-attn's varlen functions, nested tensors' offsets) would replace
that one step of ``BertSelfAttention``.

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


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a right-padded ``(batch, length)`` batch lie once packed back to back as ``(N, ...)``.

    Built once per batch (``from_attention_mask``, or ``from_lengths`` for data that was never padded) and passed
    to every module of the packed forward. ``cu_seqlens`` and ``max_seqlen`` are the row boundaries that
    padding-free attention kernels take; ``index`` and ``key_mask`` place the rows on the padded grid, where the
    embeddings and attention run today and where dropout draws its masks.
    """

    index: torch.Tensor       # (N,) flat positions of the real tokens in the batch*length grid, row by row
    cu_seqlens: torch.Tensor  # (batch+1,) int32: row b is packed rows cu_seqlens[b]:cu_seqlens[b+1]
    max_seqlen: int
    batch: int
    length: int               # the padded grid's width (>= max_seqlen)
    key_mask: torch.Tensor    # (batch, 1, 1, length) bool, True at real tokens: the padded attention's mask

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, length: int | None = None) -> Packing:
        """Rows of ``lengths`` real tokens each, padded on the right to ``length`` (default: the longest)."""
        shortest, max_seqlen = int(lengths.min()), int(lengths.max())
        length = max_seqlen if length is None else length
        if shortest < 1 or max_seqlen > length:
            raise ValueError(f"row lengths run from {shortest} to {max_seqlen}; each must be between 1 and the "
                             f"padded length {length}")
        real = torch.arange(length, device=lengths.device) < lengths[:, None]  # (B, T)
        return cls(index=real.reshape(-1).nonzero().squeeze(1),
                   cu_seqlens=F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), max_seqlen=max_seqlen,
                   batch=real.shape[0], length=length, key_mask=real[:, None, None, :])

    @classmethod
    def from_attention_mask(cls, attention_mask: torch.Tensor) -> Packing:
        """The packing of a padded batch's ``(B, T)`` attention mask: 1 at real tokens, which come first."""
        real = attention_mask.bool()
        if not bool(real[:, 0].all()) or bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise ValueError("packed mode needs every row padded on the right and starting with a real token "
                             "(attention_mask rows like 1 1 1 0 0); pad on the right, or run the padded mode")
        return cls.from_lengths(real.sum(1), real.shape[1])

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...): the real tokens only."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padded positions."""
        grid = x.new_zeros(self.batch * self.length, *x.shape[1:]).index_copy(0, self.index, x)
        return grid.view(self.batch, self.length, *x.shape[1:])

    def positions(self, flat_positions: torch.Tensor) -> torch.Tensor:
        """Flat positions into the padded ``(batch*length)`` grid (e.g. masked tokens) -> their rows of the packed
        ``(N, ...)`` layout. Every position must be a real token: a padded one has no packed row."""
        rows = torch.full((self.batch * self.length,), -1, dtype=torch.long, device=self.index.device)
        packed = rows.index_copy_(0, self.index, torch.arange(len(self.index), device=self.index.device))[flat_positions]
        if bool((packed < 0).any()):
            raise ValueError("a masked position falls on padding, which packed mode drops; the batch's "
                             "masked_positions must index real tokens (pretrain.data.pad makes them so)")
        return packed

    def dropout(self, x: torch.Tensor, module: nn.Dropout) -> torch.Tensor:
        """``module`` on packed rows (N, C), with the mask it would draw for the padded (B*T, C) tensor.

        On CPU ``F.dropout`` draws ``bernoulli_(1 - p)`` over the whole tensor; drawing the same and keeping the
        real rows leaves the random stream, and so every later mask, as in the padded forward. The mask is
        float32 so that 1 / (1 - p) is not rounded to bf16 under autocast.
        """
        p = module.p
        if not module.training or p == 0.0:
            return x
        keep = torch.empty(self.batch * self.length, x.shape[-1], dtype=torch.float32, device=x.device)
        return (x * keep.bernoulli_(1 - p).index_select(0, self.index).div_(1 - p)).to(x.dtype)


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

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, packing: Packing | None = None) -> torch.Tensor:
        """x: (B, T, H), or packed (N, H): then the projections see the real tokens and attention the padded grid."""
        if packing is None:
            batch, length, hidden = x.shape
            heads = lambda t: t.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)  # noqa: E731
            q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))  # (B, nh, T, hs)
        else:
            batch, length, hidden = packing.batch, packing.length, x.shape[-1]
            q, k, v = self._packed_heads(x, packing)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        out = out.transpose(1, 2).reshape(batch, length, hidden)
        return out if packing is None else packing.pack(out)

    def _packed_heads(self, x: torch.Tensor, packing: Packing) -> torch.Tensor:
        """Query, key and value of packed rows (N, H), each (B, nh, T, hs) on the padded grid, from one GEMM.

        One GEMM for the three projections is how finetuning has always computed them: its backward sums the three
        input gradients inside the GEMM, where three GEMMs would add three sums, and that last-bit difference grows
        over training into different scores. The parameters stay three (the checkpoints' names, and the operation
        order of the padded mode that pretraining's losses come from), so their weights are joined for the GEMM.
        """
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = packing.unpack(F.linear(x, weight, bias))  # (B, T, 3H)
        return qkv.view(packing.batch, packing.length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, packing: Packing | None = None) -> torch.Tensor:
        x = self.dense(x)
        x = self.dropout(x) if packing is None else packing.dropout(x, self.dropout)
        return self.LayerNorm(x + residual)  # post-LN


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, packing: Packing | None = None) -> torch.Tensor:
        return self.output(self.self(x, attn_mask, packing), x, packing)


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

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, packing: Packing | None = None) -> torch.Tensor:
        x = self.attention(x, attn_mask, packing)
        return self.output(self.intermediate(x), x, packing)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.gradient_checkpointing = False  # recompute each layer's activations in backward to save memory

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, packing: Packing | None = None) -> torch.Tensor:
        for layer in self.layer:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, attn_mask, packing, use_reentrant=False)
            else:
                x = layer(x, attn_mask, packing)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor, packing: Packing | None = None) -> torch.Tensor:
        first = hidden[:, 0] if packing is None else hidden.index_select(0, packing.cu_seqlens[:-1])
        return torch.tanh(self.dense(first))  # the [CLS] position


def document_mask(document_ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool, True where query t may attend to key s: both real tokens of the same document. A padded
    query attends to every real token of its row (never to nothing, which SDPA would turn into NaN; its output is
    not read)."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    return ((same | ~real[:, :, None]) & real[:, None, :])[:, None]


class BertModel(nn.Module):
    """The encoder: ``(sequence output (B, T, H), pooled [CLS] (B, H))``, or in packed mode ``((N, H), (B, H))``."""

    def __init__(self, cfg: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if add_pooling_layer else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, packing: Packing | None = None, *,
                position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Padded: ``input_ids`` (B, T) with ``attention_mask`` (B, T) or None for no padding.
        Packed: ``input_ids`` (N,), every row's real tokens back to back, with their ``packing`` (no mask).
        ``position_ids`` (default 0, 1, … along the row) and ``document_ids`` (default: one document per row; a
        token attends to its own document only) are shaped like ``input_ids``."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if packing is None:
            if document_ids is not None:
                real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
                attn_mask = document_mask(document_ids, real)
            else:  # Boolean (B, 1, 1, T): True where a key may be attended to. None: SDPA's fastest path.
                attn_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
            x = self.embeddings(input_ids, token_type_ids, position_ids)
        elif attention_mask is not None:
            raise ValueError("give attention_mask (padded mode) or packing (packed mode), not both")
        else:
            attn_mask = packing.key_mask
            if document_ids is not None:
                attn_mask = document_mask(packing.unpack(document_ids), packing.key_mask[:, 0, 0])
            if position_ids is not None:
                position_ids = packing.unpack(position_ids)
            # The embeddings (lookups and a LayerNorm, no GEMM) run on the padded grid: their gradients are sums
            # over its rows, in the order every finetuning result so far was trained with.
            x = packing.pack(self.embeddings(packing.unpack(input_ids), packing.unpack(token_type_ids), position_ids))
        hidden = self.encoder(x, attn_mask, packing)
        return hidden, (self.pooler(hidden, packing) if self.pooler is not None else None)


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
                packing: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """MLM logits and NSP logits.

        Args:
            masked_positions: flat indices into the (B*T) tokens, or with ``packing`` into the packed (N) tokens
                (``Packing.positions``); the MLM head then runs on those rows only and returns (M, V). Without
                it, logits for every position are returned as (B, T, V), or (N, V) with ``packing``.
            position_ids, document_ids: packed documents kept apart (``BertModel.forward``).
            packing: packed mode (``BertModel.forward``): every input shaped (N,), no ``attention_mask``.
        """
        hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask, packing, position_ids=position_ids,
                                   document_ids=document_ids)
        if masked_positions is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions)
        return self.cls.predictions(hidden), self.cls.seq_relationship(pooled)


def flops_per_token(cfg: BertConfig, seq_len: int, masked_fraction: float = 0.15) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), for MFU estimates."""
    h, layers, ffn = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    per_layer = 2 * (4 * h * h + 2 * h * ffn) + 2 * 2 * seq_len * h  # projections + FFN + attention scores/values
    head = 2 * (h * h + h * cfg.vocab_size) * masked_fraction
    return 3.0 * (layers * per_layer + head)


__all__ = ["BertConfig", "BertForPreTraining", "BertModel", "PRESETS", "Packing", "document_mask", "flops_per_token",
           "preset"]
