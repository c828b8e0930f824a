"""The training loop: optimizer steps, the rules for non-finite steps, the metrics window, and when to
checkpoint or stop. ``pretrain.train`` sets the run up and hands the loop its state; the loop sees the engine
only through the small ``LoopEngine`` interface below (``pretrain.engine.Engine`` in a run, a fake in the tests),
never DeepSpeed or ``torch.distributed`` themselves.

Statuses: 0 done; ``PREEMPTED`` (75) saved after SIGUSR1/SIGTERM and wants a requeue; ``DIVERGED`` (3) too
many non-finite steps in a row, or weights that turned non-finite. A rank may also end without returning
(``pretrain.preemption``): ``STOPPED`` (143) on a second SIGTERM, ``OUT_OF_GRACE`` (124) when no checkpoint could
begin within ``faults.grace_seconds`` of a SIGTERM.
"""
from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from pretrain.config import BatchPlan, PretrainConfig
from pretrain.families import Family
from pretrain.monitor import Monitor, peak_tflops
from pretrain.preemption import OUT_OF_GRACE, STOPPED, StopFlag, key_of, probe, time_left

__all__ = ["PREEMPTED", "DIVERGED", "STOPPED", "OUT_OF_GRACE", "Diverged", "StopFlag", "LoopEngine", "LoopState",
           "LoopSettings", "Evaluation", "train", "to_device", "masked_fraction", "metrics"]

PREEMPTED, DIVERGED = 75, 3


class Diverged(RuntimeError):
    """Too many consecutive non-finite steps, or weights that hold NaN or inf."""


