"""SpanBERT's span-boundary objective head (Joshi et al. 2020, section 3.2): a training head, never exported.

Each token x_i of a masked span x_s..x_e is predicted from the encoder's outputs at the span's two boundary tokens,
the ones just outside it (x_{s-1}, x_{e+1}), and a learned embedding of its position in the span, p_{i-s+1}:

    h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]
    h1 = LayerNorm(GELU(W1 h0 + b1)),  y = LayerNorm(GELU(W2 h1 + b2))
    logits = y E^T + b        E: the word embeddings (the MLM decoder's weight); b: this head's own bias

as facebookresearch/SpanBERT's ``BertPairTargetPredictionHead`` and ``MLPWithLayerNorm`` compute it, with its sizes:
``MAX_TARGETS`` (15, its ``--max-pair-targets``) positions in the table, so a span's 16th and later tokens have no
boundary target (they are still MLM targets), each embedded in ``POSITION_SIZE`` (200) values. Which tokens are
targets, and where their boundaries are, is the loss's business (``pretrain.families.spanbert_loss``).

The head holds no reference to the word embeddings (they are passed to ``forward``), so the model's state has no
second name for them, and the export (the plain ``BertForPreTraining``) never sees this head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.bert.model import _ACTIVATIONS, BertConfig

MAX_TARGETS = 15      # positions in a span that get a boundary target (the reference's --max-pair-targets)
POSITION_SIZE = 200   # width of a position's embedding (the reference's --pair-positional-embedding-size)


class SpanBoundaryHead(nn.Module):
    """Two boundary outputs and a position in, logits over the vocabulary out."""

    def __init__(self, cfg: BertConfig, *, max_targets: int = MAX_TARGETS, position_size: int = POSITION_SIZE,
                 generator: torch.Generator | None = None):
        super().__init__()
        if max_targets < 1 or position_size < 1:
            raise ValueError(f"max_targets and position_size must be >= 1, got {max_targets} and {position_size}")
        hidden = cfg.hidden_size
        self.position_embeddings = nn.Embedding(max_targets, position_size)
        self.dense1 = nn.Linear(2 * hidden + position_size, hidden)
        self.LayerNorm1 = nn.LayerNorm(hidden, eps=cfg.layer_norm_eps)
        self.dense2 = nn.Linear(hidden, hidden)
        self.LayerNorm2 = nn.LayerNorm(hidden, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.max_targets = max_targets
        self.reset_parameters(cfg.initializer_range, generator)

    def reset_parameters(self, std: float, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation (N(0, std) weights, zero biases, unit LayerNorm), drawn from ``generator`` when
        given: the head is then the same on every rank, whatever the global RNG has drawn."""
        with torch.no_grad():
            for weight in (self.position_embeddings.weight, self.dense1.weight, self.dense2.weight):
                weight.normal_(0.0, std, generator=generator)
            for bias in (self.dense1.bias, self.dense2.bias, self.bias, self.LayerNorm1.bias, self.LayerNorm2.bias):
                bias.zero_()
            self.LayerNorm1.weight.fill_(1.0)
            self.LayerNorm2.weight.fill_(1.0)

    def forward(self, left: torch.Tensor, right: torch.Tensor, relative: torch.Tensor,
                word_embeddings: torch.Tensor) -> torch.Tensor:
        """``left``, ``right``: (M, H) the boundary tokens' outputs; ``relative``: (M,) i - s, from 0 (below
        ``max_targets``); ``word_embeddings``: (V, H). Returns the (M, V) logits."""
        h0 = torch.cat([left, right, self.position_embeddings(relative).to(left.dtype)], dim=-1)
        h1 = self.LayerNorm1(self.act(self.dense1(h0)))
        y = self.LayerNorm2(self.act(self.dense2(h1)))
        return F.linear(y, word_embeddings) + self.bias


def flops_per_target(cfg: BertConfig, position_size: int = POSITION_SIZE) -> float:
    """Training FLOPs (forward + backward = 3x forward) of one boundary target: the two layers and the decoder."""
    h = cfg.hidden_size
    return 3.0 * 2 * ((2 * h + position_size) * h + h * h + h * cfg.vocab_size)


__all__ = ["MAX_TARGETS", "POSITION_SIZE", "SpanBoundaryHead", "flops_per_target"]
