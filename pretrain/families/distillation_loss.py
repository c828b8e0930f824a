"""DistilBERT's loss (Sanh et al. 2019) around a student BERT, with a frozen teacher BERT beside it.

    loss = kl_weight x T^2 x KL(softmax(teacher / T) || softmax(student / T))   over the masked tokens
         + mlm_weight x cross-entropy(student, original token)                 over the masked tokens
         + cosine_weight x (1 - cos(student last hidden state, teacher's))     over the real tokens
         + the sentence-pair loss (NSP or SOP) of the student's own head, as BERT's objective, when the dataset has one

Each token term is a mean over the whole global batch's tokens (the loader's ``mlm_loss_scale`` for the masked
tokens, ``token_loss_scale`` for all real ones), so the loss does not depend on how the batch is split across ranks
and accumulation steps. T^2 keeps the soft targets' gradients at the scale of the hard ones as T changes (Hinton et
al. 2015, section 2); DistilBERT's training code multiplies by it too. The teacher's soft distribution is taken at
the masked positions only, as DistilBERT's ``mlm_mask``: the student's logits elsewhere carry no target.

The teacher is held in a plain attribute, not as a submodule: DeepSpeed wraps this module and would otherwise train,
cast, partition and checkpoint the teacher too. Its forward runs under ``torch.no_grad()`` in eval mode (no dropout:
the same inputs give the same targets, so a resumed run repeats the uninterrupted one), moved to the batch's device
on first use and kept in ``teacher_dtype``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import unpad_batch
from models.bert.model import BertForPreTraining

# Order of the entries of the statistics vector returned with the loss. kl_loss_sum is T^2 x KL summed over the
# masked tokens; agreement counts the masked tokens where the student's top-1 token is the teacher's; cosine_loss_sum
# sums 1 - cos over the real tokens. The rest mean what they mean in pretrain.families.bert_loss.STAT_NAMES.
STAT_NAMES = ("mlm_loss_sum", "mlm_correct", "mlm_tokens", "kl_loss_sum", "agreement", "cosine_loss_sum",
              "pair_loss_sum", "pair_correct", "pair_sequences", "sequences", "tokens", "nonfinite_losses")


@dataclass(frozen=True)
class Weights:
    """The loss's temperature and term weights (``DistillationConfig``'s)."""

    temperature: float = 2.0
    kl: float = 5.0
    mlm: float = 2.0
    cosine: float = 1.0


@dataclass
class Encoded:
    """What a model's forward gives the loss: the last hidden states of the real tokens (N, H), the MLM logits at
    the masked positions (M, V) and the sentence-pair logits (B, 2)."""

    hidden: torch.Tensor
    mlm_logits: torch.Tensor
    pair_logits: torch.Tensor


def encode(model: BertForPreTraining, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
           attention_mask: torch.Tensor, masked_positions: torch.Tensor, *, padding_free: bool,
           position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
           loader_unpadding: dict | None = None) -> Encoded:
    """``model``'s forward on a loader micro-batch, keeping the hidden states that ``BertForPreTraining`` drops."""
    if padding_free:
        unpadding, unpadded_positions = unpad_batch(attention_mask, masked_positions, loader_unpadding or {})
        unpadded = lambda t: None if t is None else unpadding.unpad(t)  # noqa: E731
        hidden, pooled = model.bert(unpadding.unpad(input_ids), unpadding.unpad(token_type_ids), None, unpadding,
                                    position_ids=unpadded(position_ids), document_ids=unpadded(document_ids))
        real, masked = hidden, hidden.index_select(0, unpadded_positions)
    else:
        hidden, pooled = model.bert(input_ids, token_type_ids, attention_mask, position_ids=position_ids,
                                    document_ids=document_ids)
        flat = hidden.reshape(-1, hidden.shape[-1])
        real, masked = flat[attention_mask.reshape(-1).bool()], flat.index_select(0, masked_positions)
    return Encoded(real, model.cls.predictions(masked), model.cls.seq_relationship(pooled))


