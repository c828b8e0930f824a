"""ELECTRA's replaced-token-detection loss around an ``ElectraPair``.

The generator is trained as a masked LM on the masked positions; a token is sampled from its distribution at each
of them (no gradient flows through the sampling); the discriminator reads the input with the samples in place and
labels every real token original (0) or replaced (1). A sample equal to the original token counts as original, as
in the paper. loss = generator MLM + ``discriminator_weight`` x discriminator binary cross-entropy (50, the paper's).

Sampling takes an explicit seed per call: the same seed and weights give the same replacements, so a run
resumes bitwise if the caller derives the seed from the step (e.g. a stable hash of run seed, step, rank and
micro-batch). Like ``pretrain.families.bert_loss`` it returns, besides the loss, the sums that logging needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.electra.model import ElectraPair

DISCRIMINATOR_WEIGHT = 50.0

# Order of the entries of the statistics vector returned with the loss. mlm_* are the generator's; disc_tokens are
# the real tokens the discriminator labelled; replaced_tokens those labelled replaced (a sample that differs from
# the original), replaced_correct those of them it found. sequences, tokens and nonfinite_losses mean what they mean
# in pretrain.families.bert_loss.STAT_NAMES.
STAT_NAMES = ("mlm_loss_sum", "mlm_correct", "mlm_tokens", "disc_loss_sum", "disc_correct", "disc_tokens",
              "replaced_tokens", "replaced_correct", "sequences", "tokens", "nonfinite_losses")


def sample_replacements(logits: torch.Tensor, seed: int | torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits`` (N, V), drawn from softmax(logits) by inverse CDF with N uniforms from a
    ``torch.Generator`` on the logits' device seeded with ``seed``. Deterministic per device; no gradient.

    A tensor ``seed`` is read with ``int()`` (a device sync on GPU): pass a Python int where that matters.
    """
    with torch.no_grad():
        cdf = torch.softmax(logits.detach().float(), dim=-1).cumsum(-1)  # (N, V)
        generator = torch.Generator(device=logits.device).manual_seed(int(seed))
        draws = torch.rand(logits.shape[0], 1, generator=generator, device=logits.device) * cdf[:, -1:]
        # The first token whose cumulative probability exceeds the draw; clamped against rounding at the top.
        return torch.searchsorted(cdf, draws, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)


