"""DeBERTa-v3's pretraining pair: a masked-LM generator and a replaced-token-detection discriminator whose word
embeddings are the generator's through gradient-disentangled embedding sharing (GDES, He et al., 2021, section 3).

The discriminator looks tokens up in ``stop_gradient(E_G) + E_Delta``: E_G, the generator's table, is trained by the
generator's MLM loss only; E_Delta, initialised to zero, by the discriminator's loss only. After training the
discriminator's table is E_G + E_Delta, which its export holds (``models.deberta_v2.hf``). Only the word embeddings
are shared: DeBERTa-v3 has no absolute positions nor token types, and each network keeps its own embedding
LayerNorm and relative embeddings.

The generator is the discriminator's width at a fraction of its depth (half, the paper's, for every preset).
The loss that joins them is ``pretrain.families.deberta_loss``. Nothing here imports DeepSpeed or torch.distributed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from models.deberta_v2.model import (
    DebertaV2Config,
    DebertaV2ForMaskedLM,
    DebertaV2ForReplacedTokenDetection,
    relative_index,
)

# Fields the two networks must share: GDES adds one table to the other.
_SHARED_FIELDS = ("vocab_size", "hidden_size", "pad_token_id", "max_position_embeddings")


def generator_config(discriminator: DebertaV2Config, depth_fraction: float) -> DebertaV2Config:
    """The paper's generator: the discriminator's width, ``depth_fraction`` of its layers (at least one)."""
    if not 0.0 < depth_fraction <= 1.0:
        raise ValueError(f"generator depth fraction {depth_fraction} is outside (0, 1]; DeBERTa-v3's generator is "
                         "half the discriminator's depth")
    return replace(discriminator, num_hidden_layers=max(1, round(discriminator.num_hidden_layers * depth_fraction)))


@dataclass(frozen=True)
class DebertaPairConfig:
    discriminator: DebertaV2Config
    generator: DebertaV2Config

    def __post_init__(self):
        differ = [name for name in _SHARED_FIELDS
                  if getattr(self.generator, name) != getattr(self.discriminator, name)]
        if differ:
            raise ValueError(f"generator and discriminator differ in {', '.join(differ)}, which embedding sharing "
                             "fixes; give both the same values (generator_config derives them)")


_V3 = DebertaV2Config()  # base: 12 x 768, 12 heads, FFN 3072, 256 buckets, vocabulary 128,100 (128k SentencePiece)

# Table-driven sizes (the discriminator; the generator is half its depth). Small and base are the paper's.
PRESETS: dict[str, DebertaV2Config] = {
    "deberta_v3_tiny": replace(_V3, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                               position_buckets=32, max_relative_positions=128),
    "deberta_v3_small": replace(_V3, num_hidden_layers=6),
    "deberta_v3_base": _V3,
}
GENERATOR_DEPTH = 0.5


def preset(name: str, **overrides) -> DebertaPairConfig:
    """A named pair ("deberta_v3_tiny", "deberta_v3_small", "deberta_v3_base"); ``overrides`` (e.g. the
    tokenizer's vocab_size) apply to the discriminator and so to the generator derived from it."""
    if name not in PRESETS:
        raise ValueError(f"unknown DeBERTa-v3 preset {name!r}; choose one of {sorted(PRESETS)}")
    discriminator = replace(PRESETS[name], **overrides)
    return DebertaPairConfig(discriminator, generator_config(discriminator, GENERATOR_DEPTH))


class DebertaPair(nn.Module):
    """The generator (``DebertaV2ForMaskedLM``) and the discriminator reading its word embeddings through GDES."""

    def __init__(self, cfg: DebertaPairConfig):
        super().__init__()
        self.config = cfg
        self.generator = DebertaV2ForMaskedLM(cfg.generator)
        self.discriminator = DebertaV2ForReplacedTokenDetection(
            cfg.discriminator, shared_words=self.generator.deberta.embeddings.word_embeddings)


def encoder_forward_flops(cfg: DebertaV2Config, seq_len: int) -> float:
    """Forward FLOPs per token of the encoder layers at padded width ``seq_len``: projections and FFN, content-to-
    content scores and the weighted values (2 x 2 T H), and each of c2p and p2c: a token's query (key) against the
    R relative rows a row of width T reaches (2 R H; R = 2T - 1 up to half the buckets, then log-bucketed). The
    relative table's projections (2 x 2R H^2 per layer per micro-batch, whatever its size) are not counted:
    under 3% of a layer at a micro-batch of 32 rows of 128."""
    h, ffn = cfg.hidden_size, cfg.intermediate_size
    rows = relative_index(seq_len, cfg, "cpu")[2]
    per_layer = 2 * (4 * h * h + 2 * h * ffn) + 2 * 2 * seq_len * h + len(cfg.pos_att_type) * 2 * rows * h
    return cfg.num_hidden_layers * per_layer


def flops_per_token(cfg: DebertaPairConfig, seq_len: int, masked_fraction: float = 0.15) -> float:
    """Training FLOPs per token of the pair (forward + backward = 3x forward for each network), for MFU: both
    encoders on every token, the generator's MLM head (dense, tied output layer) on the masked fraction, the
    discriminator's head (dense, one logit) on every token. Sampling and the losses are not counted."""
    gen, disc = cfg.generator, cfg.discriminator
    gen_head = 2 * (gen.hidden_size ** 2 + gen.hidden_size * gen.vocab_size) * masked_fraction
    disc_head = 2 * (disc.hidden_size ** 2 + disc.hidden_size)
    return 3.0 * (encoder_forward_flops(gen, seq_len) + gen_head + encoder_forward_flops(disc, seq_len) + disc_head)


__all__ = ["DebertaPair", "DebertaPairConfig", "GENERATOR_DEPTH", "PRESETS", "encoder_forward_flops",
           "flops_per_token", "generator_config", "preset"]
