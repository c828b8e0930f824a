"""Evaluation on a dataset's held-out split: the figures, the checks before a run, and the in-run cadence.

The first ``eval.max_rows`` rows of the split (in its row order) are cut into evaluation micro-batches of
``eval.batch_size`` consecutive rows, padded as the loader pads (``pretrain.data.pad``) whatever the world size.
Whole micro-batches go to the ranks round-robin; each rank runs its family's loss module forward in eval mode without
gradients on its own, and ranks with fewer micro-batches run a dummy forward of micro-batch 0 (discarded) so that
every rank runs as many forwards (ZeRO 3 gathers the weights collectively). Each micro-batch's statistics are kept
apart, as a row of a (micro-batches, statistics) float64 table that the ranks all-reduce (each row has one non-zero
contributor, so the sum is exact) and that is then summed in micro-batch order: the figures are bitwise the same for
any world size, train micro-batch and ZeRO stage. Scores (ELECTRA's per-token discriminator probabilities) are
gathered per micro-batch and joined in order.

Evaluation leaves training bitwise unchanged: no optimizer, scaler or loader call; a family's sampling draws from seeds
of the micro-batch index alone (``Family.evaluation_inputs``); every random state the forward could touch is saved
before and restored after; train mode is restored. ``pretrain.evaluate`` scores any model with the same ``evaluate``.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from common.errors import ConfigError
from common.manifest import Manifest
from pretrain.config import CheckpointConfig, EvalConfig
from pretrain.data import ShardedInstances, open_evaluation, pad, read_rows
from pretrain.families import Family
from pretrain.loop import LoopState, to_device
from pretrain.monitor import Monitor

# What the split must share with the training data for its figures to mean the same (the masking excepted: the
# split's masks are always stored).
_RECIPE = ("kind", "sentence_objective", "mask_unit", "masked_lm_prob", "max_predictions_per_seq",
           "mask_token_fraction", "random_token_fraction")


class EvalEngine(Protocol):
    """What ``evaluate`` asks of an engine (``pretrain.engine.Engine`` in a run, ``LocalEngine`` in one process)."""

    device: torch.device
    rank: int
    world_size: int

    def evaluating(self) -> contextlib.AbstractContextManager: ...

    def forward(self, batch: dict) -> tuple: ...

    def all_reduce(self, tensor: torch.Tensor) -> None: ...

    def all_gather(self, value) -> list: ...


class LocalEngine:
    """One process, no DeepSpeed: ``module`` itself (``pretrain.evaluate``)."""

    rank, world_size = 0, 1

    def __init__(self, module: torch.nn.Module, device: torch.device | str = "cpu"):
        self.module, self.device = module.to(device), torch.device(device)

    @contextlib.contextmanager
    def evaluating(self):
        was = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.module.train(was)

    def forward(self, batch: dict) -> tuple:
        return self.module(**batch)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        pass

    def all_gather(self, value) -> list:
        return [value]


@dataclass(frozen=True)
class Layout:
    """How evaluation rows become a micro-batch: the run's padding, document attention and padding-free inputs."""

    pad_multiple: int = 8
    documents: bool = False
    padding_free: bool = False


def micro_batch_rows(rows: int, batch_size: int) -> list[np.ndarray]:
    """The rows of each evaluation micro-batch: ``batch_size`` consecutive rows, the last one shorter."""
    return [np.arange(start, min(start + batch_size, rows)) for start in range(0, rows, batch_size)]


def evaluation_batch(data: ShardedInstances, rows: np.ndarray, layout: Layout) -> dict:
    """Rows ``rows`` as the loader's micro-batch; the loss scales are 1 (the loss is not read, only the sums)."""
    batch = pad(read_rows(data, rows), data.pad_id, documents=layout.documents, multiple=layout.pad_multiple,
                limit=data.manifest.max_seq_length, padding_free=layout.padding_free)
    return {**batch, "mlm_loss_scale": np.float32(1.0), "token_loss_scale": np.float32(1.0)}


