"""Finetuned task models out: each task's selected model as a Hugging Face directory of the family's task class
(``…ForSequenceClassification``, ``…ForTokenClassification``, ``…ForQuestionAnswering``) with its tokenizer, so
``transformers``' Auto classes and pipelines load it.

Our heads (``finetune.heads``) carry ``transformers``' parameter names, so the state dict is written as it is, less
the pooler of the token and span heads (``transformers`` builds those encoders without one). The config is the
checkpoint's own config.json with the task's class, labels (``id2label``/``label2id``) and ``problem_type``; the
tokenizer files are written from the tokenizer finetuning used (``models.hf_tokenizer``: WordPiece or SentencePiece),
with ``model_max_length`` the finetuning sequence length, so a pipeline that truncates cuts where our evaluation did.

Which seed: by default the median seed by the task's main metric. For an even number of seeds it is the lower of
the two middle runs (the conservative pick: a real run, never better than the middle), ties broken by the order of
``seeds``. As seeds run one after another, each seed's model is written to ``models/.staging/`` when its run ends
(one state dict on disk per seed, none held in memory); when the task's seeds are done the chosen one is renamed
to ``models/<task>/`` and the others removed. ``save_seed`` writes only that seed's.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from common.errors import CheckpointError
from finetune.heads import SequenceClassifier, SpanExtractor, TokenClassifier
from models import registry
from models.hf_io import non_finite, read_json_object, write_export
from models.hf_tokenizer import unwritable_reason

log = logging.getLogger("finetune")

MODELS_DIR = "models"  # under --output: models/<task>/
_STAGING = ".staging"
_TOKENIZER_CLASS = {"electra": "ElectraTokenizer"}  # of a WordPiece vocab.txt; every other family: BertTokenizer
# Keys of the checkpoint's config.json that describe its pretraining heads or remote code, not the task model.
_DROPPED_KEYS = ("architectures", "id2label", "label2id", "num_labels", "problem_type", "auto_map", "_name_or_path",
                 "finetuning_task", "transformers_version")


def _model_type(model: nn.Module) -> str:
    return registry.of_encoder(model.encoder).model_type


def task_class(model: nn.Module) -> str:
    """The ``transformers`` class of ``model``'s family and head, e.g. ``ElectraForTokenClassification`` (the
    model_type in CamelCase: ``deberta-v2`` is ``DebertaV2``)."""
    prefix = "".join(part.capitalize() for part in _model_type(model).replace("-", "_").split("_"))
    suffix = {SequenceClassifier: "ForSequenceClassification", TokenClassifier: "ForTokenClassification",
              SpanExtractor: "ForQuestionAnswering"}[type(model)]
    return prefix + suffix


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights under ``transformers``' names: BERT's and ALBERT's token and span models have no pooler
    (only their sequence classifiers read it), so it is left out of those (``_encoder_name``: the attribute the
    head holds the encoder under, transformers' prefix)."""
    state = model.state_dict()
    if isinstance(model, SequenceClassifier):
        return state
    pooler = f"{model._encoder_name}.pooler."
    return {name: value for name, value in state.items() if not name.startswith(pooler)}


def hf_config(source: dict, model: nn.Module, labels: tuple[str, ...] = (), regression: bool = False) -> dict:
    """config.json of the task model: the checkpoint's ``source`` config with the task's class, labels and, for a
    sequence classifier, ``problem_type`` (``regression`` for STS-B: the text-classification pipeline then reports
    the raw score instead of a sigmoid of it)."""
    config = {key: value for key, value in source.items() if key not in _DROPPED_KEYS}
    config["architectures"] = [task_class(model)]
    names = ("score",) if regression else labels
    if names:
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    if isinstance(model, SequenceClassifier):
        config["problem_type"] = "regression" if regression else "single_label_classification"
    return config


