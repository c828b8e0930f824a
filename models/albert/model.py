"""ALBERT for pretraining, with parameter names identical to Hugging Face's ``AlbertForPreTraining``.

ALBERT is BERT with two parameter reductions and a different sentence objective:
- factorized embeddings: tokens are embedded at ``embedding_size`` (E, 128 in every released size) and projected
  to ``hidden_size`` (H) once (``embedding_hidden_mapping_in``); the MLM head maps back H -> E and decodes with
  the (tied) word embeddings, so the vocabulary costs V*E parameters instead of V*H;
- cross-layer sharing: ``num_hidden_groups`` groups of ``inner_group_num`` layers each hold all the encoder's
  weights; the ``num_hidden_layers`` applications walk through the groups in order (one group, the default,
  is applied every time). Shared weights still cost their FLOPs at every application (``flops_per_token``);
- sentence-order prediction on the pooled [CLS] (``sop_classifier``), in place of next-sentence prediction.

The attention is our BERT's (``models.bert.model.BertSelfAttention``: SDPA, the padding-free mode of
``models.attention.Unpadding`` and its kernels, packed documents kept apart by ``document_ids``/``position_ids``),
and so are the embeddings, at width E; the forward takes BERT's arguments, so ``pretrain.families.bert_loss`` trains it
unchanged. One deliberate difference from ``transformers``: the FFN output gets its dropout before the residual,
as in google-research/albert's ``attention_ffn_block`` (Hugging Face defines that dropout but never applies it).
ALBERT v2 trains with dropout 0, where the two agree exactly. Nothing here imports DeepSpeed or torch.distributed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.utils.checkpoint
from torch import nn

from models.attention import Unpadding
from models.bert.model import (
    _ACTIVATIONS,
    BertConfig,
    BertEmbeddings,
    BertForPreTraining,
    BertSelfAttention,
    embed,
)


@dataclass(frozen=True)
class AlbertConfig:
    """Field names and defaults as ``transformers.AlbertConfig`` (sizes of ALBERT-base v2: no dropout, gelu_new)."""

    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    classifier_dropout_prob: float = 0.1
    pad_token_id: int = 0

    def __post_init__(self):
        _bert_view(self, self.hidden_size, self.num_attention_heads)  # BertConfig's checks: heads, activation
        if min(self.embedding_size, self.num_hidden_layers, self.num_hidden_groups, self.inner_group_num) < 1:
            raise ValueError("embedding_size, num_hidden_layers, num_hidden_groups and inner_group_num must each be "
                             "at least 1")
        # Equal shares keep the layer -> group map exact (transformers computes it in floating point).
        if self.num_hidden_layers % self.num_hidden_groups:
            raise ValueError(f"num_hidden_layers {self.num_hidden_layers} is not a multiple of num_hidden_groups "
                             f"{self.num_hidden_groups}; pick a number of groups that divides the layers")

    @property
    def depth(self) -> int:
        """Transformer layers a token goes through: every application of a group runs its inner layers."""
        return self.num_hidden_layers * self.inner_group_num


def _bert_view(cfg: AlbertConfig, width: int, heads: int) -> BertConfig:
    """The BertConfig of the BERT modules ALBERT reuses, at ``width`` (E for the embeddings, H for attention)."""
    return BertConfig(vocab_size=cfg.vocab_size, hidden_size=width, num_attention_heads=heads,
                      intermediate_size=cfg.intermediate_size, hidden_act=cfg.hidden_act,
                      hidden_dropout_prob=cfg.hidden_dropout_prob,
                      attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
                      max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
                      layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.initializer_range,
                      pad_token_id=cfg.pad_token_id)


PRESETS = {  # ALBERT v2's released sizes; "albert_tiny" is for tests and smoke runs
    "albert_tiny": AlbertConfig(embedding_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=512),
    "albert_base": AlbertConfig(),
    "albert_large": AlbertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                 intermediate_size=4096),
    "albert_xlarge": AlbertConfig(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                                  intermediate_size=8192),
    "albert_xxlarge": AlbertConfig(hidden_size=4096, num_hidden_layers=12, num_attention_heads=64,
                                   intermediate_size=16384),
}


def preset(name: str, **overrides) -> AlbertConfig:
    """A named size ("albert_tiny", "albert_base", ...) with field overrides, e.g. vocab_size of the tokenizer."""
    if name not in PRESETS:
        raise ValueError(f"unknown ALBERT preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def _dropout(x: torch.Tensor, module: nn.Dropout, unpadding: Unpadding | None) -> torch.Tensor:
    return module(x) if unpadding is None else unpadding.dropout(x, module)


class AlbertAttention(BertSelfAttention):
    """BERT's self-attention with the output projection, dropout, residual and post-LN in the same module, where
    ALBERT's checkpoints name them (``attention.dense``, ``attention.LayerNorm``)."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__(_bert_view(cfg, cfg.hidden_size, cfg.num_attention_heads))
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.output_dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        out = self.dense(super().forward(x, attn_mask, unpadding))
        return self.LayerNorm(x + _dropout(out, self.output_dropout, unpadding))


class AlbertLayer(nn.Module):
    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.full_layer_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attention = AlbertAttention(cfg)
        self.ffn = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_output = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        x = self.attention(x, attn_mask, unpadding)
        out = self.ffn_output(self.act(self.ffn(x)))
        return self.full_layer_layer_norm(_dropout(out, self.dropout, unpadding) + x)  # post-LN


