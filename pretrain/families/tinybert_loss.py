"""TinyBERT's general-distillation loss (Jiao et al. 2020, section 3.1) around a student BERT, with a frozen teacher.

    loss = embedding_weight x MSE(E_s W_e, E_t)                                    the embedding layers' outputs
         + hidden_weight x sum over student layers m of MSE(H_s,m W_h, H_t,g(m))   every layer's output
         + attention_weight x sum over m of MSE(A_s,m, A_t,g(m))                    unnormalised attention scores
         + prediction_weight x soft cross-entropy(teacher / T, student / T)         over the masked tokens
         + the sentence-pair loss (NSP or SOP) of the student's own head, when the dataset has one

g(m) is the teacher layer (1..N) fitted by student layer m (1..M): m x N / M by default (``tinybert_layer_map``).
W_h (one matrix for every layer, as the paper's) and W_e map the student's width to the teacher's; they exist only
where the widths differ (else the identity) and are training-only parameters of this module, outside the student:
trained and checkpointed with it, never exported. They start as BERT's linear layers do, N(0, 0.02) and zero bias,
from a generator seeded by the run's seed and a stable key (``projections``).

The attention term fits A = Q K^T / sqrt(d_head) before the softmax, as the paper does ("the unnormalized attention
matrix ... has a faster convergence rate and better performances" than its softmax) and its code (the scores with
the padding mask added, masked entries zeroed). Here the masked (query, key) pairs are left out instead of counted
as zeros: per real query token the mean over heads and the keys it attends to, so on rows without padding it is the
paper's mean over all entries. The student needs the teacher's head count; its head size may differ.

Each token term is a mean over the whole global batch's real tokens (``token_loss_scale``; the prediction term over
masked tokens, ``mlm_loss_scale``) of a per-token mean over the teacher's width, so it does not depend on how the
batch is split across ranks and accumulation steps; the layer terms are summed over layers, as the paper's code sums
them. The prediction term is TinyBERT's ``soft_cross_entropy``, without DistilBERT's T^2; it is 0 by default: general
distillation fits the intermediate layers only, the prediction layer is for task distillation. The student's MLM
loss and accuracy are logged (not trained) to follow what its head makes of its hidden states.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from models.bert.model import BertForPreTraining, embed

# Order of the statistics vector: each *_loss_sum is the term's per-token loss summed over the real tokens (the
# prediction term's over the masked tokens; the layer terms summed over layers too); mlm_* and agreement are the
# student's own head on the masked tokens (agreement: its top-1 token is the teacher's). The rest as in
# pretrain.families.bert_loss.STAT_NAMES.
STAT_NAMES = ("embedding_loss_sum", "hidden_loss_sum", "attention_loss_sum", "prediction_loss_sum", "mlm_loss_sum",
              "mlm_correct", "mlm_tokens", "agreement", "pair_loss_sum", "pair_correct", "pair_sequences",
              "sequences", "tokens", "nonfinite_losses")
PROJECTIONS = "projections."  # the loss module's own parameters (W_h, W_e), left out of the export


@dataclass(frozen=True)
class Weights:
    """The loss's temperature and term weights (``DistillationConfig``'s; the defaults are general distillation's)."""

    temperature: float = 1.0
    embedding: float = 1.0
    hidden: float = 1.0
    attention: float = 1.0
    prediction: float = 0.0


def tinybert_layer_map(teacher_layers: int, student_layers: int, given: list[int] | None = None) -> list[int]:
    """g(m) for m = 1..M: the teacher layer (1..N) whose output and attention student layer m fits; ``given`` or
    TinyBERT's uniform m x N / M (rounded down where M does not divide N)."""
    if given is None:
        return [m * teacher_layers // student_layers for m in range(1, student_layers + 1)]
    if len(given) != student_layers or not all(1 <= g <= teacher_layers for g in given):
        raise ValueError(f"distillation.layer_map {given}: one teacher layer from 1 to {teacher_layers} for each of "
                         f"the {student_layers} student layers")
    return list(given)


def projection_seed(seed: int) -> int:
    """The seed of W_h's and W_e's initialisation: a stable hash of the run's seed (never Python's ``hash``)."""
    return int.from_bytes(hashlib.blake2b(f"tinybert-projections/{seed}".encode(), digest_size=8).digest(),
                          "little") >> 1


class Projections(nn.Module):
    """W_h and W_e, student width -> teacher width (identity where equal, so no parameters then)."""

    def __init__(self, student_width: int, teacher_width: int, seed: int, std: float = 0.02):
        super().__init__()
        if student_width == teacher_width:
            self.hidden, self.embedding = nn.Identity(), nn.Identity()
            return
        self.hidden = nn.Linear(student_width, teacher_width)
        self.embedding = nn.Linear(student_width, teacher_width)
        generator = torch.Generator().manual_seed(projection_seed(seed))
        with torch.no_grad():
            for linear in (self.hidden, self.embedding):
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * std)
                linear.bias.zero_()


