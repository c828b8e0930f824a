"""DeBERTa-v3 (He et al., 2021): the DeBERTa encoder with disentangled attention, as ``transformers``' DebertaV2.

Parameter names are ``transformers``': ``DebertaV2Model`` (``embeddings``, ``encoder.layer.N.attention.self.
{query,key,value}_proj``, ``encoder.rel_embeddings``, ``encoder.LayerNorm``), ``DebertaV2ForMaskedLM``'s head as
``lm_predictions.lm_head`` (transformers 5.x's non-legacy head, the names of Microsoft's checkpoints; its output
layer is the word embedding table), and the replaced-token-detection head of Microsoft's DeBERTa code as
``mask_predictions`` (transformers has no such model and ignores those keys when it loads the encoder).

Attention (each head of width d, token i attending to token j, r = bucket(i - j) + span the relative index):
``score = (q_i.k_j + q_i.Kr[r] + k_j.Qr[r]) / sqrt(3d)``: content-to-content, content-to-position (c2p) and
position-to-content (p2c), Kr and Qr the relative embedding table (LayerNorm'd once per forward, shared by every
layer) through the layer's own key and query projections (``share_att_key``). Relative distances beyond
``position_buckets / 2`` fall into log-spaced buckets up to ``max_relative_positions``. No absolute positions enter
the input (``position_biased_input`` false), as in every DeBERTa-v3 config.

Padded batches are the computation: in padding-free mode (``unpadding``) the rows are put back on the padded grid,
encoded, and unpadded again (no GEMM is saved), since the relative-position terms are built on the grid. Nothing
here imports DeepSpeed or torch.distributed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from models.attention import Unpadding, document_mask
from models.bert.model import _ACTIVATIONS, BertConfig, BertIntermediate, BertOutput, BertSelfOutput

_POS_ATT_TYPES = ("p2c", "c2p")


@dataclass(frozen=True)
class DebertaV2Config:
    """``transformers.DebertaV2Config``'s fields that DeBERTa-v3 uses, same names, meanings and v3 defaults."""

    vocab_size: int = 128100
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-7
    pad_token_id: int = 0
    relative_attention: bool = True
    max_relative_positions: int = -1   # < 1: max_position_embeddings
    position_buckets: int = 256
    position_biased_input: bool = False
    pos_att_type: tuple[str, ...] = _POS_ATT_TYPES
    norm_rel_ebd: str = "layer_norm"
    share_att_key: bool = True
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"

    def __post_init__(self):
        self.layer_config()  # BertConfig's checks: heads divide the width, a known activation
        unsupported = [f"{name} {getattr(self, name)!r}" for name, wanted in
                       (("relative_attention", True), ("share_att_key", True), ("norm_rel_ebd", "layer_norm"))
                       if getattr(self, name) != wanted]
        unsupported += [f"pos_att_type {kind!r}" for kind in self.pos_att_type if kind not in _POS_ATT_TYPES]
        if unsupported:
            raise ValueError(f"{', '.join(unsupported)}: only DeBERTa-v3's attention is implemented (relative "
                             "attention, share_att_key, norm_rel_ebd layer_norm, pos_att_type among p2c, c2p)")
        if self.pooler_hidden_act not in _ACTIVATIONS:
            raise ValueError(f"pooler_hidden_act {self.pooler_hidden_act!r} is not one of {sorted(_ACTIVATIONS)}")

    def pooler_activation(self):
        """The activation of the sequence head's ``ContextPooler`` (``pooler_hidden_act``)."""
        return _ACTIVATIONS[self.pooler_hidden_act]

    def layer_config(self) -> BertConfig:
        """The config of the parts a DeBERTa layer shares with BERT's (output dense + LayerNorm, FFN)."""
        return BertConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                          num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                          intermediate_size=self.intermediate_size, hidden_act=self.hidden_act,
                          hidden_dropout_prob=self.hidden_dropout_prob, layer_norm_eps=self.layer_norm_eps,
                          attention_probs_dropout_prob=self.attention_probs_dropout_prob)

    @property
    def max_relative(self) -> int:
        return self.max_relative_positions if self.max_relative_positions > 0 else self.max_position_embeddings

    @property
    def attention_span(self) -> int:
        """Half the relative embedding table's rows: the bucket count when bucketing, else the relative range."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative


def relative_buckets(distance: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa's log-bucketed relative distance (long): |d| < buckets/2 stays d; farther, sign(d) * (mid +
    ceil(log(|d|/mid) / log((max_position-1)/mid) * (mid-1))), mid = buckets/2, computed in fp32 as the reference."""
    if buckets <= 0 or max_position <= 0:
        return distance
    mid = buckets // 2
    size = distance.abs()
    near = size <= mid
    far = size.clamp(min=mid).float()  # near entries are replaced below; clamping keeps log() finite
    ratio = torch.log(far / mid) / torch.log(torch.tensor((max_position - 1) / mid, device=distance.device))
    logged = (torch.ceil(ratio * (mid - 1)) + mid).long()  # this operation order: the reference's buckets exactly
    return torch.where(near, distance, logged * torch.sign(distance))


