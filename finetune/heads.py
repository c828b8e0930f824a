"""Task heads on our encoders (BERT, ALBERT, ELECTRA), with Hugging Face's parameter names (``bert``/``albert``/
``electra``, ``classifier``, ``qa_outputs``), so a finetuned model's state dict loads into ``transformers``' task
model of its family.

The heads run the encoder in its padding-free mode (``models.attention.Unpadding``) by default: every dense layer
sees only the batch's real tokens, as batches padded to their longest row are largely padding. Dropout draws its
masks over the padded shape, so from the same random state training takes the steps the padded encoder (and
``transformers``) would take. ``padding_free=False`` runs the padded mode, for comparison.

Token and span heads are the same for every family. The sequence head is each family's own, as in
``transformers``: BERT and ALBERT classify the pooled [CLS] (tanh dense) with one linear layer; ELECTRA has no
pooler and classifies the [CLS] hidden state through dense, gelu, dropout and an output layer
(``ElectraClassificationHead``); DeBERTa pools [CLS] in the head (``ContextPooler``: dropout, dense, activation) and
classifies that through dropout and one linear layer: each family's ``pooled`` and ``context_pooler`` in
``models.registry``.

Nothing here imports DeepSpeed or torch.distributed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from finetune.pretrained import Encoder, load_encoder
from models import registry
from models.attention import Unpadding


def _family(encoder: nn.Module) -> tuple[str, bool, bool]:
    """(the attribute ``transformers`` names the encoder by: its ``encoder_prefix`` or ``model_type``, whether its
    sequence head reads the pooled [CLS], whether the head pools it itself)."""
    family = registry.of_encoder(encoder)
    return family.encoder_prefix or family.model_type, family.pooled, family.context_pooler


class _Head(nn.Module):
    """Holds the encoder under its family's name and runs it, padding-free or padded."""

    def __init__(self, encoder: Encoder, padding_free: bool):
        super().__init__()
        self._encoder_name, self._pooled, self._context_pooler = _family(encoder)
        self.add_module(self._encoder_name, encoder)
        self.padding_free = padding_free

    @property
    def encoder(self) -> Encoder:
        return getattr(self, self._encoder_name)

    def _init(self, linear: nn.Linear) -> nn.Linear:
        nn.init.normal_(linear.weight, std=self.encoder.config.initializer_range)
        nn.init.zeros_(linear.bias)
        return linear

    def _encode(self, input_ids, token_type_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                          Unpadding | None]:
        """(hidden: unpadded (N, H) or padded (B, T, H), pooled (B, H) or None, the unpadding or None)."""
        if not self.padding_free:
            hidden, pooled = self.encoder(input_ids, token_type_ids, attention_mask=attention_mask)
            return hidden, pooled, None
        unpadding = Unpadding.from_attention_mask(attention_mask)
        hidden, pooled = self.encoder(unpadding.unpad(input_ids), unpadding.unpad(token_type_ids), unpadding=unpadding)
        return hidden, pooled, unpadding

    @staticmethod
    def _padded(hidden: torch.Tensor, unpadding: Unpadding | None) -> torch.Tensor:
        """(B, T, H); in padding-free mode zeros at padding."""
        return hidden if unpadding is None else unpadding.pad(hidden)

    @staticmethod
    def _first(hidden: torch.Tensor, unpadding: Unpadding | None) -> torch.Tensor:
        """(B, H): the [CLS] position of every row."""
        return hidden[:, 0] if unpadding is None else hidden.index_select(0, unpadding.cu_seqlens[:-1].long())


class ElectraClassificationHead(nn.Module):
    """transformers' ``ElectraClassificationHead``: the [CLS] state through dropout, dense, gelu, dropout, out_proj."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.dense(self.dropout(first)))
        return self.out_proj(self.dropout(x))


class ContextPooler(nn.Module):
    """transformers' DeBERTa ``ContextPooler``: the [CLS] state through dropout, dense and an activation."""

    def __init__(self, hidden_size: int, dropout: float, activation):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(self.dropout(first)))