@contextlib.contextmanager
def _random_states_kept():
    """Every random state a forward could draw from, as it was: the training run's streams continue untouched."""
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def evaluate(engine: EvalEngine, family: Family, data: ShardedInstances, *, max_rows: int | None = None,
             batch_size: int = 32, layout: Layout = Layout()) -> dict[str, float]:
    """The figures of ``family``'s model behind ``engine`` on the first ``max_rows`` rows of ``data`` (all: None),
    every rank calling; the same numbers on every rank, whatever the world size (the module docstring)."""
    rows = len(data) if max_rows is None else min(max_rows, len(data))
    batches = micro_batch_rows(rows, batch_size)
    mine = list(range(engine.rank, len(batches), engine.world_size))
    forwards = -(-len(batches) // engine.world_size)
    table = torch.zeros(len(batches), len(family.stat_names), dtype=torch.float64)
    scores: dict[int, np.ndarray] = {}
    with _random_states_kept(), engine.evaluating():
        for k in range(forwards):
            index = mine[k] if k < len(mine) else None  # None: a dummy forward, its figures discarded
            batch = to_device(evaluation_batch(data, batches[index or 0], layout), engine.device)
            batch.update(family.evaluation_inputs(index or 0))
            outputs = engine.forward(batch)
            if index is not None:
                table[index] = outputs[1].detach().double().cpu()
                if family.evaluation_scores:
                    scores[index] = outputs[2].detach().double().cpu().numpy()
    summed = table.to(engine.device)
    engine.all_reduce(summed)
    stats = summed.cpu().sum(0)
    joined = None
    if family.evaluation_scores:
        parts = {index: part for gathered in engine.all_gather(scores) for index, part in gathered.items()}
        joined = np.concatenate([parts[i] for i in range(len(batches))]) if parts else np.zeros((0, 2))
    return {**family.evaluation_summary(stats, joined), "rows": rows}


def lower_is_better(metric: str) -> bool:
    """Losses and perplexities improve downwards; accuracies, AUC, agreement and recall upwards."""
    return metric == "loss" or metric.endswith(("_loss", "_perplexity"))


def meets(metric: str, value: float, goal: float) -> bool:
    return value <= goal if lower_is_better(metric) else value >= goal


def better(metric: str, value: float, than: float | None) -> bool:
    if than is None:
        return math.isfinite(value)
    return value < than if lower_is_better(metric) else value > than


def open_split(eval_cfg: EvalConfig, checkpoint: CheckpointConfig, family: Family, train: Manifest, *,
               data_path: str, verify: bool = False) -> ShardedInstances | None:
    """The split a run evaluates on (``eval.data``'s, else the training dataset's), or None (evaluation off), after
    every check a run makes before its first step; ``ConfigError`` naming the key and the fix otherwise."""
    reported = family.evaluation_metrics()
    named = {"eval.target": list(eval_cfg.target or {}),
             "checkpoint.keep_best": [checkpoint.keep_best] if checkpoint.keep_best else []}
    for key, names in named.items():
        unknown = [name for name in names if name not in reported]
        if unknown:
            raise ConfigError(f"{key} names {', '.join(unknown)}, which {family.name} does not report; choose among "
                              f"{', '.join(reported)}")
    source = eval_cfg.data or data_path
    split = open_evaluation(source, verify=verify)
    if split is None:
        # eval.every_steps, max_rows and batch_size only size an evaluation: without a split it is off (logged once
        # by open_evaluation), so a shipped config runs on a dataset written before the split existed. A target, a
        # best checkpoint or a named eval.data mean nothing without one.
        wanted = [key for key, value in (("eval.target", eval_cfg.target),
                                         ("checkpoint.keep_best", checkpoint.keep_best)) if value is not None]
        if wanted or eval_cfg.data:
            raise ConfigError(f"{wanted[0] if wanted else 'eval.data'} needs an evaluation split, but {source} has "
                              "none: preprocess with a heldout section (docs/preprocessing.md), or remove the key")
        return None
    check_split(split.manifest, train, source)
    if eval_cfg.max_rows is not None and eval_cfg.max_rows > len(split):
        raise ConfigError(f"eval.max_rows is {eval_cfg.max_rows} but the evaluation split of {source} has "
                          f"{len(split)} rows; set eval.max_rows to at most {len(split)}, or leave it unset")
    return split


def check_split(split: Manifest, train: Manifest, source: str) -> None:
    """The split was made with the training data's tokenizer, sequence length and recipe (masking aside)."""
    problems = []
    if split.tokenizer.vocab_sha256 != train.tokenizer.vocab_sha256:
        problems.append(f"another tokenizer (vocab sha256 {split.tokenizer.vocab_sha256[:12]}… against "
                        f"{train.tokenizer.vocab_sha256[:12]}…)")
    if split.max_seq_length != train.max_seq_length:
        problems.append(f"sequence length {split.max_seq_length} against {train.max_seq_length}")
    for name in _RECIPE:
        ours, theirs = getattr(split.objective, name), getattr(train.objective, name)
        if ours != theirs:
            problems.append(f"objective {name} {ours} against {theirs}")
    if problems:
        raise ConfigError(f"eval.data: the evaluation split of {source} was built with " + "; ".join(problems) +
                          f" of the training data {train.directory}; set eval.data to a dataset preprocessed with "
                          "the training data's tokenizer, sequence length and recipe, or leave it unset")


@dataclass
class Decision:
    """What the loop does after an evaluation: checkpoint this step (a new best), and end the run (the target)."""

    save: bool = False
    stop: bool = False


@dataclass
class RunEvaluation:
    """A run's evaluations: when (``due``), each one's outputs (the metrics log and TensorBoard under ``eval/``, rank
    0's log line), the target and the best; ``summary()`` for summary.json."""

    eval_cfg: EvalConfig
    keep_best: str | None
    engine: EvalEngine
    family: Family
    data: ShardedInstances
    layout: Layout
    monitor: Monitor
    max_steps: int
    best_value: float | None = None        # from the run's checkpoints on resume (``checkpoints.best``)
    started: float = field(default_factory=time.time)  # the first step's wall time, set by the run
    last: dict | None = None
    best: dict | None = None
    reached: dict | None = None

    @classmethod
    def of(cls, cfg, engine: EvalEngine, family: Family, split: ShardedInstances | None, layout: Layout,
           monitor: Monitor) -> RunEvaluation | None:
        """The evaluations of the run of ``cfg`` (None without a split); on resume the best so far is the best
        checkpoint's."""
        if split is None:
            return None
        from pathlib import Path

        from pretrain import checkpoints

        keep_best, best_value = cfg.checkpoint.keep_best, None
        found = checkpoints.best(Path(cfg.output_dir) / "checkpoints", keep_best) if keep_best else None
        if found is not None:
            best_value = float(found.info["evaluation"][keep_best])
        return cls(cfg.eval, keep_best, engine, family, split, layout, monitor, cfg.train.max_steps,
                   best_value=best_value)

    def due(self, step: int, last: bool) -> bool:
        every = self.eval_cfg.every_steps
        return last or bool(every and step % every == 0)

    def run(self, state: LoopState) -> Decision:
        began = time.perf_counter()
        figures = evaluate(self.engine, self.family, self.data, max_rows=self.eval_cfg.max_rows,
                           batch_size=self.eval_cfg.batch_size, layout=self.layout)
        seconds = time.perf_counter() - began
        self.last = {"step": state.step, **figures}
        self.monitor.record_evaluation({"step": state.step, **{f"eval/{k}": v for k, v in figures.items()},
                                        "eval/seconds": round(seconds, 3), "consumed_samples": state.consumed})
        self.monitor.info(f"eval step {state.step}: " + " | ".join(
            f"{k} {v:.4f}" for k, v in figures.items() if k != "rows") + f" ({figures['rows']} rows, {seconds:.1f} s)")
        decision = Decision()
        if self.keep_best and better(self.keep_best, figures[self.keep_best], self.best_value):
            self.best_value, self.best, decision.save = figures[self.keep_best], self.last, True
        target = self.eval_cfg.target
        if target and self.reached is None and all(meets(k, figures[k], v) for k, v in target.items()):
            self.reached = {"reached": True, **{k: figures[k] for k in target},
                            "wall_seconds_from_first_step": round(time.time() - self.started, 3),
                            "step": state.step, "samples": state.consumed, "tokens": state.tokens}
            decision.save = decision.stop = True  # a checkpoint, then the end of the run (the export)
            self.monitor.info(f"target reached at step {state.step}: " + ", ".join(
                f"{k} {figures[k]:.4f} {'<=' if lower_is_better(k) else '>='} {v:g}" for k, v in target.items()))
        return decision

    def checkpoint_info(self, step: int) -> dict:
        """What a checkpoint of ``step`` records of the evaluation taken at it (for ``checkpoint.keep_best``)."""
        if self.last is None or self.last["step"] != step:
            return {}
        return {"evaluation": {k: v for k, v in self.last.items() if k != "step"}}

    def summary(self) -> dict:
        out: dict = {"evaluation": {"last": self.last}}
        if self.keep_best:
            out["evaluation"]["best"] = self.best
        if self.eval_cfg.target:
            out["target"] = self.reached or {"reached": False, "goal": dict(self.eval_cfg.target)}
        return out

    def last_line(self) -> str:
        """The run's last log line's words on the target ('' without one)."""
        target = self.eval_cfg.target
        if not target:
            return ""
        if self.reached:
            return f"; target reached at step {self.reached['step']}"
        shown = self.last or {}
        return "; target not reached: " + ", ".join(
            f"{k} {shown[k]:.4f} (goal {v:g})" if k in shown else f"{k} not evaluated (goal {v:g})"
            for k, v in target.items())


__all__ = ["Decision", "EvalEngine", "Layout", "LocalEngine", "RunEvaluation", "better", "check_split", "evaluate",
           "evaluation_batch", "lower_is_better", "meets", "micro_batch_rows", "open_split"]