def relative_index(length: int, cfg: DebertaV2Config, device: torch.device) -> tuple[torch.Tensor, int, int]:
    """(index (T, T) into the relative-embedding rows actually used, first used row, number of used rows): row
    ``bucket(i - j) + span`` (clamped to the table), shifted so that a row of width T reads only the rows it can
    reach (2T-1 of the 2*span when T <= span/2): c2p and p2c then cost O(T) per token, not O(span)."""
    span = cfg.attention_span
    positions = torch.arange(length, device=device)
    distance = relative_buckets(positions[:, None] - positions[None, :], cfg.position_buckets, cfg.max_relative)
    index = (distance + span).clamp(0, 2 * span - 1)
    extremes = relative_buckets(torch.tensor([1 - length, length - 1]), cfg.position_buckets, cfg.max_relative)
    first, last = ((extremes + span).clamp(0, 2 * span - 1)).tolist()
    return index - first, first, last - first + 1


class DisentangledSelfAttention(nn.Module):
    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.query_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.pos_att_type = tuple(cfg.pos_att_type)
        self.pos_dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.dropout_p = cfg.attention_probs_dropout_prob
        self.scale = 1.0 / math.sqrt(cfg.hidden_size // cfg.num_attention_heads * (1 + len(self.pos_att_type)))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, -1).transpose(-2, -3)  # (..., nh, T, d)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, rel: torch.Tensor,
                index: tuple[torch.Tensor, int, int]) -> torch.Tensor:
        """x (B, T, H); attn_mask (B, 1, 1|T, T) bool, True where a key may be attended to; rel (2 span, H) the
        normalised relative embeddings; index: ``relative_index``'s (T, T) rows, first row used, rows used."""
        batch, length, hidden = x.shape
        index, first, rows = index
        q, k, v = self._heads(self.query_proj(x)), self._heads(self.key_proj(x)), self._heads(self.value_proj(x))
        # Dropout over the whole table (the reference's random draws), then the rows a row of this width reaches.
        rel = self.pos_dropout(rel)[first:first + rows]
        bias = q.new_zeros(batch, self.num_heads, length, length)
        gather = index.expand(batch, self.num_heads, length, length)
        if "c2p" in self.pos_att_type:  # q_i . Kr[index(i, j)]
            c2p = q @ self._heads(self.key_proj(rel)).transpose(-1, -2)  # (B, nh, T, R)
            bias = bias + c2p.gather(-1, gather)
        if "p2c" in self.pos_att_type:  # k_j . Qr[index(i, j)]: row j of k, column index(i, j), transposed
            p2c = k @ self._heads(self.query_proj(rel)).transpose(-1, -2)  # (B, nh, T, R)
            bias = bias + p2c.gather(-1, gather.transpose(-1, -2)).transpose(-1, -2)
        bias = (bias * self.scale).masked_fill(~attn_mask, torch.finfo(q.dtype).min)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        return out.transpose(1, 2).reshape(batch, length, hidden)