class SequenceClassifier(_Head):
    """GLUE: the family's head on [CLS] (see the module's docstring); one output is regression (STS-B, mean
    squared error)."""

    def __init__(self, encoder: Encoder, num_labels: int, dropout: float = 0.1, padding_free: bool = True):
        super().__init__(encoder, padding_free)
        self.num_labels = num_labels
        hidden_size = encoder.config.hidden_size
        if self._context_pooler:
            config = encoder.config
            self.pooler = ContextPooler(hidden_size, config.pooler_dropout, config.pooler_activation())
            self._init(self.pooler.dense)
        if self._pooled or self._context_pooler:
            self.dropout = nn.Dropout(dropout)
            self.classifier = self._init(nn.Linear(hidden_size, num_labels))
        else:
            self.classifier = ElectraClassificationHead(hidden_size, num_labels, dropout)
            self._init(self.classifier.dense)
            self._init(self.classifier.out_proj)

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None):
        hidden, pooled, unpadding = self._encode(input_ids, token_type_ids, attention_mask)
        if self._context_pooler:
            logits = self.classifier(self.dropout(self.pooler(self._first(hidden, unpadding)))).float()
        elif self._pooled:
            logits = self.classifier(self.dropout(pooled)).float()
        else:
            logits = self.classifier(self._first(hidden, unpadding)).float()
        if labels is None:
            return logits
        if self.num_labels == 1:
            return F.mse_loss(logits.squeeze(-1), labels.float()), logits
        return F.cross_entropy(logits, labels), logits


class SpanExtractor(_Head):
    """SQuAD: start and end logits per token."""

    def __init__(self, encoder: Encoder, padding_free: bool = True):
        super().__init__(encoder, padding_free)
        self.qa_outputs = self._init(nn.Linear(encoder.config.hidden_size, 2))

    def forward(self, input_ids, token_type_ids, attention_mask, start_positions=None, end_positions=None):
        hidden, _, unpadding = self._encode(input_ids, token_type_ids, attention_mask)
        start, end = self.qa_outputs(self._padded(hidden, unpadding)).float().unbind(-1)
        # Padding can never be an answer.
        start = start.masked_fill(attention_mask == 0, -1e4)
        end = end.masked_fill(attention_mask == 0, -1e4)
        if start_positions is None:
            return start, end
        loss = (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2
        return loss, (start, end)


class TokenClassifier(_Head):
    """CoNLL-2003: a label per token; only first sub-tokens carry labels (-100 elsewhere)."""

    def __init__(self, encoder: Encoder, num_labels: int, dropout: float = 0.1, padding_free: bool = True):
        super().__init__(encoder, padding_free)
        self.dropout = nn.Dropout(dropout)
        self.classifier = self._init(nn.Linear(encoder.config.hidden_size, num_labels))

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None):
        hidden, _, unpadding = self._encode(input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(self._padded(hidden, unpadding))).float()
        if labels is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100), logits


def pad_batch(rows: list[dict], pad_id: int, multiple: int = 8) -> dict[str, torch.Tensor]:
    """Stack feature dicts, padding the per-token lists to the longest row (rounded up to ``multiple``)."""
    width = max(len(r["input_ids"]) for r in rows)
    width = -(-width // multiple) * multiple
    batch = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if isinstance(values[0], (list, tuple)):
            fill = pad_id if key == "input_ids" else (-100 if key == "labels" else 0)
            batch[key] = torch.tensor([list(v) + [fill] * (width - len(v)) for v in values])
        else:
            batch[key] = torch.tensor(values)
    batch["attention_mask"] = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"]))
                                            for r in rows])
    return batch


__all__ = ["ContextPooler", "ElectraClassificationHead", "SequenceClassifier", "SpanExtractor", "TokenClassifier",
           "load_encoder", "pad_batch"]
