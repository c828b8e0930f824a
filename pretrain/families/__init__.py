"""What a pretraining run needs to know about the model it trains: one ``Family`` per kind of model.

``pretrain.train`` builds, wraps, exports and counts FLOPs through ``for_config(cfg)`` only, and ``pretrain.loop``
reads its statistics through it, so BERT, ALBERT, ELECTRA and a distilled BERT share one loop, one engine, one
checkpoint format and one resume path. A family's statistics vector always holds ``REQUIRED_STATS`` (what the loop
itself reads: throughput, the masked share behind the FLOPs, the non-finite check); the rest is its own, and its
``summary`` turns sums over steps and ranks into the logged ratios (exact ratios of sums, never means of means).

Nothing here imports DeepSpeed or torch.distributed: a family's loss module is a plain ``nn.Module`` whose forward takes
the loader's micro-batch (plus ``micro_batch_inputs``) and returns (loss to back-propagate, detached statistics).
"""
from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

REQUIRED_STATS = ("mlm_tokens", "sequences", "tokens", "nonfinite_losses")


class Family:
    """The interface; ``pretrain.families.bert.BertFamily`` is the reference implementation."""

    name: str = ""
    stat_names: tuple[str, ...] = ()
    architecture: str = ""  # what the Hugging Face export is, for the log line (e.g. "BertForPreTraining")

    @classmethod
    def from_config(cls, cfg) -> Family:
        """The family with the sections of a ``PretrainConfig`` its constructor takes (the model's, ...)."""
        raise NotImplementedError

    def new_model(self, *, vocab_size: int, pad_token_id: int) -> nn.Module:
        """A freshly initialised model of the run's preset for a vocabulary of ``vocab_size`` ids (already rounded)."""
        raise NotImplementedError

    def load_model(self, directory: Path) -> tuple[nn.Module, list[str]]:
        """``model.init_from``: the model with the directory's weights and the names of freshly initialised ones."""
        raise NotImplementedError

    def positions(self, model: nn.Module) -> int:
        """The longest row the model embeds (``max_position_embeddings``), checked against the dataset."""
        raise NotImplementedError

    def vocab_size(self, model: nn.Module) -> int:
        raise NotImplementedError

    def set_activation_checkpointing(self, model: nn.Module, enabled: bool) -> None:
        raise NotImplementedError

    def loss_module(self, model: nn.Module) -> nn.Module:
        """The module DeepSpeed wraps; ``forward(**micro_batch, **micro_batch_inputs(...))`` -> (loss, stats). Only
        its parameters are trained and checkpointed (a teacher is kept outside them)."""
        raise NotImplementedError

    def loss_parameters(self, model_config) -> int:
        """Trainable parameters of ``loss_module`` beyond the model of ``model_config`` (a training head, a
        projection), trained and held in ZeRO's states like the model's: counted by the memory plan."""
        return 0

    def micro_batch_inputs(self, *, step: int, micro: int, rank: int) -> dict[str, Any]:
        """Inputs beyond the loader's for micro-batch ``micro`` of (0-based) optimizer step ``step`` on ``rank``:
        e.g. ELECTRA's sampling seed, a stable function of the run's seed and these, so a resumed run draws what
        the uninterrupted one did."""
        return {}

    def summary(self, stats: torch.Tensor) -> dict[str, float]:
        """The logged ratios of a statistics vector summed over steps and ranks: ``loss`` first."""
        raise NotImplementedError

    # Evaluation (``pretrain.evaluation``): the loss module's forward in eval mode on held-out micro-batches.
    evaluation_scores: bool = False  # the forward, given ``evaluation_inputs``, returns (loss, stats, scores) too

    def evaluation_inputs(self, index: int) -> dict[str, Any]:
        """Inputs beyond the micro-batch for evaluation micro-batch ``index``: a stable function of ``index`` alone
        (never of the run's step, rank or RNG), so every run, world size and ``pretrain.evaluate`` scores alike."""
        return {}

    def evaluation_summary(self, stats: torch.Tensor, scores=None) -> dict[str, float]:
        """The evaluation's figures from its statistics summed over every micro-batch (and ``scores``, the per-token
        scores of every row in order, for a family with ``evaluation_scores``): ``summary``'s and the masked-LM
        perplexity, exp of the token-mean masked-LM loss."""
        record = self.summary(stats)
        record["mlm_perplexity"] = math.exp(min(record["mlm_loss"], 700.0))  # exp(>709) overflows a double
        return record

    def evaluation_metrics(self) -> tuple[str, ...]:
        """The names ``evaluation_summary`` reports (what ``eval.target`` and ``checkpoint.keep_best`` may name)."""
        import numpy as np

        scores = np.array([[0.25, 0.0], [0.75, 1.0]]) if self.evaluation_scores else None
        return tuple(self.evaluation_summary(torch.ones(len(self.stat_names), dtype=torch.float64), scores))

    def flops_per_token(self, model: nn.Module, seq_len: int, masked_fraction: float) -> float:
        """Training FLOPs per real token of one step at padded width ``seq_len`` (every network the step runs:
        generator and discriminator, the teacher's forward, each application of a shared layer), for MFU."""
        raise NotImplementedError

    def export(self, model: nn.Module, directory: Path, tokenizer_dir: Path | None) -> None:
        """Write the Hugging Face directory of ``model`` (CPU, fp32, finite weights) through
        ``models.hf_io.write_export``."""
        raise NotImplementedError

    def model_from_state(self, state: dict[str, torch.Tensor], config=None) -> nn.Module:
        """A CPU model of ``config`` (default: the run's, as its config.yaml gives it) holding ``state`` (the
        loss module's parameters with the ``model.`` prefix removed, as the engine consolidates them); raises
        ``common.errors.CheckpointError`` if they do not fit."""
        raise NotImplementedError

    def frozen_weights(self) -> tuple[tuple[str, int, int], ...]:
        """Weights every rank holds outside DeepSpeed (never trained, checkpointed nor partitioned by ZeRO), for the
        memory plan: (what, parameters, bytes per parameter) each, e.g. a distillation run's teacher."""
        return ()

    def describe(self, model: nn.Module) -> str:
        """One phrase for the run's first log line, e.g. '110,106,428 parameters'."""
        return f"{sum(p.numel() for p in model.parameters()):,} parameters"


def for_config(cfg, run_directory: Path | None = None) -> Family:
    """The family of a ``PretrainConfig`` (``model.family``, with ``distillation.teacher`` set: a distilled BERT).

    With ``run_directory`` (reading a run's checkpoints back, as ``pretrain.export`` does) what the run recorded
    when it started wins over what the config points at: a distillation run's copy of its teacher's config, so the
    export works after the teacher has moved."""
    if cfg.distillation.teacher:
        from pretrain.families.distillation import DistillationFamily

        return DistillationFamily.from_config(cfg, recorded_in=run_directory)
    if cfg.objective.span_boundary:  # SpanBERT: BERT with the span-boundary objective in its loss (the config
        from pretrain.families.spanbert import SpanBertFamily  # allows it for the bert family only)

        return SpanBertFamily.from_config(cfg)
    # Each model family (models.registry) has its training glue in the module of its name here (``-`` as ``_``: the
    # family deberta-v2 in deberta_v2.py): its TRAINING class, which takes the config sections it uses
    # (``from_config`` picks them).
    from models.registry import module_name

    return importlib.import_module(f"pretrain.families.{module_name(cfg.model.family)}").TRAINING.from_config(cfg)


__all__ = ["REQUIRED_STATS", "Family", "for_config"]