@dataclass
class Internals:
    """What the loss reads of a forward: the embedding layer's output, the chosen layers' outputs and attention
    scores (each (B, T, H) and (B, nh, T, T)), the attention mask the layers used and the last layer's output."""

    embedded: torch.Tensor
    hidden: list[torch.Tensor]
    scores: list[torch.Tensor]
    attn_mask: torch.Tensor | None
    last: torch.Tensor


def internals(model: BertForPreTraining, layers: list[int], input_ids: torch.Tensor, token_type_ids: torch.Tensor,
              attention_mask: torch.Tensor, *, run_all: bool, position_ids: torch.Tensor | None = None,
              document_ids: torch.Tensor | None = None) -> Internals:
    """The padded-mode forward of ``model.bert`` keeping the outputs and scores of ``layers`` (1-based); the others
    run through SDPA as usual, and with ``run_all`` false the layers past the last wanted are skipped."""
    x, attn_mask, _ = embed(model.bert.embeddings, input_ids, token_type_ids, attention_mask, None,
                            position_ids=position_ids, document_ids=document_ids)
    embedded, hidden, scores, wanted = x, {}, {}, set(layers)
    encoder = model.bert.encoder
    stop = len(encoder.layer) if run_all else max(layers)
    for number, layer in enumerate(encoder.layer[:stop], start=1):
        checkpointed = encoder.gradient_checkpointing and model.training
        if number in wanted:
            if checkpointed:
                x, s = torch.utils.checkpoint.checkpoint(layer.forward_with_scores, x, attn_mask, use_reentrant=False)
            else:
                x, s = layer.forward_with_scores(x, attn_mask)
            hidden[number], scores[number] = x, s
        else:
            x = (torch.utils.checkpoint.checkpoint(layer, x, attn_mask, use_reentrant=False) if checkpointed
                 else layer(x, attn_mask))
    return Internals(embedded, [hidden[n] for n in layers], [scores[n] for n in layers], attn_mask, x)


