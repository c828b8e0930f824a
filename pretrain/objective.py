"""The pretraining loss around the model: masked-token cross-entropy plus next-sentence cross-entropy.

Kept apart from the model so that the model stays a plain ``BertForPreTraining``; DeepSpeed wraps this
module. Besides the loss it returns the sums that logging needs, so that metrics over many steps and
ranks are exact ratios of sums rather than means of means.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pretrain.model import BertForPreTraining

# Order of the entries of the statistics vector returned with the loss.
STAT_NAMES = ("mlm_loss_sum", "mlm_correct", "mlm_tokens", "nsp_loss_sum", "nsp_correct", "sequences", "tokens",
              "nonfinite_losses")


class PretrainingObjective(nn.Module):
    def __init__(self, model: BertForPreTraining):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                masked_positions: torch.Tensor, masked_labels: torch.Tensor, next_sentence_labels: torch.Tensor,
                mlm_loss_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to back-propagate, detached statistics in the order of ``STAT_NAMES``).

        ``mlm_loss_scale`` turns this micro-batch's summed token losses into its share of the mean over
        the whole global batch (see ``PretrainingLoader``).
        """
        mlm_logits, nsp_logits = self.model(input_ids, token_type_ids, attention_mask, masked_positions)
        mlm_losses = F.cross_entropy(mlm_logits.float(), masked_labels, reduction="none")
        nsp_losses = F.cross_entropy(nsp_logits.float(), next_sentence_labels, reduction="none")
        loss = mlm_losses.sum() * mlm_loss_scale + nsp_losses.mean()
        with torch.no_grad():
            stats = torch.stack([
                mlm_losses.sum(), (mlm_logits.argmax(-1) == masked_labels).sum().float(),
                torch.tensor(float(masked_labels.numel()), device=loss.device),
                nsp_losses.sum(), (nsp_logits.argmax(-1) == next_sentence_labels).sum().float(),
                torch.tensor(float(input_ids.shape[0]), device=loss.device), attention_mask.sum().float(),
                (~torch.isfinite(loss.detach())).float(),
            ]).float()
        return loss, stats