class DebertaV2Attention(nn.Module):
    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.self = DisentangledSelfAttention(cfg)
        self.output = BertSelfOutput(cfg.layer_config())

    def forward(self, x, attn_mask, rel, index):
        return self.output(self.self(x, attn_mask, rel, index), x)


class DebertaV2Layer(nn.Module):
    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.attention = DebertaV2Attention(cfg)
        self.intermediate = BertIntermediate(cfg.layer_config())
        self.output = BertOutput(cfg.layer_config())

    def forward(self, x, attn_mask, rel, index):
        x = self.attention(x, attn_mask, rel, index)
        return self.output(self.intermediate(x), x)


class DebertaV2Encoder(nn.Module):
    """The layers, the relative embedding table (2 x span rows) and its LayerNorm (``norm_rel_ebd``)."""

    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.config = cfg
        self.layer = nn.ModuleList(DebertaV2Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.rel_embeddings = nn.Embedding(2 * cfg.attention_span, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.gradient_checkpointing = False  # recompute each layer's activations in backward to save memory

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        index = relative_index(x.shape[1], self.config, x.device)
        rel = self.LayerNorm(self.rel_embeddings.weight)  # (2 span, H), shared by every layer
        for layer in self.layer:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, attn_mask, rel, index, use_reentrant=False)
            else:
                x = layer(x, attn_mask, rel, index)
        return x


class GdesWordEmbedding(nn.Module):
    """DeBERTa-v3's gradient-disentangled embedding sharing: the lookup of ``stop_gradient(source.weight) +
    delta`` (E_G + E_Delta), ``delta`` initialised to zero. ``source`` (the generator's table) is read, not owned:
    its gradient comes from the generator's loss only."""

    def __init__(self, source: nn.Embedding):
        super().__init__()
        self._source = (source,)  # a tuple: not a submodule, so neither trained nor saved from here
        self.delta = nn.Parameter(torch.zeros_like(source.weight))
        self.padding_idx = source.padding_idx

    @property
    def source(self) -> nn.Embedding:
        return self._source[0]

    @property
    def weight(self) -> torch.Tensor:
        """E_G + E_Delta, what the discriminator's export holds."""
        return self.source.weight.detach() + self.delta

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # The generator's module is called (not its weight read) so that hooks such as ZeRO-3's gather it.
        return self.source(input_ids).detach() + F.embedding(input_ids, self.delta, self.padding_idx)


class DebertaV2Embeddings(nn.Module):
    def __init__(self, cfg: DebertaV2Config, shared_words: nn.Embedding | None = None):
        super().__init__()
        if shared_words is None:
            self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        else:
            self.word_embeddings = GdesWordEmbedding(shared_words)
        positions = cfg.position_biased_input
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size) if positions else None
        types = cfg.type_vocab_size > 0
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if types else None
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)  # (B, T, H)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(torch.arange(input_ids.shape[1], device=input_ids.device))
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x) * real[..., None].to(x.dtype))  # padding zeroed, as the reference


