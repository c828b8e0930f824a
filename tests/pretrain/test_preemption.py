"""Preemption within the launcher's grace (``faults.grace_seconds``, ``pretrain.preemption``): a step longer than
the grace is cut short at a micro-batch boundary and the last complete step saved; a second SIGTERM stops a rank at
once; a micro-batch that outlasts the grace ends the rank with one line and no checkpoint. The slow steps and the
signals come from ``tests/pretrain/slow_steps.py``; what is checked is the work done (micro-batches finished,
checkpoints published), never how long it took."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from common import processes
from pretrain import checkpoints, loop
from tests.pretrain.launching import REPO, TINY, environment, free_port, launch, losses, settings

SLOW = str(pathlib.Path(__file__).with_name("slow_steps.py"))
STEPS = 4
# 2 ranks x micro-batches of 4 rows = 4 micro-batches a step; no checkpoint but the one the stop makes.
COMMON = {"train.global_batch_size": 32, "train.micro_batch_size": 4, "train.precision": "fp32",
          "checkpoint.every_steps": 0, "checkpoint.keep_last": 5}


def _slow_run(launcher: str, dataset, out, marks, *, seconds: float, slow_from: int, signal_at: str, ranks: str,
              grace: float, timeout: float = 240) -> subprocess.CompletedProcess:
    args = [SLOW, "--config", TINY, *settings(dataset, out, steps=STEPS, **COMMON, **{"faults.grace_seconds": grace})]
    if launcher == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(free_port()), *args]
    else:
        argv = [sys.executable, *args]
    marks.mkdir(parents=True, exist_ok=True)
    env = environment(SLOW_SECONDS=str(seconds), SLOW_FROM=str(slow_from),
                      SIGNAL_AT=signal_at, SIGNAL_RANKS=ranks,
                      MARKS=str(marks))
    return processes.run(argv, cwd=REPO, env=env, text=True, timeout=timeout, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)


def _finished(marks: pathlib.Path) -> set[str]:
    return {p.name for p in marks.iterdir()}


@pytest.mark.exclusive  # the grace is a wall-clock budget: a loaded machine could spend it before the first boundary
def test_a_step_longer_than_the_grace_is_cut_short_and_the_last_complete_step_saved(sample_dataset, tmp_path):
    """Steps 2 on take 4 micro-batches of 1.5 s, against a grace of 4 s; SIGTERM reaches rank 1 alone as step 3
    begins. Both ranks stop after its first micro-batch, save step 2 (the last complete one), write summary.json
    and exit 75; the resumed run repeats an uninterrupted run's losses bit for bit (dropout on: the random states
    are those of step 3's start)."""
    stopped, marks = tmp_path / "stopped", tmp_path / "marks"
    result = _slow_run("torchrun", sample_dataset, stopped, marks, seconds=1.5, slow_from=2, signal_at="3:0:1", ranks="1",
                       grace=4)
    output = result.stdout
    assert "exitcode: 75" in output or result.returncode == 75, output[-3000:]
    assert "step 3 cannot end and be saved within faults.grace_seconds=4" in output, output[-3000:]
    assert "discarding its 1 of 4 micro-batches done, saving step 2, the last complete one" in output
    # Every rank stopped at the same boundary: one micro-batch of step 3 each, none after.
    assert {m for m in _finished(marks) if "step3" in m} == {"rank0-step3-micro0", "rank1-step3-micro0"}
    assert [c.step for c in checkpoints.complete(stopped / "checkpoints")] == [2]
    assert sorted(p.name for p in (stopped / "checkpoints").glob("step_*")) == ["step_00000002"]
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["step"] == 2 and summary["consumed_samples"] == 64

    full = tmp_path / "full"
    args = settings(sample_dataset, full, steps=STEPS, **COMMON)
    assert launch("torchrun", 2, args).returncode == 0
    resumed = launch("torchrun", 2, ["--resume", *settings(sample_dataset, stopped, steps=STEPS, **COMMON)])
    assert resumed.returncode == 0 and "at step 2 (64 samples consumed)" in resumed.stdout, resumed.stdout[-3000:]
    want, got = losses(full), losses(stopped)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert all(got[step] == want[step] for step in got), (got, want)


