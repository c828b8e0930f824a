"""The stop decisions of ``pretrain.preemption`` and ``pretrain.loop._Grace`` in one process, on a clock the test
moves: which signal's time applies (SIGTERM: ``faults.grace_seconds``; SIGUSR1: ``faults.warning_seconds``), at
which micro-batch boundary every rank leaves a long step, and when the watcher would end a rank (124, 143). Nothing
here sleeps or measures time: the numbers are given, as a run's step and save times would be."""
import math
import signal
from types import SimpleNamespace

import pytest
import torch

from pretrain import config, loop
from pretrain.loop import _Grace
from pretrain.preemption import GRACE_SHARE, OUT_OF_GRACE, STOPPED, StopFlag, probe, time_left
from tests.pretrain.launching import TINY

TERM, USR1 = signal.SIGTERM, signal.SIGUSR1


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class OneRank:
    """An engine of one rank: the all-reduce of a single rank leaves the tensor as it is."""

    device = torch.device("cpu")

    def all_reduce(self, tensor):
        pass


def _run_step(grace: _Grace, stop: StopFlag, clock: Clock, *, micro_seconds: float, signals: dict) -> int | None:
    """One step of ``grace.accumulation`` micro-batches of ``micro_seconds`` each, starting at the clock's time;
    ``signals`` maps a time to the signal that arrives then. The micro-batch after which every rank leaves the
    step, or None when the step runs to its boundary."""
    start = clock.now
    for index in range(grace.accumulation):
        end = start + (index + 1) * micro_seconds
        for at, signum in sorted(signals.items()):
            if clock.now < at <= end:
                clock.now = at
                assert stop.on_signal(signum) is None  # the watcher lets the rank go on
        clock.now = end
        if grace.abandons_after(index, OneRank(), stop):
            return index
    return None


def _grace(stop: StopFlag, *, accumulation: int, micro_seconds: float, save_seconds: float) -> _Grace:
    grace = _Grace(stop.grace, stop.warning, accumulation, 0, 0)
    grace.start_step(SimpleNamespace(step_seconds=accumulation * micro_seconds, save_seconds=save_seconds))
    return grace


def test_sigusr1_with_no_warning_known_waits_for_the_step_boundary_and_never_ends_the_rank():
    """faults.warning_seconds 0 (unknown): the old behaviour. Steps of 4 x 40 s are probed (the 30 s grace is
    known), but a SIGUSR1 sets no time: the step runs to its boundary, and the watcher never gives up on it."""
    clock = Clock()
    stop = StopFlag(30, 0, clock=clock)
    grace = _grace(stop, accumulation=4, micro_seconds=40, save_seconds=10)
    assert grace.probing
    assert _run_step(grace, stop, clock, micro_seconds=40, signals={5: USR1}) is None
    assert stop.signal == USR1 and stop.left() == math.inf
    clock.now = 10_000
    assert stop.deadline_in() is None and stop.on_timeout() is None  # no exit 124, however long the step takes


def test_sigusr1_with_a_warning_stops_at_a_micro_batch_boundary_in_time_without_exit_124():
    """Slurm's warning 120 s ahead, micro-batches of 40 s, a save of 10 s, the default grace of 30 s. The grace
    applied to SIGUSR1 would end the rank with 124 after 27 s, before any boundary; the warning's time instead
    leaves the step after its first micro-batch (40 s in, 130 s of work left against 96 - 35 s) and the save
    begins long before the SIGTERM of the time limit."""
    clock = Clock()
    stop = StopFlag(30, 120, clock=clock)
    grace = _grace(stop, accumulation=4, micro_seconds=40, save_seconds=10)
    assert _run_step(grace, stop, clock, micro_seconds=40, signals={5: USR1}) == 0
    assert clock.now == 40 and grace.need == 3 * 40 + 10
    assert stop.deadline_in() is None and stop.on_timeout() is None  # a SIGUSR1 alone never exits 124
    assert "received SIGUSR1: step 3 cannot end and be saved within faults.warning_seconds=120" in \
        grace.abandon_line(stop, 2, 1)
    stop.begin_save()
    clock.now = 50  # saved, 70 s before the time limit's SIGTERM
    assert stop.deadline_in() is None


def test_a_step_that_fits_the_warning_is_not_probed_and_saves_at_its_boundary():
    clock = Clock()
    stop = StopFlag(0, 120, clock=clock)
    grace = _grace(stop, accumulation=4, micro_seconds=10, save_seconds=5)  # 45 s, within half of 120
    assert not grace.probing
    assert _run_step(grace, stop, clock, micro_seconds=10, signals={1: USR1}) is None


