"""A stage's start-up imports and nothing else, in a process of their own: what every run pays before its work.

    python -m bench.stage_imports preprocess|pretrain

Benchmarks start it as a child and measure the whole process (the interpreter's start-up included) as they
measure a run: ``bench.preprocess.scale`` to put the driver's start-up beside a pipeline run's CPU, ``bench.pretrain.bert_large``
for the memory a training rank holds before it builds a model. Prints one JSON line: the CPU and wall time of
the imports themselves and the process's peak RSS (VmHWM) once they are done.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def preprocess_driver() -> None:
    """The driver of ``python -m preprocess run``: its CLI, then Beam and the pipeline modules, as the CLI loads them.
    The local pool forks its workers from the driver, so a run pays this once."""
    from preprocess import cli

    cli.load_pipeline_modules()
    import common.tokenizer  # noqa: F401
    import preprocess.stages.pairs  # noqa: F401


def pretrain_rank() -> None:
    """A training rank: torch, DeepSpeed and the training loop."""
    import deepspeed  # noqa: F401
    import torch  # noqa: F401

    import pretrain.train  # noqa: F401


STAGES = {"preprocess": preprocess_driver, "pretrain": pretrain_rank}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stage_imports", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=sorted(STAGES))
    args = parser.parse_args(argv)
    cpu, wall = time.process_time(), time.perf_counter()
    STAGES[args.stage]()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    # Read here, not with bench.processes.vm_hwm: that module's own imports (psutil, threading) would count too.
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))
    print(json.dumps({"stage": args.stage, "import_cpu_s": round(cpu, 3), "import_wall_s": round(wall, 3),
                      "peak_rss_bytes": peak}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