def corrupt(input_ids: torch.Tensor, masked_positions: torch.Tensor, masked_labels: torch.Tensor,
            sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The discriminator's input and labels: ``input_ids`` (B, T) with ``sampled`` at the flat ``masked_positions``,
    and (B, T) bool, True where the token shown differs from the original (``masked_labels`` there)."""
    corrupted = input_ids.reshape(-1).index_copy(0, masked_positions, sampled).view_as(input_ids)
    replaced = torch.zeros(input_ids.numel(), dtype=torch.bool, device=input_ids.device)
    replaced = replaced.index_copy(0, masked_positions, sampled != masked_labels).view_as(input_ids)
    return corrupted, replaced


@dataclass
class ElectraTerms:
    """The two losses before weighting (each a mean over its tokens unless scaled) and the statistics."""

    generator_loss: torch.Tensor
    discriminator_loss: torch.Tensor
    stats: torch.Tensor
    scores: torch.Tensor | None = None  # (real tokens, 2) float64: P(replaced), label; evaluation only



class ElectraLoss(nn.Module):
    def __init__(self, model: ElectraPair, discriminator_weight: float = DISCRIMINATOR_WEIGHT):
        super().__init__()
        if discriminator_weight < 0:
            raise ValueError(f"discriminator_weight is {discriminator_weight}; it must be >= 0 (the paper's is 50)")
        self.model = model
        self.discriminator_weight = float(discriminator_weight)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                masked_positions: torch.Tensor, masked_labels: torch.Tensor, *, sample_seed: int | torch.Tensor,
                mlm_loss_scale: torch.Tensor | float | None = None,
                disc_loss_scale: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(generator loss + weight x discriminator loss, detached statistics in the order of ``STAT_NAMES``).

        Args:
            input_ids, token_type_ids, attention_mask: (B, T), right-padded, masked input as the loader gives it.
            masked_positions, masked_labels: (N,) flat indices into the B*T tokens and their original ids.
            sample_seed: seeds the generator's samples (see ``sample_replacements``).
            mlm_loss_scale: multiplies the summed generator token losses (``pretrain.data``'s share of the global
                batch's mean); None: this micro-batch's mean over masked tokens.
            disc_loss_scale: the same for the discriminator's summed losses over real tokens; None: their mean.
        """
        terms = self.terms(input_ids, token_type_ids, attention_mask, masked_positions, masked_labels,
                           sample_seed=sample_seed, mlm_loss_scale=mlm_loss_scale, disc_loss_scale=disc_loss_scale)
        return terms.generator_loss + self.discriminator_weight * terms.discriminator_loss, terms.stats

    def terms(self, input_ids, token_type_ids, attention_mask, masked_positions, masked_labels, *, sample_seed,
              mlm_loss_scale=None, disc_loss_scale=None, position_ids=None, document_ids=None,
              return_scores=False) -> ElectraTerms:
        """The losses apart (``forward``'s arguments; ``position_ids`` and ``document_ids``: packed documents kept
        apart in both networks, see ``models.bert.model.BertModel``): what tests and diagnostics look at.
        ``return_scores``: keep every real token's P(replaced) and label (row by row), for the evaluation's AUC."""
        documents = {"position_ids": position_ids, "document_ids": document_ids}
        gen_logits = self.model.generator(input_ids, token_type_ids, attention_mask, masked_positions,
                                          **documents)  # (N, V)
        mlm_losses = F.cross_entropy(gen_logits.float(), masked_labels, reduction="none")
        sampled = sample_replacements(gen_logits, sample_seed)
        corrupted, replaced = corrupt(input_ids, masked_positions, masked_labels, sampled)
        disc_logits = self.model.discriminator(corrupted, token_type_ids, attention_mask, **documents).float()  # (B, T)
        real = attention_mask.bool()
        disc_losses = F.binary_cross_entropy_with_logits(disc_logits, replaced.float(), reduction="none") * real
        if mlm_loss_scale is None:
            mlm_loss_scale = 1.0 / max(1, masked_labels.numel())
        if disc_loss_scale is None:
            disc_loss_scale = 1.0 / real.sum().clamp(min=1)
        generator_loss = mlm_losses.sum() * mlm_loss_scale
        discriminator_loss = disc_losses.sum() * disc_loss_scale
        with torch.no_grad():
            total = generator_loss + self.discriminator_weight * discriminator_loss
            found = (disc_logits > 0) == replaced
            stats = torch.stack([
                mlm_losses.sum(), (gen_logits.argmax(-1) == masked_labels).sum().float(),
                torch.full((), float(masked_labels.numel()), device=input_ids.device),
                disc_losses.sum(), (found & real).sum().float(), real.sum().float(),
                (replaced & real).sum().float(), (found & replaced & real).sum().float(),
                torch.full((), float(input_ids.shape[0]), device=input_ids.device), real.sum().float(),
                (~torch.isfinite(total)).float(),
            ]).float()
            scores = None
            if return_scores:
                scores = torch.stack([torch.sigmoid(disc_logits[real]).double(), replaced[real].double()], dim=1)
        return ElectraTerms(generator_loss, discriminator_loss, stats, scores)


def summary(stats: torch.Tensor, discriminator_weight: float = DISCRIMINATOR_WEIGHT) -> dict[str, float]:
    """Ratios of a statistics vector (``STAT_NAMES``) summed over steps and ranks: the token-mean losses, the loss
    they make, accuracies, the fraction of tokens replaced, and the discriminator's recall of replaced tokens."""
    s = dict(zip(STAT_NAMES, stats.tolist()))
    per = lambda name, count: s[name] / max(1.0, s[count])  # noqa: E731
    mlm_loss, disc_loss = per("mlm_loss_sum", "mlm_tokens"), per("disc_loss_sum", "disc_tokens")
    return {"loss": mlm_loss + discriminator_weight * disc_loss, "mlm_loss": mlm_loss,
            "mlm_accuracy": per("mlm_correct", "mlm_tokens"), "disc_loss": disc_loss,
            "disc_accuracy": per("disc_correct", "disc_tokens"),
            "replaced_fraction": per("replaced_tokens", "disc_tokens"),
            "masked_replaced_fraction": per("replaced_tokens", "mlm_tokens"),
            "replaced_recall": per("replaced_correct", "replaced_tokens")}


def roc_auc(scores) -> float:
    """The area under the ROC curve of (score, label) rows: the Mann-Whitney rank statistic, ties given their mean
    rank, so it needs no thresholds and equals sklearn's ``roc_auc_score``; NaN without both labels."""
    import numpy as np

    scores = np.asarray(scores, dtype=np.float64).reshape(-1, 2)
    values, labels = scores[:, 0], scores[:, 1] > 0.5
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        return float("nan")
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    ranks = np.empty(len(values), dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # 1-based mean rank of each tie group
    return float((ranks[labels].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


__all__ = ["DISCRIMINATOR_WEIGHT", "ElectraLoss", "ElectraTerms", "STAT_NAMES", "corrupt", "sample_replacements",
           "roc_auc", "summary"]