def test_a_sigterm_after_a_sigusr1_leaves_its_grace_counted_from_the_sigterm():
    """A SIGUSR1 with no warning known lets the step of 8 x 10 s run on; the SIGTERM at 42 s leaves 30 s from then:
    24 s to have saved, against 35 s of work left after micro-batch 4, so every rank leaves the step at 50 s, while
    the watcher would give up only at 42 + 27 s (counted from the SIGUSR1 it would already have, at 27 s)."""
    clock = Clock()
    stop = StopFlag(30, 0, clock=clock)
    grace = _grace(stop, accumulation=8, micro_seconds=10, save_seconds=5)
    assert _run_step(grace, stop, clock, micro_seconds=10, signals={1: USR1, 42: TERM}) == 4
    assert clock.now == 50 and grace.need == 3 * 10 + 5
    assert stop.deadline_in() == pytest.approx(42 + 0.9 * 30 - 50)
    assert "received SIGTERM: step 1 cannot end and be saved within faults.grace_seconds=30" in \
        grace.abandon_line(stop, 0, 5)
    clock.now = 42 + 28
    assert stop.on_timeout()[0] == OUT_OF_GRACE  # had no save begun, the watcher would end the rank now

    clock = Clock()
    stop = StopFlag(30, 120, clock=clock)
    stop.on_signal(USR1)
    clock.now = 100  # the warning's time is spent: the SIGTERM's grace replaces it
    stop.on_signal(TERM)
    assert stop.left() == pytest.approx(GRACE_SHARE * 30)
    assert stop.deadline_in() == pytest.approx(0.9 * 30)


def test_a_second_sigterm_still_ends_the_rank_with_143():
    for first in (USR1, TERM):
        stop = StopFlag(30, 120, clock=Clock())
        assert stop.on_signal(first) is None
        if first == USR1:
            assert stop.on_signal(TERM) is None
        stop.begin_save()  # even during the save that answers the stop
        status, line = stop.on_signal(TERM)
        assert status == STOPPED == loop.STOPPED and "a second SIGTERM: stopping at once" in line


def test_every_rank_reads_the_same_signal_and_time_from_the_probe():
    """Rank 0's clock and signals decide; a signal only another rank has seen came just now, with all its time."""
    grace, warning = 30.0, 120.0

    def summed(*flags):
        return [sum(values) for values in zip(*(probe(flag, rank) for rank, flag in enumerate(flags)))]

    clock = Clock()
    zero, one = StopFlag(grace, warning, clock=clock), StopFlag(grace, warning, rank=1, clock=clock)
    assert time_left(summed(zero, one), grace=grace, warning=warning) == (None, math.inf)
    one.note(USR1)
    assert time_left(summed(zero, one), grace=grace, warning=warning) == (USR1, GRACE_SHARE * warning)
    zero.note(USR1)
    clock.now = 20
    assert time_left(summed(zero, one), grace=grace, warning=warning) == (USR1, GRACE_SHARE * warning - 20)
    one.note(TERM)  # rank 0 has not seen it yet
    assert time_left(summed(zero, one), grace=grace, warning=warning) == (TERM, GRACE_SHARE * grace)
    zero.note(TERM)
    clock.now = 25
    assert time_left(summed(zero, one), grace=grace, warning=warning) == (TERM, GRACE_SHARE * grace - 5)
    assert time_left(summed(zero, one), grace=0, warning=0)[0] == TERM

    # Both ranks' _Grace take the same decision from the same numbers, whatever their own flags say.
    decisions = []
    for rank in (0, 1):
        decider = _Grace(grace, warning, 4, 0, rank)
        decider.start_step(SimpleNamespace(step_seconds=160, save_seconds=10))
        decisions.append((decider.decide(0, summed(zero, one)), decider.need, decider.decided))
    assert decisions[0] == decisions[1] == (True, 130, TERM)


def test_the_config_carries_both_times_to_the_stop_flag():
    cfg = config.load(TINY, ["faults.grace_seconds=25", "faults.warning_seconds=300", "data.path=x"])
    stop = StopFlag.of(cfg.faults, rank=3)
    assert (stop.grace, stop.warning, stop.rank) == (25, 300, 3)
    assert loop.LoopSettings.of(cfg).warning_seconds == 300
    assert config.load(TINY, ["data.path=x"]).faults.warning_seconds == 0  # unknown unless a launcher says


def test_a_warning_below_zero_is_refused_in_one_line():
    from common.configlib import ConfigError

    with pytest.raises((ConfigError, ValueError), match="faults.warning_seconds must be >= 0"):
        config.load(TINY, ["faults.warning_seconds=-1", "data.path=x"])