def token_mse(student: torch.Tensor, teacher: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Per real token, the mean over the width of the squared difference, summed over the real tokens (fp32)."""
    return (student.float() - teacher.float()).pow(2).mean(-1)[real].sum()


def score_mse(student: torch.Tensor, teacher: torch.Tensor, attn_mask: torch.Tensor | None,
              real: torch.Tensor) -> torch.Tensor:
    """Per real query token, the mean over heads and attended keys of the squared score difference, summed (fp32)."""
    squared = (student.float() - teacher.float()).pow(2)  # (B, nh, T, T)
    if attn_mask is None:
        per_query = squared.mean(-1)
    else:
        allowed = attn_mask.expand(squared.shape[0], 1, squared.shape[2], squared.shape[3]).float()
        per_query = (squared * allowed).sum(-1) / allowed.sum(-1).clamp(min=1.0)
    return per_query.mean(1)[real].sum()


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    """-sum softmax(teacher / T) log softmax(student / T) per row, in fp32 (TinyBERT's, no T^2)."""
    target = F.softmax(teacher_logits.float() / temperature, dim=-1)
    return -(target * F.log_softmax(student_logits.float() / temperature, dim=-1)).sum(-1)


class TinyBertLoss(nn.Module):
    """The student (``self.model``) and W_h, W_e (``self.projections``) are trained and checkpointed; the frozen
    teacher (``self.teacher``) is neither, held as ``DistillationLoss`` holds it (a plain attribute)."""

    def __init__(self, student: BertForPreTraining, teacher: BertForPreTraining, weights: Weights,
                 layer_map: list[int], *, seed: int, sentence_objective: str = "none",
                 teacher_dtype: torch.dtype = torch.float32):
        super().__init__()
        if sentence_objective not in ("nsp", "sop", "none"):
            raise ValueError(f"sentence_objective {sentence_objective!r}: choose nsp, sop or none")
        ours, theirs = student.config, teacher.config
        if weights.attention > 0 and ours.num_attention_heads != theirs.num_attention_heads:
            raise ValueError(f"TinyBERT's attention loss fits head to head: the student has "
                             f"{ours.num_attention_heads} heads, the teacher {theirs.num_attention_heads}; set "
                             "distillation.student_attention_heads to the teacher's, or attention_weight: 0")
        self.model = student
        self.projections = Projections(ours.hidden_size, theirs.hidden_size, seed, ours.initializer_range)
        self.weights = weights
        self.layer_map = tinybert_layer_map(theirs.num_hidden_layers, ours.num_hidden_layers, layer_map)
        self.sentence_objective = sentence_objective
        self.teacher_dtype = teacher_dtype
        teacher.eval().requires_grad_(False)
        object.__setattr__(self, "teacher", teacher)  # not a submodule: DeepSpeed must not train or save it

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
        """(loss to back-propagate, detached statistics in the order of ``STAT_NAMES``); padded mode only."""
        if token_loss_scale is None:
            raise ValueError("TinyBERT's layer losses need the loader's token_loss_scale")
        w, inputs = self.weights, dict(position_ids=position_ids, document_ids=document_ids)
        student_layers = list(range(1, self.model.config.num_hidden_layers + 1))
        with torch.no_grad():
            teacher_model = self._teacher_on(input_ids.device)
            teacher = internals(teacher_model, self.layer_map, input_ids, token_type_ids, attention_mask,
                                run_all=w.prediction > 0, **inputs)
        student = internals(self.model, student_layers, input_ids, token_type_ids, attention_mask, run_all=True,
                            **inputs)
        real = attention_mask.bool()
        embedding = token_mse(self.projections.embedding(student.embedded), teacher.embedded, real)
        hidden = sum(token_mse(self.projections.hidden(s), t, real) for s, t in zip(student.hidden, teacher.hidden))
        attention = sum(score_mse(s, t, student.attn_mask, real) for s, t in zip(student.scores, teacher.scores))
        masked = lambda h: h.reshape(-1, h.shape[-1]).index_select(0, masked_positions)  # noqa: E731
        zero = torch.zeros((), device=input_ids.device)
        if w.prediction > 0:
            student_logits = self.model.cls.predictions(masked(student.last))
            teacher_logits = teacher_model.cls.predictions(masked(teacher.last)).detach()
            prediction = soft_cross_entropy(student_logits, teacher_logits, w.temperature).sum()
        else:
            with torch.no_grad():  # the head is not trained: its logits only for the logged MLM accuracy
                student_logits = self.model.cls.predictions(masked(student.last))
            teacher_logits, prediction = None, zero
        loss = ((w.embedding * embedding + w.hidden * hidden + w.attention * attention) * token_loss_scale
                + w.prediction * prediction * mlm_loss_scale)
        pair_loss_sum = pair_correct = pair_sequences = zero
        if self.sentence_objective != "none":
            pair_logits = self.model.cls.seq_relationship(self.model.bert.pooler(student.last))
            pair_losses = F.cross_entropy(pair_logits.float(), next_sentence_labels, reduction="none")
            loss = loss + pair_losses.mean()
            pair_loss_sum = pair_losses.detach().sum()
            pair_correct = (pair_logits.detach().argmax(-1) == next_sentence_labels).sum().float()
            pair_sequences = torch.full((), float(input_ids.shape[0]), device=loss.device)
        with torch.no_grad():
            predicted = student_logits.argmax(-1)
            agreement = zero if teacher_logits is None else (predicted == teacher_logits.argmax(-1)).sum().float()
            count = lambda n: torch.full((), float(n), device=loss.device)  # noqa: E731
            stats = torch.stack([
                embedding.detach(), hidden.detach(), attention.detach(),
                prediction.detach(), F.cross_entropy(student_logits.float(), masked_labels, reduction="sum"),
                (predicted == masked_labels).sum().float(), count(masked_labels.numel()), agreement,
                pair_loss_sum, pair_correct, pair_sequences, count(input_ids.shape[0]), real.sum().float(),
                (~torch.isfinite(loss.detach())).float(),
            ]).float()
        return loss, stats


__all__ = ["PROJECTIONS", "STAT_NAMES", "Internals", "Projections", "TinyBertLoss", "Weights", "internals",
           "projection_seed", "score_mse", "soft_cross_entropy", "tinybert_layer_map", "token_mse"]
