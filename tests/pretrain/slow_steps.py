"""``pretrain/run.py`` with slow micro-batches and stop signals sent at a chosen one: the preemption tests' run.

Launched in place of run.py (by torchrun or plain python), it reads, from the environment:
``SLOW_SECONDS`` (each micro-batch of step ``SLOW_FROM`` and later sleeps this long after its work, so that a step
outlasts the grace), ``SIGNAL_AT`` ("STEP:MICRO:COUNT": that many SIGTERMs to itself just before micro-batch MICRO
of STEP, 1-based steps, on the ranks in ``SIGNAL_RANKS``) and ``MARKS`` (a directory where every finished micro-batch
leaves a file ``rankR-stepS-microM``: the work done, counted).
"""
import os
import pathlib
import runpy
import signal
import sys
import time

RUN = str(pathlib.Path(__file__).resolve().parents[2] / "pretrain" / "run.py")


def _patch() -> None:
    from pretrain import engine

    seconds, slow_from = float(os.environ.get("SLOW_SECONDS", "0")), int(os.environ.get("SLOW_FROM", "1"))
    target = tuple(int(v) for v in os.environ["SIGNAL_AT"].split(":")) if os.environ.get("SIGNAL_AT") else None
    rank = int(os.environ.get("RANK", "0"))
    signalled = rank in {int(r) for r in os.environ.get("SIGNAL_RANKS", "0").split(",")}
    marks = os.environ.get("MARKS")
    original, calls = engine.train_micro_batch, [0]

    def train_micro_batch(ds_engine, batch):
        accumulation = ds_engine.gradient_accumulation_steps()
        step, micro = calls[0] // accumulation + 1, calls[0] % accumulation
        calls[0] += 1
        if target is not None and signalled and (step, micro) == target[:2]:
            for _ in range(target[2]):
                os.kill(os.getpid(), signal.SIGTERM)
        stats = original(ds_engine, batch)
        if step >= slow_from:
            time.sleep(seconds)
        if marks:
            pathlib.Path(marks, f"rank{rank}-step{step}-micro{micro}").touch()
        return stats

    engine.train_micro_batch = train_micro_batch  # pretrain.engine.Engine calls it through the module


if __name__ == "__main__":
    _patch()
    sys.argv = [RUN, *sys.argv[1:]]
    runpy.run_path(RUN, run_name="__main__")
