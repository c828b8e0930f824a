"""ELECTRA (Clark et al., 2020): a small masked-LM generator and a discriminator that finds its replacements.

Parameter names are those of ``transformers``: the discriminator's of ``ElectraForPreTraining``, the generator's of
``ElectraForMaskedLM``, so each exports name for name. Both encoders are the post-LN encoder of ``models.bert.model``;
they read one shared embedding module (word, position and token-type tables and their LayerNorm, the paper's
``tie_embeddings``), each projecting from the embedding size to its own width (``embeddings_project``) when the
two differ. The generator's output layer is tied to the word embeddings as well, as in the paper's code.

The generator is the discriminator's depth and embedding size at a fraction of its width (hidden size, heads and
FFN: 1/4 for small, 1/3 for base, the paper's Table 7). The loss that joins them is ``pretrain.families.electra_loss``;
``models.electra.hf`` exports and loads Hugging Face directories. Nothing here imports DeepSpeed or
torch.distributed.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from models.bert.model import _ACTIVATIONS, BertConfig, BertEmbeddings, BertEncoder, Unpadding, embed
from models.bert.model import flops_per_token as bert_flops_per_token


@dataclass(frozen=True)
class ElectraConfig:
    """One ELECTRA encoder: ``transformers.ElectraConfig``'s fields (those our encoder uses), same meanings."""

    vocab_size: int = 30522
    embedding_size: int = 768
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
        if self.embedding_size < 1:
            raise ValueError(f"embedding_size is {self.embedding_size}; it must be at least 1")
        self.encoder_config()  # BertConfig's checks: heads divide the width, a known activation

    def encoder_config(self) -> BertConfig:
        """The encoder layers' config (every field but the embedding size)."""
        return BertConfig(**{f.name: getattr(self, f.name) for f in fields(BertConfig)})

    def embeddings_config(self) -> BertConfig:
        """``BertEmbeddings`` at the embedding size (it sizes its tables by ``hidden_size``; it has no heads)."""
        return replace(self.encoder_config(), hidden_size=self.embedding_size, num_attention_heads=1)


# The fields a generator must share with its discriminator: the embedding module is one module.
_SHARED_FIELDS = ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
                  "pad_token_id", "hidden_dropout_prob")


def generator_config(discriminator: ElectraConfig, fraction: float) -> ElectraConfig:
    """The paper's generator for ``discriminator``: same depth and embeddings, hidden size, heads and FFN width
    times ``fraction`` (at least 1 head), e.g. small 256/4/1024 at 1/4 -> 64/1/256, base 768/12/3072 at 1/3 ->
    256/4/1024 (the paper's code keeps 64-wide heads, which gives the same heads for both)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"generator fraction {fraction} is outside (0, 1]; the generator is at most as wide as the "
                         "discriminator (the paper uses 1/4 to 1/2)")
    scaled = lambda n: max(1, round(n * fraction))  # noqa: E731
    return replace(discriminator, hidden_size=scaled(discriminator.hidden_size),
                   num_attention_heads=scaled(discriminator.num_attention_heads),
                   intermediate_size=scaled(discriminator.intermediate_size))


@dataclass(frozen=True)
class ElectraPairConfig:
    """The generator's and the discriminator's configs; they agree on everything the shared embeddings use."""

    discriminator: ElectraConfig
    generator: ElectraConfig

    def __post_init__(self):
        differ = [name for name in _SHARED_FIELDS
                  if getattr(self.generator, name) != getattr(self.discriminator, name)]
        if differ:
            raise ValueError(f"generator and discriminator differ in {', '.join(differ)}, which their shared "
                             "embeddings fix; give both the same values (generator_config derives them)")

    @classmethod
    def from_discriminator(cls, discriminator: ElectraConfig, generator_fraction: float) -> ElectraPairConfig:
        return cls(discriminator=discriminator, generator=generator_config(discriminator, generator_fraction))


# Table-driven sizes: (discriminator, generator width fraction). Small and base are the paper's (Table 6/7).
PRESETS: dict[str, tuple[ElectraConfig, float]] = {
    "electra_tiny": (ElectraConfig(embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128), 0.25),
    "electra_small": (ElectraConfig(embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                                    intermediate_size=1024), 0.25),
    "electra_base": (ElectraConfig(), 1 / 3),
}


def preset(name: str, *, generator_fraction: float | None = None, **overrides) -> ElectraPairConfig:
    """A named pair ("electra_tiny", "electra_small", "electra_base"); ``overrides`` (e.g. the tokenizer's
    vocab_size) apply to the discriminator and so to the generator derived from it."""
    if name not in PRESETS:
        raise ValueError(f"unknown ELECTRA preset {name!r}; choose one of {sorted(PRESETS)}")
    discriminator, fraction = PRESETS[name]
    return ElectraPairConfig.from_discriminator(replace(discriminator, **overrides),
                                                fraction if generator_fraction is None else generator_fraction)


def _init_weights(root: nn.Module, std: float, keep: nn.Module | None = None) -> None:
    """BERT's initialisation (N(0, std) weights, zero biases, unit LayerNorm, zero padding row) of every module of
    ``root`` but those of ``keep``: embeddings handed in from the other half of the pair are already initialised."""
    kept = set(keep.modules()) if keep is not None else set()
    for module in root.modules():
        if module in kept:
            continue
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


class ElectraModel(nn.Module):
    """Embeddings (``embeddings``, shared when given), ``embeddings_project`` when the embedding size is not the
    hidden size, and the encoder. Returns ``(hidden, None)``: the contract of ``BertModel(add_pooling_layer=False)``
    (ELECTRA has no pooler), padded ``(B, T, H)`` or unpadded ``(N, H)``, so finetuning's heads take either."""

    def __init__(self, cfg: ElectraConfig, embeddings: BertEmbeddings | None = None):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg.embeddings_config()) if embeddings is None else embeddings
        if self.embeddings.word_embeddings.embedding_dim != cfg.embedding_size:
            raise ValueError(f"the shared embeddings are {self.embeddings.word_embeddings.embedding_dim} wide but "
                             f"this encoder's embedding_size is {cfg.embedding_size}; give both the same size")
        project = cfg.embedding_size != cfg.hidden_size
        self.embeddings_project = nn.Linear(cfg.embedding_size, cfg.hidden_size) if project else None
        self.encoder = BertEncoder(cfg.encoder_config())

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, unpadding: Unpadding | None = None, *,
                position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """Padded: ``input_ids`` (B, T) with ``attention_mask`` (B, T) or None. Padding-free: ``input_ids`` (N,), the
        real tokens back to back, with their ``unpadding``. ``position_ids`` and ``document_ids`` (shaped like
        ``input_ids``) keep packed documents apart, as in ``models.bert.model.BertModel``."""
        x, attn_mask, unpadding = embed(self.embeddings, input_ids, token_type_ids, attention_mask, unpadding,
                                      position_ids=position_ids, document_ids=document_ids)  # (B, T, E) or (N, E)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)  # (..., H)
        return self.encoder(x, attn_mask, unpadding), None