def test_a_second_sigterm_stops_the_rank_at_once_saving_nothing(sample_dataset, tmp_path):
    """Two SIGTERMs as step 2's first micro-batch starts, which would then take 10 minutes: the rank ends inside it
    (the micro-batch never finishes), with status 143 and one line, and no checkpoint, whole or partial, exists."""
    out, marks = tmp_path / "run", tmp_path / "marks"
    result = _slow_run("python", sample_dataset, out, marks, seconds=600, slow_from=2, signal_at="2:0:2", ranks="0", grace=0)
    assert result.returncode == loop.STOPPED, result.stdout[-3000:]
    assert "a second SIGTERM: stopping at once, saving nothing (exit 143)" in result.stdout
    assert _finished(marks) == {f"rank0-step1-micro{m}" for m in range(8)}  # step 2's first never ended
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    assert not (out / "summary.json").exists()


@pytest.mark.exclusive  # as above: the grace is measured by the wall clock
def test_a_micro_batch_longer_than_the_grace_ends_the_rank_without_a_checkpoint_in_one_line(sample_dataset,
                                                                                             tmp_path):
    """The stop comes as a micro-batch of 10 minutes begins, with a grace of 3 s: no boundary is reachable, so the
    rank says so and exits 124 before the launcher's SIGKILL would have come."""
    out, marks = tmp_path / "run", tmp_path / "marks"
    result = _slow_run("python", sample_dataset, out, marks, seconds=600, slow_from=2, signal_at="2:0:1", ranks="0", grace=3)
    assert result.returncode == loop.OUT_OF_GRACE, result.stdout[-3000:]
    lines = [line for line in result.stdout.splitlines() if "no checkpoint could begin" in line]
    assert len(lines) == 1 and "faults.grace_seconds=3" in lines[0] and "exit 124" in lines[0], result.stdout[-3000:]
    assert _finished(marks) == {f"rank0-step1-micro{m}" for m in range(8)}
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


_PUBLISH_KILLED = """
    import os, pathlib, signal, sys
    from pretrain import checkpoints
    from pretrain.preemption import StopFlag

    step = pathlib.Path(sys.argv[1]) / "step_00000002"
    original = checkpoints.sha256

    def sha256(file):  # the second SIGTERM comes while rank 0 hashes the files for the marker
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # the watcher ends the process from its thread; nothing after this runs
        return original(file)

    checkpoints.sha256 = sha256
    StopFlag(30).install()
    checkpoints.publish(step.parent, step.name, {"step": 2})
    print("published")
"""


def test_a_second_sigterm_during_a_publish_leaves_the_checkpoint_unmarked_never_half_written(tmp_path):
    step = tmp_path / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    (step / "model_states.pt").write_bytes(os.urandom(1 << 16))
    result = processes.run([sys.executable, "-c", textwrap.dedent(_PUBLISH_KILLED), str(tmp_path / "checkpoints")],
                           cwd=REPO, env=environment(), capture_output=True, text=True, timeout=120)
    assert result.returncode == loop.STOPPED and "published" not in result.stdout, result.stderr[-2000:]
    assert sorted(p.name for p in step.iterdir()) == ["model_states.pt"]  # no marker, not even a partial one
    assert checkpoints.complete(tmp_path / "checkpoints") == []
    shutil.rmtree(tmp_path / "checkpoints")


def test_a_grace_below_zero_is_refused_in_one_line():
    from common.configlib import ConfigError
    from pretrain import config

    with pytest.raises((ConfigError, ValueError), match="faults.grace_seconds must be >= 0"):
        config.load(TINY, ["faults.grace_seconds=-1", "data.path=x"])