class DebertaV2Model(nn.Module):
    """Embeddings and encoder; returns ``(hidden, None)`` (DeBERTa's pooler belongs to the sequence head), padded
    ``(B, T, H)`` or, given ``unpadding``, ``(N, H)``: the contract of our other encoders, so finetuning's heads
    take it. ``shared_words``: the generator's word embeddings, read through GDES (``GdesWordEmbedding``)."""

    def __init__(self, cfg: DebertaV2Config, shared_words: nn.Embedding | None = None):
        super().__init__()
        self.config = cfg
        self.embeddings = DebertaV2Embeddings(cfg, shared_words)
        self.encoder = DebertaV2Encoder(cfg)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, unpadding: Unpadding | None = None, *,
                position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """Padded: ``input_ids`` (B, T) with ``attention_mask`` (B, T) or None. Padding-free: ``input_ids`` (N,)
        with their ``unpadding``, computed on the padded grid. ``document_ids`` keep packed documents apart (a
        block-diagonal mask); ``position_ids`` are not read: positions are relative, and within a document the
        distance between two tokens is the same whatever the document's offset."""
        del position_ids
        if unpadding is not None:
            if attention_mask is not None:
                raise ValueError("give attention_mask (padded mode) or unpadding (padding-free mode), not both")
            pad = lambda t: None if t is None else unpadding.pad(t)  # noqa: E731
            hidden, _ = self(pad(input_ids), pad(token_type_ids), unpadding.key_mask[:, 0, 0].long(),
                             document_ids=pad(document_ids))
            return unpadding.unpad(hidden), None
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        attn_mask = real[:, None, None, :] if document_ids is None else document_mask(document_ids, real)
        return self.encoder(self.embeddings(input_ids, token_type_ids, real), attn_mask), None


class DebertaV2LMPredictionHead(nn.Module):
    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(self.LayerNorm(self.act(self.dense(hidden))), word_embeddings, self.bias)


class DebertaV2OnlyMLMHead(nn.Module):
    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.lm_head = DebertaV2LMPredictionHead(cfg)


def init_weights(root: nn.Module, std: float) -> None:
    """N(0, std) weights, zero biases, unit LayerNorm, zero padding row (BERT's, and DeBERTa's)."""
    for module in root.modules():
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


class DebertaV2ForMaskedLM(nn.Module):
    """``DebertaV2ForMaskedLM`` (non-legacy head): the output layer is the word embedding table plus a bias."""

    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.config = cfg
        self.deberta = DebertaV2Model(cfg)
        self.lm_predictions = DebertaV2OnlyMLMHead(cfg)
        init_weights(self, cfg.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, masked_positions: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V); with ``masked_positions`` (flat indices into the B*T tokens) only those rows, (N, V).
        ``position_ids`` are not read (``DebertaV2Model.forward``)."""
        hidden, _ = self.deberta(input_ids, token_type_ids, attention_mask, document_ids=document_ids)
        if masked_positions is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions)
        return self.lm_predictions.lm_head(hidden, self.deberta.embeddings.word_embeddings.weight)


class MaskPredictionHead(nn.Module):
    """Microsoft DeBERTa's replaced-token head (``LMMaskPredictionHead``): each token's state plus the [CLS]
    state, LayerNorm, dense, activation, one logit (> 0: "replaced")."""

    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.classifier = nn.Linear(cfg.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.act(self.dense(self.LayerNorm(hidden[:, :1] + hidden)))).squeeze(-1)


class DebertaV2ForReplacedTokenDetection(nn.Module):
    """The discriminator: ``deberta`` (with GDES word embeddings when ``shared_words`` is given) and
    ``mask_predictions``; one logit per token."""

    def __init__(self, cfg: DebertaV2Config, shared_words: nn.Embedding | None = None):
        super().__init__()
        self.config = cfg
        self.deberta = DebertaV2Model(cfg, shared_words)
        self.mask_predictions = MaskPredictionHead(cfg)
        init_weights(self, cfg.initializer_range)  # the GDES delta is a bare parameter: it stays zero

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden, _ = self.deberta(input_ids, token_type_ids, attention_mask, document_ids=document_ids)
        return self.mask_predictions(hidden)  # (B, T)


__all__ = ["DebertaV2Config", "DebertaV2ForMaskedLM", "DebertaV2ForReplacedTokenDetection", "DebertaV2Model",
           "GdesWordEmbedding", "init_weights", "relative_buckets", "relative_index"]
