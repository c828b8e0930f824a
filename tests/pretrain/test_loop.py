"""The training loop alone: a fake engine (AdamW on a tiny model; no DeepSpeed, no process group) fed by the real
loader over a small synthetic dataset. Logged statistics, checkpoint cadence, the stop flag and the skip rules."""
import json
import math
import os
import signal
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from models.bert.model import BertForPreTraining, preset
from pretrain import config, loop
from pretrain.data import PretrainingLoader, ShardedInstances
from pretrain.families.bert import BertFamily
from pretrain.families.bert_loss import STAT_NAMES, PretrainingLoss
from pretrain.monitor import Monitor
from pretrain.schedule import lr_at
from tests.pretrain.launching import TINY


@pytest.fixture(autouse=True)
def _info_logs(caplog):
    caplog.set_level("INFO", logger="pretrain")


@dataclass
class Step:
    """What the fake engine did in one optimizer step."""

    stats: torch.Tensor      # its micro-batches' statistics, summed
    lr: float
    grad_norm: float
    applied: bool


class FakeEngine:
    """``pretrain.loop.LoopEngine`` in one process: the optimizer steps after every ``accumulation`` micro-batches and,
    with ``overflow_check`` (as DeepSpeed's bf16 and fp16 optimizers), skips a step whose gradients are not finite."""

    device = torch.device("cpu")

    def __init__(self, model: BertForPreTraining, cfg: config.PretrainConfig, accumulation: int, *,
                 overflow_check: bool = True):
        peak = cfg.optimizer.lr
        self.objective = PretrainingLoss(model)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=peak)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                          lambda step: lr_at(step, peak, cfg.schedule) / peak)
        self.accumulation, self.overflow_check = accumulation, overflow_check
        self.steps: list[Step] = []
        self.reductions = 0
        self._micro_batches, self._stats = 0, torch.zeros(len(STAT_NAMES), dtype=torch.float64)

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def train_micro_batch(self, batch: dict) -> torch.Tensor:
        loss, stats = self.objective(**batch)
        (loss / self.accumulation).backward()
        self._micro_batches += 1
        self._stats += stats.double()
        if self._micro_batches % self.accumulation == 0:
            norm = float(torch.nn.utils.get_total_norm([p.grad for p in self.objective.parameters()]))
            applied = math.isfinite(norm) or not self.overflow_check
            self.steps.append(Step(self._stats, self.lr(), norm, applied))
            if applied:
                self.optimizer.step()
                self.schedule.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._stats = torch.zeros_like(self._stats)
        return stats

    def step_applied(self) -> bool:
        return self.steps[-1].applied

    def grad_norm(self) -> float:
        return self.steps[-1].grad_norm

    def loss_scale(self) -> float:
        return 1.0

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.reductions += 1  # the sum over one rank is the tensor itself


class Scripted:
    """The real loader, with a NaN loss scale on the ``poisoned`` steps (as a diverging batch gives) and SIGUSR1
    sent to this process while the batches of step ``signal_at`` are read (1-based steps)."""

    def __init__(self, loader: PretrainingLoader, poisoned=(), signal_at: int | None = None):
        self.loader, self.poisoned, self.signal_at, self.step = loader, set(poisoned), signal_at, 0

    def next_step(self) -> list[dict]:
        self.step += 1
        micro = self.loader.next_step()
        if self.step in self.poisoned:
            micro[0]["mlm_loss_scale"] = np.float32("nan")
        if self.step == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        return micro


@dataclass
class Outcome:
    status: int
    state: loop.LoopState
    engine: FakeEngine
    records: list[dict]
    saved: list[int]         # the steps save() was called at


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset(256, max_seq_length=32, max_predictions=5)


