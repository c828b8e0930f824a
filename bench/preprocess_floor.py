"""The memory floor under any ``--max-memory`` budget, in a process of its own.

    python -m bench.preprocess_floor TOKENIZER

Imports the pipeline's modules as the CLI loads them, loads the tokenizer and runs one trivial in-memory Beam
pipeline (Create | Map | GroupByKey): what every part of a budgeted run holds before it holds any data.
``bench.preprocess_budget`` starts it as a child and records its peak RSS; it prints nothing.
"""
from __future__ import annotations

import argparse
import sys


def trivial_pipeline(tokenizer: str) -> object:
    """The pipeline's imports, its tokenizer and one trivial pipeline on the in-memory runner, in this process.
    Returns the tokenizer: it is held while the pipeline runs, as a part of a run holds it."""
    import apache_beam as beam

    from preprocess import cli

    cli.load_pipeline_modules()
    from common.tokenizer import load_tokenizer
    from preprocess.beamrun import beam_options, run_beam

    loaded = load_tokenizer(tokenizer)
    run_beam(beam_options(["--direct_num_workers", "1"]), lambda p, lot: (
        p | beam.Create(range(100)) | beam.Map(lambda x: (x % 7, x)) | beam.GroupByKey()), in_process=True)
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer", help="the tokenizer a run would load (a directory or a vocab.txt)")
    trivial_pipeline(parser.parse_args(argv).tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