def median_seed(scores: dict[int, float]) -> int:
    """The seed of the median run by score; for an even count the lower of the two middle runs. A NaN score (a
    diverged run) ranks lowest; equal scores keep the order of ``scores``."""
    ranked = sorted(scores, key=lambda seed: -math.inf if math.isnan(scores[seed]) else scores[seed])
    return ranked[(len(ranked) - 1) // 2]


def check_tokenizer(tokenizer, source_dir: Path) -> None:
    """Refuse, before anything trains, a tokenizer we cannot write for ``transformers``
    (``models.hf_tokenizer.unwritable_reason``: a SentencePiece BPE model)."""
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer.save(scratch)
        reason = unwritable_reason(scratch)
    if reason is not None:
        raise CheckpointError(f"{source_dir}: save_models cannot write transformers' tokenizer files: {reason}; "
                              "or finetune without --save-models")


def save_task_model(model: nn.Module, directory: Path, *, source_dir: Path, tokenizer, max_length: int,
                    labels: tuple[str, ...] = (), regression: bool = False) -> None:
    """Write ``model`` as a ``transformers`` task-model directory with its tokenizer, whole or not at all
    (``models.hf_io.write_export``); weights holding NaN or inf are refused with a ``CheckpointError``."""
    state = hf_state_dict(model)
    bad = non_finite(state)
    if bad:
        raise CheckpointError(f"{directory}: not saved: {len(bad)} weight tensors hold NaN or inf (first {bad[0]}); "
                              "the run diverged: lower the learning rate or pick another seed (save_seed)")
    check_tokenizer(tokenizer, source_dir)
    config = hf_config(read_json_object(source_dir / "config.json"), model, labels, regression)
    with tempfile.TemporaryDirectory(dir=directory.parent) as scratch:
        tokenizer.save(scratch)  # our format; write_export adds vocab.txt and tokenizer_config.json beside it
        write_export(directory, config, state, scratch, max_length=max_length,
                     tokenizer_class=_TOKENIZER_CLASS.get(_model_type(model), "BertTokenizer"),
                     note="the finetuning run's report is untouched: run it again to save the model")


@dataclass
class _Task:
    scores: dict[int, float] = field(default_factory=dict)
    epochs: dict[int, int] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


class TaskModels:
    """Saves the selected model of each task under ``out/models/<task>/`` (see the module's docstring); a no-op
    unless ``enabled``."""

    def __init__(self, out: Path, source_dir: Path, tokenizer, *, enabled: bool, seed: int | None = None):
        self.root, self.source_dir, self.tokenizer = Path(out) / MODELS_DIR, Path(source_dir), tokenizer
        self.enabled, self.seed = enabled, seed
        self._tasks: dict[str, _Task] = {}

    @classmethod
    def for_run(cls, cfg, out: Path, source_dir: Path, tokenizer) -> TaskModels:
        return cls(out, source_dir, tokenizer, enabled=cfg.save_models, seed=cfg.save_seed)

    def _staged(self, task: str, seed: int) -> Path:
        return self.root / _STAGING / f"{task}-seed{seed}"

    def keep(self, task: str, seed: int, model: nn.Module, run, *, max_length: int, labels: tuple[str, ...] = (),
             regression: bool = False) -> None:
        """Record ``run``'s score and write ``model`` (holding the run's selected epoch) to the staging area, if
        its seed may be chosen."""
        if not self.enabled:
            return
        record = self._tasks.setdefault(task, _Task())
        record.scores[seed], record.epochs[seed] = float(run.primary), run.best_epoch
        if self.seed is not None and seed != self.seed:
            return
        staged = self._staged(task, seed)
        staged.parent.mkdir(parents=True, exist_ok=True)
        try:
            save_task_model(model, staged, source_dir=self.source_dir, tokenizer=self.tokenizer,
                            max_length=max_length, labels=labels, regression=regression)
        except CheckpointError as error:  # this seed cannot be saved; another may be the one chosen
            record.errors[seed] = str(error)

    def publish(self, task: str, metric: str) -> dict | None:
        """Move the chosen seed's model to ``models/<task>/`` and drop the other seeds'; what the report says of it:
        ``path`` (relative to the output directory), ``seed``, ``epoch``, ``score`` and how it was chosen, or
        ``error`` when that seed's weights could not be saved."""
        if not self.enabled:
            return None
        record = self._tasks.pop(task)
        seed = self.seed if self.seed is not None else median_seed(record.scores)
        how = (f"save_seed {seed}" if self.seed is not None
               else f"median of {len(record.scores)} seed(s) by {metric} (the lower middle run for an even count)")
        entry = {"seed": seed, "epoch": record.epochs[seed], "score": record.scores[seed], "metric": metric,
                 "selected_by": how}
        target = self.root / task
        try:
            if seed in record.errors:
                return {**entry, "error": record.errors[seed]}
            _replace(self._staged(task, seed), target)
        finally:
            for other in record.scores:
                shutil.rmtree(self._staged(task, other), ignore_errors=True)
            _remove_if_empty(self.root / _STAGING)
        log.info(f"{task}: saved the model of seed {seed} (epoch {entry['epoch']}) as {target}")
        return {**entry, "path": f"{MODELS_DIR}/{task}"}


def conll_word_offsets(word_ids: list[int | None], offsets: list[tuple[int, int]],
                       tokens: list[str]) -> list[tuple[int, int]]:
    """``offset_mapping`` for transformers' token-classification pipeline (``is_split_into_words=True``) that makes
    its words CoNLL's whitespace-separated words, as our evaluation reads them (the first sub-token's label).

    The pipeline's ``aggregation_strategy="first"`` starts a new word at every token whose text is as long as the
    text its offsets cover, so a CoNLL word the tokenizer splits at punctuation (``U.S.`` is ``u . s .``) would be
    several words to it, each read at its own first piece. Every later piece of a CoNLL word is given a span one
    character longer to the left (still inside the word), which marks it a sub-word; first pieces keep their own.
    ``word_ids``, ``offsets`` and ``tokens`` are the fast tokenizer's encoding of the words (``word_ids()``,
    ``offset_mapping``, ``tokens()``), offsets relative to each word.
    """
    result, previous = [], None
    for word, (start, end), token in zip(word_ids, offsets, tokens):
        span = (start, end)
        if word is not None and word == previous and start > 0:  # a later piece of the same CoNLL word
            span = next(((left, end) for left in (start - 1, 0) if end - left != len(token)), span)
        result.append(span)
        previous = word
    return result


def _replace(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``, replacing an earlier ``target`` (a directory cannot be renamed over a
    non-empty one): a kill midway leaves the earlier directory or the new one at ``target.replaced``."""
    replaced = target.with_name(target.name + ".replaced")
    shutil.rmtree(replaced, ignore_errors=True)
    if target.exists():
        os.rename(target, replaced)
    os.rename(source, target)
    shutil.rmtree(replaced, ignore_errors=True)


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:  # not empty (another task's seeds) or already gone
        pass


__all__ = ["MODELS_DIR", "TaskModels", "check_tokenizer", "conll_word_offsets", "hf_config", "hf_state_dict",
           "median_seed", "save_task_model", "task_class"]