def _run(tmp_path, dataset, *, poisoned=(), signal_at=None, overflow_check=True, save=None, read_lag=0,
         **settings) -> Outcome:
    """Six steps of 2 micro-batches of 4 rows; a record and a checkpoint every 2 steps unless ``settings`` say."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    values = {"output_dir": tmp_path, "train.max_steps": 6, "schedule.total_steps": 6, "schedule.warmup_steps": 2,
              "train.global_batch_size": 8, "train.micro_batch_size": 4, "logging.log_every": 2,
              "logging.progress": "false", "checkpoint.every_steps": 2, **settings}
    cfg = config.load(TINY, [f"{key}={value}" for key, value in values.items()])
    plan = config.batch_plan(cfg.train, world_size=1)
    torch.manual_seed(0)
    model = BertForPreTraining(preset("tiny", vocab_size=30528, max_position_embeddings=32))
    engine = FakeEngine(model, cfg, plan.accumulation, overflow_check=overflow_check)
    loader = Scripted(PretrainingLoader(ShardedInstances(dataset), micro_batch=plan.micro_batch,
                                        accumulation=plan.accumulation, world_size=1, rank=0, seed=0),
                      poisoned, signal_at)
    state, saved = loop.LoopState(), []

    def record_save(at: loop.LoopState) -> None:
        saved.append(at.step)
        if save is not None:
            save(at)

    monitor = Monitor(tmp_path, total_steps=cfg.train.max_steps, start_step=0, progress=False)
    stop = loop.StopFlag().install()
    try:
        status = loop.train(state, engine, loader, monitor, settings=loop.LoopSettings.of(cfg), plan=plan,
                            family=BertFamily.from_config(cfg), model=model, stop=stop, save=record_save, read_lag=read_lag)
    finally:
        stop.restore()
        monitor.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return Outcome(status, state, engine, records, saved)


def _loss(stats: torch.Tensor) -> float:
    """The mean masked-token loss plus the mean next-sentence loss of summed statistics."""
    s = dict(zip(STAT_NAMES, stats.tolist()))
    assert s["pair_sequences"] == s["sequences"]  # NSP rows: every sequence trains the pair head
    return s["mlm_loss_sum"] / s["mlm_tokens"] + s["pair_loss_sum"] / s["sequences"]


def test_records_hold_each_windows_statistics_and_a_skipped_step_is_left_out(tmp_path, dataset, caplog):
    run = _run(tmp_path, dataset, poisoned={3})
    assert run.status == 0 and run.state == loop.LoopState(step=6, consumed=48, skipped=1)
    steps = run.engine.steps
    assert [s.applied for s in steps] == [True, True, False, True, True, True]
    assert [r["step"] for r in run.records] == [2, 4, 6]
    assert [r["skipped_steps"] for r in run.records] == [0, 1, 1]
    assert [r["consumed_samples"] for r in run.records] == [16, 32, 48]
    for record in run.records:
        step = record["step"]
        window = [s for s in steps[step - 2:step] if s.applied]  # step 3 is not in its window
        assert record["loss"] == pytest.approx(_loss(sum(s.stats for s in window)), rel=1e-12)
        # The rate the record's own step used (not the next step's), and the norm of its gradients.
        assert record["lr"] == steps[step - 1].lr and record["grad_norm"] == steps[step - 1].grad_norm
    assert all(math.isfinite(r["loss"]) for r in run.records)
    assert run.saved == [2, 4, 6] and run.engine.reductions == 6  # one all-reduce a step
    assert "step 3: non-finite loss or gradient; step skipped (1 in a row, 1 in all)" in caplog.text


def test_a_stop_signal_ends_the_loop_at_the_next_step_boundary_after_saving(tmp_path, dataset, caplog):
    before = signal.getsignal(signal.SIGUSR1)
    run = _run(tmp_path, dataset, signal_at=3)  # arrives while step 3 is under way: step 3 is finished first
    assert run.status == loop.PREEMPTED and run.state == loop.LoopState(step=3, consumed=24, skipped=0)
    assert len(run.engine.steps) == 3 and run.saved == [2, 3]
    assert "received SIGUSR1: saving at step 3 and exiting for requeue" in caplog.text
    assert signal.getsignal(signal.SIGUSR1) == before


def test_too_many_skipped_steps_in_a_row_end_the_run_as_diverged_without_saving_among_them(tmp_path, dataset,
                                                                                          caplog):
    run = _run(tmp_path, dataset, poisoned={3, 4, 5}, **{"faults.max_consecutive_skips": 3})
    assert run.status == loop.DIVERGED and run.state == loop.LoopState(step=5, consumed=40, skipped=3)
    assert run.saved == [2]  # step 4 fell in the run of skips: the newest checkpoint stays the good one
    assert "step 4: not checkpointing during a run of skipped steps" in caplog.text
    assert (f"3 consecutive steps had a non-finite loss or gradient (limit faults.max_consecutive_skips=3); "
            f"stopping. The last good checkpoint is kept in {tmp_path / 'checkpoints'}") in caplog.text


def test_without_an_overflow_check_the_first_non_finite_loss_ends_the_run(tmp_path, dataset, caplog):
    run = _run(tmp_path, dataset, poisoned={2}, overflow_check=False,
               **{"train.precision": "fp32", "checkpoint.every_steps": 1})
    assert run.status == loop.DIVERGED and run.state.step == 2 and run.saved == [1]
    assert "step 2: the loss is not finite and fp32 has no overflow check to skip the step" in caplog.text


def test_a_save_that_finds_non_finite_weights_ends_the_run_as_diverged(tmp_path, dataset, caplog):
    def refuse(state):
        if state.step == 4:
            raise loop.Diverged(f"step {state.step}: the weights hold NaN or inf")

    run = _run(tmp_path, dataset, save=refuse)
    assert run.status == loop.DIVERGED and run.state.step == 4 and run.saved == [2, 4]
    assert "step 4: the weights hold NaN or inf" in caplog.text


TIMED = ("tokens_per_second", "sequences_per_second", "mfu")  # wall-clock figures: the rest must be equal


def _untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in TIMED} for record in records]


def test_reading_each_step_once_the_next_is_queued_keeps_records_skips_and_checkpoints(tmp_path, dataset):
    """``read_lag=1`` (on a GPU: the host never waits for the step it just queued) logs, skips and saves as the
    step-by-step reading does."""
    now, late = (_run(tmp_path / f"lag{lag}", dataset, poisoned={3}, read_lag=lag) for lag in (0, 1))
    assert _untimed(late.records) == _untimed(now.records) and len(late.records) == 3
    assert late.saved == now.saved == [2, 4, 6] and late.state == now.state
    assert late.engine.reductions == now.engine.reductions == 6


def test_read_a_step_late_a_stop_or_a_divergence_is_acted_on_one_step_later(tmp_path, dataset, caplog):
    stopped = _run(tmp_path / "stop", dataset, signal_at=3, read_lag=1, **{"checkpoint.every_steps": 5})
    assert stopped.status == loop.PREEMPTED and stopped.state.step == 4 and stopped.saved == [4]
    assert "received SIGUSR1: saving at step 4 and exiting for requeue" in caplog.text
    diverged = _run(tmp_path / "diverged", dataset, poisoned={3, 4, 5}, read_lag=1,
                    **{"faults.max_consecutive_skips": 3})
    assert diverged.status == loop.DIVERGED and diverged.state.step == 6 and diverged.saved == [2]
    assert "3 consecutive steps had a non-finite loss or gradient" in caplog.text