class AlbertLayerGroup(nn.Module):
    """``inner_group_num`` layers with their own weights, run in order each time the group is applied."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.albert_layers = nn.ModuleList(AlbertLayer(cfg) for _ in range(cfg.inner_group_num))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        for layer in self.albert_layers:
            x = layer(x, attn_mask, unpadding)
        return x


class AlbertTransformer(nn.Module):
    """The E -> H projection, then ``num_hidden_layers`` applications of the shared groups."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.config = cfg
        self.embedding_hidden_mapping_in = nn.Linear(cfg.embedding_size, cfg.hidden_size)
        self.albert_layer_groups = nn.ModuleList(AlbertLayerGroup(cfg) for _ in range(cfg.num_hidden_groups))
        self.gradient_checkpointing = False  # recompute each application's activations in backward to save memory

    def group_of(self, application: int) -> int:
        """The group applied at step ``application`` (0-based): consecutive equal shares, as transformers does."""
        return application // (self.config.num_hidden_layers // self.config.num_hidden_groups)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                unpadding: Unpadding | None = None) -> torch.Tensor:
        x = self.embedding_hidden_mapping_in(x)
        for application in range(self.config.num_hidden_layers):
            group = self.albert_layer_groups[self.group_of(application)]
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(group, x, attn_mask, unpadding, use_reentrant=False)
            else:
                x = group(x, attn_mask, unpadding)
        return x


class AlbertModel(nn.Module):
    """The encoder: ``(sequence output (B, T, H), pooled [CLS] (B, H))``, or padding-free ``((N, H), (B, H))``.

    The same two modes as ``models.bert.model.BertModel``: padded, ``input_ids`` (B, T) with ``attention_mask``
    (B, T) or None; padding-free, ``input_ids`` (N,) with their ``unpadding``. Padding-free, the E -> H projection and
    every later GEMM see only the real tokens.
    """

    def __init__(self, cfg: AlbertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(_bert_view(cfg, cfg.embedding_size, heads=1))  # heads unused there
        self.encoder = AlbertTransformer(cfg)
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size) if add_pooling_layer else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, unpadding: Unpadding | None = None, *,
                position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The modes and the ``position_ids``/``document_ids`` (packed documents kept apart) of
        ``models.bert.model.BertModel.forward``, each shaped like ``input_ids``."""
        x, attn_mask, unpadding = embed(self.embeddings, input_ids, token_type_ids, attention_mask, unpadding,
                                      position_ids=position_ids, document_ids=document_ids)
        hidden = self.encoder(x, attn_mask, unpadding)
        if self.pooler is None:
            return hidden, None
        first = hidden[:, 0] if unpadding is None else hidden.index_select(0, unpadding.cu_seqlens[:-1])
        return hidden, torch.tanh(self.pooler(first))  # the [CLS] position


class AlbertMLMHead(nn.Module):
    """H -> E (dense, activation, LayerNorm), then the decoder: the word embeddings (tied) and ``bias``."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_size)
        self.decoder = nn.Linear(cfg.embedding_size, cfg.vocab_size)
        self.decoder.bias = self.bias  # one tensor under both names, as transformers' state dict has them
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(x))))


class AlbertSOPHead(nn.Module):
    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.dropout = nn.Dropout(cfg.classifier_dropout_prob)
        self.classifier = nn.Linear(cfg.hidden_size, 2)  # 0: segments in order, 1: swapped

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(pooled))


class AlbertForPreTraining(nn.Module):
    """Encoder + MLM head (decoder tied to the word embeddings) + sentence-order head on the pooled [CLS]."""

    # BERT's initialisation (N(0, initializer_range) weights, zero biases, unit LayerNorm), which ALBERT shares.
    _init_weights = BertForPreTraining._init_weights

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.config = cfg
        self.albert = AlbertModel(cfg)
        self.predictions = AlbertMLMHead(cfg)
        self.sop_classifier = AlbertSOPHead(cfg)
        self.apply(self._init_weights)
        # Tied after the initialisation, so that the decoder's draw does not overwrite the zeroed padding row.
        self.predictions.decoder.weight = self.albert.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, masked_positions: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                unpadding: Unpadding | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """MLM logits and sentence-order logits (B, 2); the arguments of ``models.bert.model.BertForPreTraining``'s
        forward, so that ``pretrain.families.bert_loss.PretrainingLoss`` trains either model.

        Args:
            masked_positions: flat indices into the (B*T) tokens, or with ``unpadding`` into the unpadded (N) tokens
                (``Unpadding.positions``); the MLM head then runs on those rows only and returns (M, V). Without
                it, logits for every position are returned as (B, T, V), or (N, V) with ``unpadding``.
            position_ids, document_ids: packed documents kept apart (``AlbertModel.forward``).
            unpadding: padding-free mode: every input shaped (N,), no ``attention_mask``.
        """
        hidden, pooled = self.albert(input_ids, token_type_ids, attention_mask, unpadding, position_ids=position_ids,
                                     document_ids=document_ids)
        if masked_positions is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions)
        return self.predictions(hidden), self.sop_classifier(pooled)


def flops_per_token(cfg: AlbertConfig, seq_len: int, masked_fraction: float = 0.15) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), for MFU estimates.

    Counted as ``models.bert.model.flops_per_token`` counts BERT's, with ALBERT's differences: every layer
    application costs its FLOPs although the weights are shared (``depth`` = layers x inner_group_num), every
    token pays the E -> H projection, and the masked positions' head is H -> E -> V.
    """
    h, e, ffn = cfg.hidden_size, cfg.embedding_size, cfg.intermediate_size
    per_layer = 2 * (4 * h * h + 2 * h * ffn) + 2 * 2 * seq_len * h  # projections + FFN + attention scores/values
    projection = 2 * e * h
    head = 2 * (h * e + e * cfg.vocab_size) * masked_fraction
    return 3.0 * (cfg.depth * per_layer + projection + head)


__all__ = ["PRESETS", "AlbertConfig", "AlbertForPreTraining", "AlbertModel", "flops_per_token", "preset"]