class ElectraDiscriminatorPredictions(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.dense_prediction = nn.Linear(cfg.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)


class ElectraDiscriminator(nn.Module):
    """``ElectraForPreTraining``: one logit per token, > 0 for "replaced"."""

    def __init__(self, cfg: ElectraConfig, embeddings: BertEmbeddings | None = None):
        super().__init__()
        self.config = cfg
        self.electra = ElectraModel(cfg, embeddings)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(cfg)
        _init_weights(self, cfg.initializer_range, keep=embeddings)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden, _ = self.electra(input_ids, token_type_ids, attention_mask, position_ids=position_ids,
                                 document_ids=document_ids)
        return self.discriminator_predictions(hidden)  # (B, T)


class ElectraGeneratorPredictions(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_size)
        self.LayerNorm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # Exact GELU whatever hidden_act is: transformers' ElectraGeneratorPredictions fixes it so.
        return self.LayerNorm(F.gelu(self.dense(hidden)))


class ElectraGenerator(nn.Module):
    """``ElectraForMaskedLM``: the output layer's weight is the word embedding table (its bias is its own)."""

    def __init__(self, cfg: ElectraConfig, embeddings: BertEmbeddings | None = None):
        super().__init__()
        self.config = cfg
        self.electra = ElectraModel(cfg, embeddings)
        self.generator_predictions = ElectraGeneratorPredictions(cfg)
        self.generator_lm_head = nn.Linear(cfg.embedding_size, cfg.vocab_size)
        _init_weights(self, cfg.initializer_range, keep=embeddings)
        self.generator_lm_head.weight = self.electra.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None, *, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V); with ``masked_positions`` (flat indices into the B*T tokens) only those rows, (N, V)."""
        hidden, _ = self.electra(input_ids, token_type_ids, attention_mask, position_ids=position_ids,
                                 document_ids=document_ids)
        if masked_positions is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions)
        return self.generator_lm_head(self.generator_predictions(hidden))


class ElectraPair(nn.Module):
    """The generator and the discriminator, the discriminator reading the generator's embedding module."""

    def __init__(self, cfg: ElectraPairConfig):
        super().__init__()
        self.config = cfg
        self.generator = ElectraGenerator(cfg.generator)
        self.discriminator = ElectraDiscriminator(cfg.discriminator, embeddings=self.generator.electra.embeddings)

    @property
    def embeddings(self) -> BertEmbeddings:
        return self.generator.electra.embeddings


def _encoder_forward_flops(cfg: ElectraConfig, seq_len: int) -> float:
    """Forward FLOPs per token of the encoder layers and the embedding projection (lookups are not counted)."""
    project = 2 * cfg.embedding_size * cfg.hidden_size if cfg.embedding_size != cfg.hidden_size else 0
    return bert_flops_per_token(cfg.encoder_config(), seq_len, masked_fraction=0.0) / 3.0 + project


def flops_per_token(cfg: ElectraPairConfig, seq_len: int, masked_fraction: float = 0.15) -> float:
    """Training FLOPs per token of the pair (forward + backward = 3x forward for each network), for MFU.

    Generator: encoder on every token, MLM head (dense to the embedding size, tied output layer) on the masked
    fraction. Discriminator: encoder and its two-layer head on every token. Sampling and the losses are not
    counted, as the softmax is not in BERT's figure; the discriminator's FLOPs are what its tokens/s buy.
    """
    gen, disc = cfg.generator, cfg.discriminator
    gen_head = 2 * (gen.hidden_size * gen.embedding_size + gen.embedding_size * gen.vocab_size) * masked_fraction
    disc_head = 2 * (disc.hidden_size * disc.hidden_size + disc.hidden_size)
    return 3.0 * (_encoder_forward_flops(gen, seq_len) + gen_head + _encoder_forward_flops(disc, seq_len) + disc_head)


__all__ = ["ElectraConfig", "ElectraDiscriminator", "ElectraGenerator", "ElectraModel", "ElectraPair",
           "ElectraPairConfig", "PRESETS", "flops_per_token", "generator_config", "preset"]
