"""SpanBERT's loss (Joshi et al. 2020): masked-token cross-entropy plus the span-boundary objective (SBO), each summed
over the masked tokens, ``L(x_i) = L_MLM(x_i) + L_SBO(x_i)``, plus BERT's pair loss when the rows have one.

**Spans.** A span is a maximal run of consecutive masked positions in a row. This is how facebookresearch/SpanBERT
sees them: its masking records each drawn span, then ``merge_intervals`` joins those that overlap *or touch* before
it writes the boundary targets (``pair_targets``), so two drawn spans side by side are one span there too. Our span
masking (``common.masking``, mode ``span``) draws the same kind of spans and also lets them touch; the masked
positions alone therefore give the reference's spans, for static and dynamic masks alike, and the loader is
unchanged.

**Boundaries.** A span's boundaries are the tokens just outside it, x_{s-1} and x_{e+1}. The reference masks each
segment before it adds [CLS] and [SEP], and gives a span a boundary target only if both of those tokens lie inside
the segment (``span_masking``: ``start > 0 and end < len - 1``). So a span next to [CLS] or [SEP] (the row's first or
last text token, either side of a pair's middle [SEP], either side of a packed row's document break) trains MLM
only, and a boundary is never [CLS], [SEP] or padding. As there, a span's first ``MAX_TARGETS`` (15) tokens get a
boundary target each; later ones only the MLM target.

**Normalisation.** Both sums are scaled by ``mlm_loss_scale`` (one over the global batch's masked tokens), so the
loss is the per-masked-token mean of L_MLM + L_SBO over the global batch whatever the split over ranks and
accumulation steps, with no count beyond the loader's. (The reference divides its SBO sum by its own count of SBO
targets plus one, per batch: the same up to the share of masked tokens that have a boundary target, logged as
``sbo_share``.)

Everything is computed on the device from the micro-batch without a read back to the host: the spans by a sort, a
running maximum and minimum over the masked positions; a token without a boundary target still runs through the
head, with weight 0 (a few per cent of them at 512 tokens), so every shape is the batch's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.attention import unpad_batch
from models.bert.model import BertForPreTraining
from models.bert.span_boundary import MAX_TARGETS, SpanBoundaryHead
from pretrain.families.bert_loss import STAT_NAMES as BERT_STAT_NAMES
from pretrain.families.bert_loss import PretrainingLoss, assemble

# BERT's statistics, then the boundary objective's: its summed loss, top-1 hits and number of targets.
STAT_NAMES = BERT_STAT_NAMES + ("sbo_loss_sum", "sbo_correct", "sbo_tokens")


@dataclass(frozen=True)
class SpanTargets:
    """Per masked token, in ascending order of position (``order`` maps it to the loader's order)."""

    order: torch.Tensor     # (M,) index into the micro-batch's masked positions
    left: torch.Tensor      # (M,) row of x_{s-1} in the encoder's output (flattened, padded or unpadded); 0 if invalid
    right: torch.Tensor     # (M,) row of x_{e+1}
    relative: torch.Tensor  # (M,) i - s, clamped below the position table's size
    valid: torch.Tensor     # (M,) bool: the token has a boundary target


def span_targets(masked_positions: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 boundary_excluded: torch.Tensor, *, layout_positions: torch.Tensor | None = None,
                 max_targets: int = MAX_TARGETS) -> SpanTargets:
    """The boundary targets of a padded micro-batch's masked tokens (the module docstring's rules).

    Args:
        masked_positions: (M,) flat positions into the (B*T) grid of ``input_ids`` (B, T).
        attention_mask: (B, T), 1 on real tokens.
        boundary_excluded: ids that are never a boundary (the dataset's [CLS] and [SEP]; padding is excluded by
            ``attention_mask``).
        layout_positions: (M,) the same tokens' rows in the encoder's output when it is not the padded grid (the
            padding-free layout): a row's real tokens are consecutive there too, so x_{s-1} is the row before x_s.
    """
    width, cells = input_ids.shape[-1], input_ids.numel()
    order = torch.argsort(masked_positions, stable=True)
    position = masked_positions[order]
    layout = position if layout_positions is None else layout_positions[order]
    count = position.numel()
    index = torch.arange(count, device=position.device)
    column = position % width
    joins = torch.zeros(count, dtype=torch.bool, device=position.device)  # continues the previous masked token's span
    joins[1:] = (position[1:] == position[:-1] + 1) & (column[1:] != 0)
    first = torch.cummax(torch.where(joins, 0, index), dim=0).values  # index of its span's first token
    ends = torch.ones(count, dtype=torch.bool, device=position.device)
    ends[:-1] = ~joins[1:]
    last = torch.cummin(torch.where(ends, index, count).flip(0), dim=0).values.flip(0)  # of its span's last token
    start, end = position[first], position[last]
    relative = index - first
    left_cell, right_cell = (start - 1).clamp(0, cells - 1), (end + 1).clamp(0, cells - 1)
    ids, real = input_ids.reshape(-1), attention_mask.reshape(-1).bool()
    excluded = boundary_excluded.to(ids.device)

    def usable(cell: torch.Tensor) -> torch.Tensor:
        return real[cell] & ~torch.isin(ids[cell], excluded)

    valid = ((start % width != 0) & (end % width != width - 1) & usable(left_cell) & usable(right_cell)
             & (relative < max_targets))
    zero = torch.zeros_like(layout)
    return SpanTargets(order=order, left=torch.where(valid, layout[first] - 1, zero),
                       right=torch.where(valid, layout[last] + 1, zero),
                       relative=relative.clamp(max=max_targets - 1), valid=valid)


class SpanBoundaryLoss(PretrainingLoss):
    """``PretrainingLoss`` (MLM and the pair head) plus the span-boundary head ``span_boundary``, a module of this
    loss and not of the model: it is trained and checkpointed with the run, never exported.

    ``boundary_excluded``: the dataset's [CLS] and [SEP] ids. ``seed``: the head's initial weights, the same on
    every rank."""

    def __init__(self, model: BertForPreTraining, sentence_objective: str = "none", *,
                 boundary_excluded: tuple[int, ...], seed: int, padding_free: bool = False,
                 max_targets: int = MAX_TARGETS):
        super().__init__(model, sentence_objective, padding_free=padding_free)
        self.span_boundary = SpanBoundaryHead(model.config, max_targets=max_targets,
                                              generator=torch.Generator().manual_seed(seed))
        self.register_buffer("boundary_excluded", torch.tensor(sorted(boundary_excluded), dtype=torch.long),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                masked_positions: torch.Tensor, masked_labels: torch.Tensor, next_sentence_labels: torch.Tensor,
                mlm_loss_scale: torch.Tensor, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None, token_loss_scale: torch.Tensor | None = None,
                **loader_unpadding) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to back-propagate, detached statistics in the order of ``STAT_NAMES``); the arguments are
        ``PretrainingLoss.forward``'s."""
        del token_loss_scale
        bert = self.model.bert
        if self.padding_free:
            unpadding, layout = unpad_batch(attention_mask, masked_positions, loader_unpadding)
            unpadded = lambda t: None if t is None else unpadding.unpad(t)  # noqa: E731
            hidden, pooled = bert(unpadding.unpad(input_ids), unpadding.unpad(token_type_ids), None, unpadding,
                                  position_ids=unpadded(position_ids), document_ids=unpadded(document_ids))
        else:
            layout = masked_positions
            hidden, pooled = bert(input_ids, token_type_ids, attention_mask, position_ids=position_ids,
                                  document_ids=document_ids)
        hidden = hidden.reshape(-1, hidden.shape[-1])
        mlm_logits = self.model.cls.predictions(hidden.index_select(0, layout))
        targets = span_targets(masked_positions, input_ids, attention_mask, self.boundary_excluded,
                               layout_positions=layout, max_targets=self.span_boundary.max_targets)
        sbo_logits = self.span_boundary(hidden.index_select(0, targets.left), hidden.index_select(0, targets.right),
                                        targets.relative, bert.embeddings.word_embeddings.weight)
        sbo_labels = masked_labels[targets.order]
        weight = targets.valid.float()
        mlm_losses = F.cross_entropy(mlm_logits.float(), masked_labels, reduction="none")
        sbo_losses = F.cross_entropy(sbo_logits.float(), sbo_labels, reduction="none") * weight
        pair_logits = self.model.cls.seq_relationship(pooled) if self.sentence_objective != "none" else None
        with torch.no_grad():
            sbo_stats = (sbo_losses.sum(), ((sbo_logits.argmax(-1) == sbo_labels).float() * weight).sum(), weight.sum())
        return assemble(mlm_losses, mlm_logits, masked_labels, pair_logits, next_sentence_labels, attention_mask,
                        mlm_loss_scale, self.sentence_objective, token_loss_sum=sbo_losses.sum(),
                        more_stats=sbo_stats)


