"""The pretraining loss around the model: masked-token cross-entropy plus, on pair rows, the sentence-pair
cross-entropy (NSP or SOP, one two-way head on the pooled [CLS]).

Kept apart from the model so that the model stays a plain ``BertForPreTraining``; DeepSpeed wraps this
module. Besides the loss it returns the sums that logging needs, so that metrics over many steps and
ranks are exact ratios of sums rather than means of means.

With ``padding_free`` the micro-batch, padded by the loader, is unpadded (``models.attention.unpad_batch``, from sizes
the loader computed on the host) before the encoder, so that every GEMM sees the real tokens only: the masked
positions are mapped into the
unpadded layout, the pair head reads each row's [CLS] (its first unpadded token), and ``document_ids``/``position_ids``
travel unpadded too (the model puts them back on the padded grid for the embeddings and the attention mask).
The losses and gradients equal the padded mode's to rounding (tests/pretrain/test_padding_free.py), not to the
bit: the unpadded GEMMs have other shapes, and the query/key/value projections are one GEMM there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import unpad_batch
from models.bert.model import BertForPreTraining

# Order of the entries of the statistics vector returned with the loss. ``pair_*`` are the sentence-pair
# head's (NSP or SOP); ``pair_sequences`` counts the sequences it trained on: 0 when the objective has none.
STAT_NAMES = ("mlm_loss_sum", "mlm_correct", "mlm_tokens", "pair_loss_sum", "pair_correct", "pair_sequences",
              "sequences", "tokens", "nonfinite_losses")


class PretrainingLoss(nn.Module):
    """``sentence_objective``: ``nsp`` or ``sop`` train the pair head on the rows' labels (the same two-way head;
    SOP's label says whether the segments were swapped); ``none`` trains no pair loss: the head and the pooler
    stay as initialised (or loaded), untouched by any gradient. ``padding_free``: run the encoder's dense layers on
    the real tokens only (the module docstring)."""

    def __init__(self, model: BertForPreTraining, sentence_objective: str = "nsp", padding_free: bool = False):
        super().__init__()
        if sentence_objective not in ("nsp", "sop", "none"):
            raise ValueError(f"sentence_objective {sentence_objective!r}: choose nsp, sop or none")
        self.model = model
        self.sentence_objective = sentence_objective
        self.padding_free = padding_free

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                masked_positions: torch.Tensor, masked_labels: torch.Tensor, next_sentence_labels: torch.Tensor,
                mlm_loss_scale: torch.Tensor, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None, token_loss_scale: torch.Tensor | None = None,
                **loader_unpadding) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to back-propagate, detached statistics in the order of ``STAT_NAMES``).

        ``mlm_loss_scale`` turns this micro-batch's summed token losses into its share of the mean over
        the whole global batch (see ``PretrainingLoader``); ``position_ids`` and ``document_ids`` keep packed
        documents apart (document attention). ``token_loss_scale`` (the loader's, for losses over every token)
        is not used: BERT's losses are on masked tokens and sequences only. ``loader_unpadding``: the padding-free
        path's sizes as the loader computed them (``models.attention.LOADER_FIELDS``).
        """
        del token_loss_scale
        if self.padding_free:
            unpadding, unpadded_positions = unpad_batch(attention_mask, masked_positions, loader_unpadding)
            unpadded = lambda t: None if t is None else unpadding.unpad(t)  # noqa: E731
            mlm_logits, pair_logits = self.model(
                unpadding.unpad(input_ids), unpadding.unpad(token_type_ids), None, unpadded_positions,
                position_ids=unpadded(position_ids), document_ids=unpadded(document_ids), unpadding=unpadding)
        else:
            mlm_logits, pair_logits = self.model(input_ids, token_type_ids, attention_mask, masked_positions,
                                                 position_ids=position_ids, document_ids=document_ids)
        mlm_losses = F.cross_entropy(mlm_logits.float(), masked_labels, reduction="none")
        return assemble(mlm_losses, mlm_logits, masked_labels, pair_logits, next_sentence_labels, attention_mask,
                        mlm_loss_scale, self.sentence_objective)


def assemble(mlm_losses: torch.Tensor, mlm_logits: torch.Tensor, masked_labels: torch.Tensor,
             pair_logits: torch.Tensor | None, next_sentence_labels: torch.Tensor, attention_mask: torch.Tensor,
             mlm_loss_scale: torch.Tensor, sentence_objective: str, *, token_loss_sum: torch.Tensor | None = None,
             more_stats: tuple[torch.Tensor, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, statistics in the order of ``STAT_NAMES`` then ``more_stats``) from the masked tokens' losses and the
    pair head's logits: the token losses' sum (plus ``token_loss_sum``, another family's sum over the same tokens,
    e.g. SpanBERT's boundary losses) times ``mlm_loss_scale``, plus the pair loss's mean over the rows."""
    tokens = mlm_losses.sum() if token_loss_sum is None else mlm_losses.sum() + token_loss_sum
    loss = tokens * mlm_loss_scale
    rows = float(attention_mask.shape[0])
    zero = torch.zeros((), device=loss.device)
    pair_loss_sum = pair_correct = pair_sequences = zero
    if sentence_objective != "none":
        pair_losses = F.cross_entropy(pair_logits.float(), next_sentence_labels, reduction="none")
        loss = loss + pair_losses.mean()
        pair_loss_sum = pair_losses.detach().sum()
        pair_correct = (pair_logits.detach().argmax(-1) == next_sentence_labels).sum().float()
        pair_sequences = torch.full((), rows, device=loss.device)
    with torch.no_grad():  # counts known on the host enter by torch.full: a kernel argument, not a copy
        stats = torch.stack([
            mlm_losses.sum(), (mlm_logits.argmax(-1) == masked_labels).sum().float(),
            torch.full((), float(masked_labels.numel()), device=loss.device),
            pair_loss_sum, pair_correct, pair_sequences,
            torch.full((), rows, device=loss.device), attention_mask.sum().float(),
            (~torch.isfinite(loss.detach())).float(), *more_stats,
        ]).float()
    return loss, stats