def soft_target_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 x KL(softmax(teacher / T) || softmax(student / T)) per row, in fp32."""
    t = temperature
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return F.kl_div(student, teacher, reduction="none", log_target=True).sum(-1) * (t * t)


class DistillationLoss(nn.Module):
    """The student (``self.model``, trained and checkpointed) and the frozen teacher (``self.teacher``, neither)."""

    def __init__(self, student: BertForPreTraining, teacher: BertForPreTraining, weights: Weights, *,
                 sentence_objective: str = "none", padding_free: bool = False,
                 teacher_dtype: torch.dtype = torch.float32):
        super().__init__()
        if sentence_objective not in ("nsp", "sop", "none"):
            raise ValueError(f"sentence_objective {sentence_objective!r}: choose nsp, sop or none")
        if student.config.hidden_size != teacher.config.hidden_size:
            raise ValueError(f"the cosine loss compares hidden states: the student's width "
                             f"{student.config.hidden_size} is not the teacher's {teacher.config.hidden_size}")
        self.model = student
        self.weights = weights
        self.sentence_objective = sentence_objective
        self.padding_free = padding_free
        self.teacher_dtype = teacher_dtype
        teacher.eval().requires_grad_(False)
        object.__setattr__(self, "teacher", teacher)  # not a submodule: see the module docstring

    def _teacher_on(self, device: torch.device) -> BertForPreTraining:
        weight = self.teacher.bert.embeddings.word_embeddings.weight
        if weight.device != device or weight.dtype != self.teacher_dtype:
            self.teacher.to(device=device, dtype=self.teacher_dtype)
        return self.teacher.eval()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                masked_positions: torch.Tensor, masked_labels: torch.Tensor, next_sentence_labels: torch.Tensor,
                mlm_loss_scale: torch.Tensor, token_loss_scale: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                **loader_unpadding) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to back-propagate, detached statistics in the order of ``STAT_NAMES``); ``loader_unpadding`` as
        ``pretrain.families.bert_loss.PretrainingLoss``'s."""
        if token_loss_scale is None:
            raise ValueError("distillation's cosine loss needs the loader's token_loss_scale")
        inputs = dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                      masked_positions=masked_positions, padding_free=self.padding_free, position_ids=position_ids,
                      document_ids=document_ids, loader_unpadding=loader_unpadding)
        with torch.no_grad():
            teacher = encode(self._teacher_on(input_ids.device), **inputs)
        student = encode(self.model, **inputs)
        w = self.weights
        mlm_losses = F.cross_entropy(student.mlm_logits.float(), masked_labels, reduction="none")
        kl_losses = soft_target_kl(student.mlm_logits, teacher.mlm_logits, w.temperature)
        cosine_losses = 1.0 - F.cosine_similarity(student.hidden.float(), teacher.hidden.float(), dim=-1)
        loss = ((w.kl * kl_losses.sum() + w.mlm * mlm_losses.sum()) * mlm_loss_scale
                + w.cosine * cosine_losses.sum() * token_loss_scale)
        zero = torch.zeros((), device=loss.device)
        pair_loss_sum = pair_correct = pair_sequences = zero
        if self.sentence_objective != "none":
            pair_losses = F.cross_entropy(student.pair_logits.float(), next_sentence_labels, reduction="none")
            loss = loss + pair_losses.mean()
            pair_loss_sum = pair_losses.detach().sum()
            pair_correct = (student.pair_logits.detach().argmax(-1) == next_sentence_labels).sum().float()
            pair_sequences = torch.full((), float(input_ids.shape[0]), device=loss.device)
        with torch.no_grad():
            predicted = student.mlm_logits.argmax(-1)
            stats = torch.stack([
                mlm_losses.sum(), (predicted == masked_labels).sum().float(),
                torch.full((), float(masked_labels.numel()), device=loss.device), kl_losses.sum(),
                (predicted == teacher.mlm_logits.argmax(-1)).sum().float(), cosine_losses.sum(),
                pair_loss_sum, pair_correct, pair_sequences,
                torch.full((), float(input_ids.shape[0]), device=loss.device), attention_mask.sum().float(),
                (~torch.isfinite(loss.detach())).float(),
            ]).float()
        return loss, stats


__all__ = ["STAT_NAMES", "DistillationLoss", "Encoded", "Weights", "encode", "soft_target_kl"]