def summary(stats: torch.Tensor, sentence_objective: str) -> dict[str, float]:
    """BERT's logged ratios with ``loss`` the back-propagated one (MLM + SBO per masked token, plus the pair loss),
    and the boundary objective's: ``sbo_loss`` and ``sbo_accuracy`` per boundary target (comparable with
    ``mlm_loss``), ``sbo_share`` the masked tokens that have one."""
    s = dict(zip(STAT_NAMES, stats.tolist()))
    masked, targets = max(1.0, s["mlm_tokens"]), max(1.0, s["sbo_tokens"])
    mlm_loss = s["mlm_loss_sum"] / masked
    pair_loss = s["pair_loss_sum"] / max(1.0, s["pair_sequences"])
    record = {"loss": mlm_loss + s["sbo_loss_sum"] / masked + pair_loss, "mlm_loss": mlm_loss,
              "mlm_accuracy": s["mlm_correct"] / masked, "sbo_loss": s["sbo_loss_sum"] / targets,
              "sbo_accuracy": s["sbo_correct"] / targets, "sbo_share": s["sbo_tokens"] / masked}
    if sentence_objective != "none" and s["pair_sequences"] > 0:
        record[f"{sentence_objective}_loss"] = pair_loss
        record[f"{sentence_objective}_accuracy"] = s["pair_correct"] / s["pair_sequences"]
    return record


__all__ = ["STAT_NAMES", "SpanBoundaryLoss", "SpanTargets", "span_targets", "summary"]
