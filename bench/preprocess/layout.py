"""The instance stage at the full corpus's number of key-range groups, emulated on the 8× input.

    python -m bench.preprocess.layout --against REF [--copies 8] [--pairs 2] [--full-rows 200000000]

A run's key-range groups hold about ``preprocess.stages.index.ROWS_PER_GROUP`` rows each, so their number follows
from its rows: some 64 on the 8× input (795 k rows), 16 k on full Wikipedia + BooksCorpus (~200 M rows). A cost
that grows with a part's rows times the number of groups stays hidden on the benchmark's inputs. This benchmark
divides the rows per group by (full rows ÷ the input's rows), so a run on the 8× input has the full corpus's group
count, and runs it in one part with one worker, in this tree and in REF's (a git commit, exported as
``bench.preprocess.compare`` exports it), alternating, plus one run of this tree at the real size. Recorded: each
run's CPU, wall time, peak RSS, group bits and shard checksums.

Units (``ROWS_PER_UNIT`` instances each) are left at their size: what a unit holds and sends per element does not
depend on the corpus, only their number does, and shrinking them to reach the full corpus's count would make
every unit smaller than a flush, which no real run has. Their number is bounded where it matters by
``preprocess.layout.JOIN_RANGE_BITS``. The size is patched into the child's ``preprocess.stages.index`` before it
runs the CLI (``EMULATE``): a benchmark device, not a setting of the pipeline. Adds ``full_scale_layout`` to
``comparisons`` in ``bench/results/preprocess-<machine>.json``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench import record
from bench.preprocess.compare import pair_order, reference_tree
from bench.preprocess.inputs import describe_inputs, make_copies, prepare_tokenizer, real_inputs
from bench.preprocess.runs import QUIET_WAIT, Setting, mib, run_pipeline

FULL_ROWS = 200_000_000  # phase-1 rows of full Wikipedia + BooksCorpus (docs/benchmarks.md, the estimate)
# Run in the measured child, in the tree under test: the rows per group divided by argv[1], then the CLI.
EMULATE = ("import sys\n"
           "from preprocess import cli\n"
           "from preprocess.stages import index\n"
           "index.ROWS_PER_GROUP = max(1, round(index.ROWS_PER_GROUP / float(sys.argv[1])))\n"
           "sys.exit(cli.main(sys.argv[2:]))\n")
MEASURED = ("cpu_s", "wall_s", "peak_tree_rss_bytes", "instances", "layout", "shard_sha256", "contended")


def emulated_launcher(scale: float) -> list[str]:
    """The command that starts ``python -m preprocess`` with the rows per key-range group divided by ``scale``."""
    return [sys.executable, "-c", EMULATE, str(scale)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.layout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="git commit (or directory) of the reference tree")
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--full-rows", type=int, default=FULL_ROWS)
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--work", type=Path, default=record.WORK / "preprocess")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT)
    args = parser.parse_args(argv)
    work = args.work.resolve()
    begun = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - begun:6.1f}s] {message}", flush=True)

    shared = real_inputs(args.data)
    tokenizer, _ = prepare_tokenizer(shared, work)
    setting = Setting(make_copies(shared, work, args.copies), tokenizer, work, args.quiet_wait)
    one_worker = ["--direct_num_workers", "1"]
    real = run_pipeline(setting, work / "out" / "layout-real", one_worker, setting.logs / "layout-real.log")
    scale = args.full_rows / real["instances"]
    say(f"real sizes: {real['cpu_s']:.1f} CPU-s, peak {mib(real['peak_tree_rss_bytes'])} MiB, "
        f"{real['instances']:,} rows; emulating the groups of {args.full_rows:,} rows (rows per group / {scale:.0f})")
    tree, described = reference_tree(args.against, work)
    pairs = []
    for i in range(args.pairs):
        pair = {}
        for name, where in pair_order(i, tree):
            run = run_pipeline(setting, work / "out" / f"layout-{name}", one_worker,
                               setting.logs / f"layout-{name}-{i}.log", tree=where, launcher=emulated_launcher(scale))
            pair[name] = {key: run[key] for key in MEASURED}
            say(f"pair {i + 1}, {name}: {run['cpu_s']:.1f} CPU-s, {run['wall_s']:.1f} s, "
                f"peak {mib(run['peak_tree_rss_bytes'])} MiB")
        pairs.append(pair)
    medians = {name: {key: round(statistics.median(p[name][key] for p in pairs), 3)
                      for key in ("cpu_s", "wall_s", "peak_tree_rss_bytes")} for name in ("reference", "this_tree")}
    checksums = {tuple(p[name]["shard_sha256"]) for p in pairs for name in p}
    out = {
        "reference": described, "pairs": args.pairs, "date": record.utc_now(), "command": record.command_line(),
        "input_bytes": describe_inputs(setting.inputs)["bytes"], "full_rows": args.full_rows,
        "rows_per_group_divisor": round(scale, 1), "real_layout": real["layout"],
        "emulated_layout": pairs[0]["this_tree"]["layout"],
        "real_sizes_this_tree": {key: real[key] for key in MEASURED},
        "emulated": medians,
        "cpu_s_change": round(medians["this_tree"]["cpu_s"] / medians["reference"]["cpu_s"] - 1, 3),
        "peak_change": round(medians["this_tree"]["peak_tree_rss_bytes"]
                             / medians["reference"]["peak_tree_rss_bytes"] - 1, 3),
        "peak_over_real_sizes": round(medians["this_tree"]["peak_tree_rss_bytes"]
                                      / real["peak_tree_rss_bytes"], 3),
        "shards_identical_between_trees": len(checksums) == 1,
        "runs": pairs,
        "versions": record.versions(record.DISTRIBUTIONS["preprocess"], ("preprocess",)),
    }
    say(f"full-scale group count: reference {medians['reference']['cpu_s']:.1f} CPU-s, "
        f"{mib(medians['reference']['peak_tree_rss_bytes'])} MiB; this tree {medians['this_tree']['cpu_s']:.1f} "
        f"CPU-s, {mib(medians['this_tree']['peak_tree_rss_bytes'])} MiB; shards identical: "
        f"{out['shards_identical_between_trees']}")
    record.add_comparison(args.results, "preprocess", "full_scale_layout", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
