"""The memory floor under any ``--max-memory`` budget, in a process of its own.

    python -m bench.preprocess.floor TOKENIZER [--hide PACKAGE ...]

Imports the pipeline's modules as the CLI loads them, loads the tokenizer and runs one trivial in-memory Beam
pipeline (Create | Map | GroupByKey): what every part of a budgeted run holds before it holds any data.
``bench.preprocess.budget`` starts it as a child; it prints its peak RSS as one JSON line, the high-water mark of
this program's own memory (``VmHWM``): Linux's rusage of a process also counts, from before it started this
program, the memory of the process that started it, which in a large parent (a test run) hides the figure.

``--hide`` makes the named top-level packages fail to import, as if they were not installed: how much of the floor
the optional clients that Apache Beam imports whenever they are present (MongoDB, AWS, IPython) account for. This
is a measurement only; the pipeline itself never hides a module.
"""
from __future__ import annotations

import argparse
import importlib.abc
import json
import resource
import sys

# Imported by Apache Beam 2.77 only when installed (each import is guarded), and used by no run of the benchmark.
OPTIONAL_CLIENTS = ("pymongo", "bson", "boto3", "botocore", "s3transfer", "IPython")


class _Hidden(importlib.abc.MetaPathFinder):
    def __init__(self, packages: list[str]):
        self._packages = set(packages)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self._packages:
            raise ImportError(f"{name} is hidden by bench.preprocess.floor --hide")
        return None


def trivial_pipeline(tokenizer: str) -> object:
    """The pipeline's imports, its tokenizer and one trivial pipeline on the in-memory runner, in this process.
    Returns the tokenizer: it is held while the pipeline runs, as a part of a run holds it."""
    import apache_beam as beam

    from preprocess import cli

    cli.load_pipeline_modules()
    from common.tokenizer import load_tokenizer
    from preprocess.executors.beamrun import beam_options, run_beam

    loaded = load_tokenizer(tokenizer)
    run_beam(beam_options(["--direct_num_workers", "1"]), lambda p, lot: (
        p | beam.Create(range(100)) | beam.Map(lambda x: (x % 7, x)) | beam.GroupByKey()), in_process=True)
    return loaded


def own_peak_rss() -> int:
    """The high-water mark of this program's resident memory, in bytes (``ru_maxrss`` where /proc is missing)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer", help="the tokenizer a run would load (a directory or a vocab.txt)")
    parser.add_argument("--hide", nargs="*", default=[], metavar="PACKAGE",
                        help=f"top-level packages made to fail to import (e.g. {' '.join(OPTIONAL_CLIENTS)})")
    args = parser.parse_args(argv)
    if args.hide:
        sys.meta_path.insert(0, _Hidden(args.hide))
    trivial_pipeline(args.tokenizer)
    print(json.dumps({"peak_rss_bytes": own_peak_rss()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