class LoopEngine(Protocol):
    """What the loop asks of an engine."""

    device: torch.device

    def lr(self) -> float:
        """The learning rate the next step uses."""

    def train_micro_batch(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Forward and backward of one micro-batch, and the optimizer step after the step's last one; the
        micro-batch's statistics (``Family.stat_names``)."""

    def step_applied(self) -> bool:
        """False when the last step was skipped for a non-finite loss or gradient."""

    def grad_norm(self) -> float:
        """The last step's gradient norm."""

    def loss_scale(self) -> float:
        """fp16's dynamic loss scale (1 otherwise)."""

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over all ranks, in place."""


@dataclass
class LoopState:
    """Where the run stands: what a checkpoint records and the summary reports. The loop advances it in place."""

    step: int = 0
    consumed: int = 0          # samples, over all ranks
    skipped: int = 0           # steps skipped as non-finite, in all
    # Real tokens of the steps read, over all ranks (a target's time to it): a tally beside the position, which
    # ``==`` compares alone.
    tokens: int = field(default=0, compare=False)


class Evaluation(Protocol):
    """The run's evaluations as the loop sees them (``pretrain.evaluation.RunEvaluation``)."""

    def due(self, step: int, last: bool) -> bool:
        """Whether the step just finished is evaluated."""

    def run(self, state: LoopState):
        """Evaluate (every rank); a decision with ``save`` (checkpoint this step) and ``stop`` (end the run)."""


@dataclass(frozen=True)
class LoopSettings:
    """What the loop reads of a run's config (``of``)."""

    max_steps: int                  # train.max_steps
    precision: str                  # train.precision, as resolved (named when a step diverges)
    log_every: int                  # logging.log_every
    save_every: int                 # checkpoint.every_steps (0: at the end and on a stop only)
    max_consecutive_skips: int      # faults.max_consecutive_skips
    peak_tflops: float | None       # logging.peak_tflops (None: the GPU's, when known)
    checkpoints: Path               # where the run keeps its checkpoints (named in messages)
    grace_seconds: float = 0.0      # faults.grace_seconds: SIGTERM's time (0: it waits for the step boundary)
    warning_seconds: float = 0.0    # faults.warning_seconds: SIGUSR1's time (0: it waits for the step boundary)

    @classmethod
    def of(cls, cfg: PretrainConfig) -> LoopSettings:
        return cls(max_steps=cfg.train.max_steps, precision=cfg.train.precision, log_every=cfg.logging.log_every,
                   save_every=cfg.checkpoint.every_steps, max_consecutive_skips=cfg.faults.max_consecutive_skips,
                   peak_tflops=cfg.logging.peak_tflops, checkpoints=Path(cfg.output_dir) / "checkpoints",
                   grace_seconds=cfg.faults.grace_seconds, warning_seconds=cfg.faults.warning_seconds)


def train(state: LoopState, engine: LoopEngine, loader, monitor: Monitor, *, settings: LoopSettings,
          plan: BatchPlan, family: Family, model: nn.Module, rank: int = 0, stop: StopFlag,
          save: Callable[[LoopState], None], read_lag: int = 0, evaluation: Evaluation | None = None) -> int:
    """Step until ``settings.max_steps``, a stop or an evaluation's reached target; the status (0, ``PREEMPTED`` or
    ``DIVERGED``).

    ``loader.next_step()`` gives this rank's micro-batches of the next step; ``family`` adds its inputs to each,
    reads the statistics and counts ``model``'s FLOPs; ``save(state)`` writes a checkpoint (every
    ``settings.save_every`` steps, at the end and on a stop) and may raise ``Diverged``.

    ``read_lag=1`` (a run on a GPU) reads each step's statistics only once the next step is queued on the device,
    so the host never waits on the step it just queued: the device stays busy while the host logs, checks and loads
    the next batches. The records, the skip rules and the checkpoints are the same; a non-finite step, or a stop
    signal, is acted on one step later (the statistics of a step that saves are read before it saves).

    ``evaluation`` (the dataset has a held-out split) runs after the steps it says are due, once every queued step
    is read, and before that step's checkpoint: it changes no state the loop or a checkpoint holds.
    """
    try:
        return _steps(state, engine, loader, monitor, settings=settings, plan=plan, family=family, model=model,
                      rank=rank, stop=stop, save=save, read_lag=read_lag, evaluation=evaluation)
    except Diverged as error:
        monitor.info(str(error))
        return DIVERGED


def to_device(micro_batch: dict, device: torch.device) -> dict:
    """A loader micro-batch on ``device``: its arrays copied there, the sizes it sends as Python ints (the
    padding-free path's) kept on the host."""
    return {k: v if isinstance(v, int) else torch.as_tensor(v).to(device, non_blocking=True)
            for k, v in micro_batch.items()}


@dataclass
class _Finished:
    """One optimizer step as queued: its statistics (summed over ranks, the stop flag last), still on the device."""

    step: int
    consumed: int
    reduced: torch.Tensor
    applied: bool
    lr: float
    width: int                 # the padded widths of its micro-batches, summed
    grad_norm: float | None    # read at log steps only
    loss_scale: float | None


class _Window:
    """What the loop reads from finished steps: the skip rules, the metrics window and the stop signal."""

    def __init__(self, monitor: Monitor, *, settings: LoopSettings, plan: BatchPlan, family: Family,
                 model: nn.Module, state: LoopState):
        self.settings, self.plan, self.family, self.model = settings, plan, family, model
        self.monitor, self.state = monitor, state
        self.names = family.stat_names
        self.peak = settings.peak_tflops or peak_tflops(
            torch.cuda.get_device_name() if torch.cuda.is_available() else None)
        self.sums = torch.zeros(len(self.names), dtype=torch.float64)
        self.started, self.width, self.steps, self.consecutive = time.time(), 0, 0, 0
        self.signalled = False
        # Rank 0's seconds for the last step read and for the last save: the same on every rank (they travel in
        # the step's all-reduce), so every rank takes the same mid-step decisions (``_Grace``).
        self.step_seconds = self.save_seconds = 0.0

    def read(self, done: _Finished) -> None:
        """Account ``done``: skip or diverge, add it to the window, log the window at a log step."""
        settings, names = self.settings, self.names
        reduced = done.reduced.cpu()
        stats, self.signalled = reduced[:-3], self.signalled or bool(reduced[-1] > 0)
        self.step_seconds, self.save_seconds = reduced[-3:-1].tolist()
        ckpt_dir = settings.checkpoints
        loss_value = self.family.summary(stats)["loss"]
        if not done.applied:
            self.state.skipped, self.consecutive = self.state.skipped + 1, self.consecutive + 1
            self.monitor.info(f"step {done.step}: non-finite loss or gradient; step skipped "
                              f"({self.consecutive} in a row, {self.state.skipped} in all)")
            if self.consecutive >= settings.max_consecutive_skips:
                raise Diverged(f"{self.consecutive} consecutive steps had a non-finite loss or gradient (limit "
                               f"faults.max_consecutive_skips={settings.max_consecutive_skips}); stopping. "
                               f"The last good checkpoint is kept in {ckpt_dir}: resume from it with a lower "
                               "learning rate, or fp16 -> bf16")
        elif stats[names.index("nonfinite_losses")] > 0 or not math.isfinite(loss_value):
            raise Diverged(f"step {done.step}: the loss is not finite and {settings.precision} has no overflow "
                           "check to skip the step; the weights are no longer usable. The last good checkpoint "
                           f"is kept in {ckpt_dir}: resume with bf16 or fp16, or a lower learning rate")
        else:
            self.consecutive = 0
            self.sums += stats
            self.steps += 1
        self.state.tokens += int(stats[names.index("tokens")])
        self.width += done.width
        self.monitor.step(loss_value)
        if self.steps and done.grad_norm is not None:
            elapsed = time.time() - self.started
            width = self.width / (self.steps * self.plan.accumulation)
            flops = self.family.flops_per_token(self.model, int(width), masked_fraction(self.sums, names))
            self.monitor.record(metrics(self.sums, self.family, step=done.step, lr=done.lr,
                                        grad_norm=done.grad_norm, loss_scale=done.loss_scale,
                                        skipped=self.state.skipped, elapsed=elapsed, consumed=done.consumed,
                                        flops_per_token=flops, peak_tflops=self.peak, world=self.plan.world_size),
                                line=True)
            self.sums.zero_()
            self.started, self.width, self.steps = time.time(), 0, 0


def _steps(state, engine, loader, monitor, *, settings, plan, family, model, rank, stop, save, read_lag,
           evaluation) -> int:
    device = engine.device
    window = _Window(monitor, settings=settings, plan=plan, family=family, model=model, state=state)
    grace = _Grace(settings.grace_seconds, settings.warning_seconds, plan.accumulation, read_lag, rank)
    # The stop flag and rank 0's timings are filled in place on the device (kernel arguments), not copied from the
    # host each step.
    flag = torch.zeros(1, dtype=torch.float64, device=device)
    timing = torch.zeros(2, dtype=torch.float64, device=device)
    queued: list[_Finished] = []
    while state.step < settings.max_steps:
        began = time.monotonic()
        grace.start_step(window)
        stats = torch.zeros(len(family.stat_names), dtype=torch.float64, device=device)
        lr = engine.lr()  # the rate this step uses
        width = 0
        for index, micro in enumerate(loader.next_step()):
            batch = to_device(micro, device)
            batch.update(family.micro_batch_inputs(step=state.step, micro=index, rank=rank))
            stats += engine.train_micro_batch(batch).double()
            width += micro["input_ids"].shape[1]
            if grace.abandons_after(index, engine, stop):
                while queued:  # what is saved was checked
                    window.read(queued.pop(0))
                monitor.info(grace.abandon_line(stop, state.step, index + 1))
                _save_on_stop(save, state, stop, grace, abandoned=True)
                return PREEMPTED
        applied = engine.step_applied()
        # One small all-reduce per step: the statistics, rank 0's timings and each rank's view of the stop signal.
        flag.fill_(float(stop.signal is not None))
        if rank == 0:
            timing[0].fill_(time.monotonic() - began)
            timing[1].fill_(grace.save_seconds)
        reduced = torch.cat([stats, timing, flag])
        engine.all_reduce(reduced)
        state.step += 1
        state.consumed += plan.global_batch
        step, last = state.step, state.step == settings.max_steps
        logs = step % settings.log_every == 0 or last
        queued.append(_Finished(step, state.consumed, reduced, applied, lr, width,
                                engine.grad_norm() if logs else None, engine.loss_scale() if logs else None))
        saves = last or bool(settings.save_every and step % settings.save_every == 0)
        evaluates = evaluation is not None and evaluation.due(step, last)
        # A step that saves or evaluates, or a stop seen in a step read here, reads every queued step first: what
        # is saved was checked.
        while len(queued) > (0 if saves or evaluates or window.signalled else read_lag):
            window.read(queued.pop(0))
        if window.signalled:
            name = signal.Signals(stop.signal).name if stop.signal else "a signal on another rank"
            monitor.info(f"received {name}: saving at step {step} and exiting for requeue")
            _save_on_stop(save, state, stop, grace)
            return PREEMPTED
        decision = evaluation.run(state) if evaluates else None
        saves = saves or bool(decision and decision.save)
        if saves:
            if window.consecutive:  # keep the last checkpoint from before the trouble as the newest
                monitor.info(f"step {step}: not checkpointing during a run of skipped steps")
            else:
                began_save = time.monotonic()
                save(state)
                grace.save_seconds = time.monotonic() - began_save
        if decision is not None and decision.stop:
            return 0
    return 0


def _save_on_stop(save, state: LoopState, stop: StopFlag, grace: _Grace, **how) -> None:
    stop.begin_save()  # the watcher's deadline no longer applies: let the save finish
    began = time.monotonic()
    save(state, **how)
    grace.save_seconds = time.monotonic() - began


class _Grace:
    """Whether a step can still end, and its checkpoint be saved, in the time a stop signal leaves: SIGTERM's
    ``faults.grace_seconds`` (the launcher's grace), SIGUSR1's ``faults.warning_seconds`` (Slurm's warning ahead of
    the time limit); a SIGTERM after a SIGUSR1 leaves its own grace, counted from the SIGTERM.

    A step whose time plus a save's stays within half of every known time is simply finished: a stop waits for its
    boundary. A longer one is probed after each micro-batch (but the last) by a small all-reduce
    (``pretrain.preemption.probe``): which signals any rank saw, and rank 0's seconds left. The probe, the step and
    save times read from the step all-reduce (``_Window``) are the same numbers on every rank, so every rank
    decides alike (``pretrain.preemption.time_left``): once a stop is seen, if the rest of the step and the save
    would end past what is left, the step is abandoned at this micro-batch boundary. The decision is taken once per
    signal: a step that a SIGUSR1 lets finish is probed on, since a SIGTERM may still come and leave less. Its
    gradients are never applied (DeepSpeed keeps them apart from the weights and the optimizer state until the
    step), and the save records the data position and random states from the step's start
    (``pretrain.preemption.StepStarts``): the checkpoint is the last finished step, and a resumed run replays the
    abandoned one exactly. The first step of a process is not timed yet, so it is never probed.

    With ``read_lag`` 1 (GPU) each probe is read one micro-batch after it was queued, so the host never waits on the
    micro-batch it just queued; the decision then falls one micro-batch later, alike on every rank.
    """

    def __init__(self, grace: float, warning: float, accumulation: int, lag: int, rank: int):
        self.grace, self.warning = grace, warning
        self.accumulation, self.lag, self.rank = accumulation, lag, rank
        self.save_seconds = 0.0  # this rank's last save (rank 0's is what every rank reads back)
        self.probing, self.pending, self.need, self.decided = False, [], 0.0, None
        self.step_seconds = self.agreed_save_seconds = 0.0

    def start_step(self, window: _Window) -> None:
        self.step_seconds, self.agreed_save_seconds = window.step_seconds, window.save_seconds
        known = [seconds for seconds in (self.grace, self.warning) if seconds > 0]
        self.probing = bool(known and self.accumulation - 1 > self.lag and self.step_seconds > 0
                            and self.step_seconds + self.agreed_save_seconds > min(known) / 2)
        self.pending, self.decided = [], None

    def abandons_after(self, index: int, engine: LoopEngine, stop: StopFlag) -> bool:
        """After micro-batch ``index``: whether every rank abandons the step here (a collective while probing)."""
        if not self.probing:
            return False
        last_probe = self.accumulation - 2
        if index + self.lag <= last_probe:
            summed = torch.tensor(probe(stop, self.rank), dtype=torch.float64, device=engine.device)
            engine.all_reduce(summed)
            self.pending.append(summed)
        if not self.lag <= index <= last_probe:
            return False
        return self.decide(index, self.pending.pop(0).tolist())

    def decide(self, index: int, summed: list[float]) -> bool:
        """The decision after micro-batch ``index`` from a probe summed over the ranks."""
        signum, left = time_left(summed, grace=self.grace, warning=self.warning)
        if signum is None or signum == self.decided:
            return False
        # Decided for this signal: abandon now, or finish and save at the boundary; after a SIGUSR1 a SIGTERM may
        # still come with less time, so the probes go on while a grace is known.
        self.decided = signum
        self.probing = signum == signal.SIGUSR1 and self.grace > 0
        left_micro = self.accumulation - (index + 1)
        self.need = left_micro * self.step_seconds / self.accumulation + self.agreed_save_seconds
        return self.need > left

    def abandon_line(self, stop: StopFlag, step: int, done: int) -> str:
        name = signal.Signals(self.decided).name
        where = "" if self.decided in stop.seen else " on another rank"
        seconds = self.grace if self.decided == signal.SIGTERM else self.warning
        return (f"received {name}{where}: step {step + 1} cannot end and be saved within {key_of(self.decided)}="
                f"{seconds:g} (about {self.need:.0f} s more); discarding its {done} of {self.accumulation} "
                f"micro-batches done, saving step {step}, the last complete one, and exiting for requeue")


def masked_fraction(stats: torch.Tensor, names: tuple[str, ...]) -> float:
    """The share of the real tokens the MLM head predicted (the recipe's rate, e.g. 0.15 or 0.3): its FLOPs."""
    s = dict(zip(names, stats.tolist()))
    return s["mlm_tokens"] / max(1.0, s["tokens"])


def metrics(window: torch.Tensor, family: Family, *, step, lr, grad_norm, loss_scale, skipped, elapsed, consumed,
            flops_per_token, peak_tflops, world) -> dict:
    """One metrics.jsonl record from the statistics summed over the window's applied steps: the family's ratios
    (``Family.summary``), then the step's settings and the throughput."""
    s = dict(zip(family.stat_names, window.tolist()))
    tokens_per_second = s["tokens"] / max(elapsed, 1e-9)
    mfu = tokens_per_second * flops_per_token / (peak_tflops * 1e12 * world) if peak_tflops else None
    return {"step": step, **family.summary(window), "lr": lr, "grad_norm": grad_norm, "loss_scale": loss_scale,
            "skipped_steps": skipped, "tokens_per_second": tokens_per_second,
            "sequences_per_second": s["sequences"] / max(elapsed, 1e-9), "mfu": mfu, "consumed_samples": consumed}
