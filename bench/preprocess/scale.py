"""Benchmark of the preprocessing stage (the Apache Beam job) on the real shared data, at scale.

    python -m bench.preprocess.scale [--quick] [--copies 8] [--reps 5] [--work DIR] [--data DIR] [--results DIR]
    python -m bench.preprocess.scale --against REF [--label NAME] [--pairs 3] [--extra='--parts 16']

By default the input is the shared data (the Wikipedia dump slice and the books) copied 8 times with distinct
document ids (``bench.preprocess.inputs``): about 56 MiB, where the interpreter's start-up and imports are a few
percent of a run. ``--quick``: the shared data once (about 2 minutes). Measured (``bench.preprocess.runs``):

1. Irreducible work: decompress + XML parse + wikitext/book cleaning + sentence split + tokenize, done standalone
   by ``python -m bench.preprocess.irreducible`` (no Beam) in a child process whose whole CPU is counted, as the pipeline's is.
2. End to end: ``python -m preprocess run`` with the phase-1 config in-memory (``--direct_num_workers 1``) and with
   two worker processes (``--direct_num_workers 2 --direct_running_mode multi_processing``): wall time, CPU of
   the whole process tree (``os.wait4``), peak RSS summed over the tree, shard checksums. Each repetition runs
   item 1 right before the two pipeline runs; the CPU ratio is the median of the repetitions' own ratios (this
   VM's speed drifts by up to 30 % within minutes). Also: corpus tokens per CPU-second, peak RSS per input
   byte, and the share of the run that is interpreter start-up and imports (``python -m bench.stage_imports
   preprocess``).
3. Memory budget (not with --quick; ``bench.preprocess.budget``): ``--max-memory`` a quarter of the in-memory
   run's peak; the peak must stay under it and the shards must be byte-identical. When the CLI refuses it, also
   the smallest budget it accepts, and the floor under any budget: the peak of a process that imports the
   pipeline, loads the tokenizer and runs one trivial in-memory Beam pipeline (``python -m bench.preprocess.floor``).
   Then the same at scale (``--scale-copies``, default 32 copies, about 230 MiB): the in-memory run without a budget
   and under a quarter of its peak.
4. Beam's DaskRunner (not with --quick; ``bench.preprocess.dask_runner``): a scheduler and 2 single-threaded workers on
   127.0.0.1, started for the run; CPU summed over scheduler, workers and driver; the shards must be byte-identical.

``--against REF`` measures instead paired runs (1 and 2 workers, alternating) of this tree and of REF (a git
commit or a directory holding ``preprocess/``, ``common/`` and ``configs/``), each with the ``--extra`` pipeline
arguments too, and adds them to the results file under ``comparisons.NAME``: how a change measured at scale
(``bench.preprocess.compare``).

Writes ``bench/results/preprocess-<machine>.json`` (``--results`` another directory) and prints a summary
(``bench.preprocess.report``). Run it alone on the machine (other processes' CPU during each run is recorded, and
contended runs are flagged).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from bench import record
from bench.preprocess.budget import budget_at_scale, budget_run, describe_budget
from bench.preprocess.compare import compare
from bench.preprocess.dask_runner import dask_run
from bench.preprocess.inputs import VOCAB_SIZE, describe_inputs, make_copies, prepare_tokenizer, real_inputs
from bench.preprocess.report import (
    BUDGETS,
    METHOD,
    all_pass,
    checks,
    describe_at_scale,
    describe_floor,
    end_to_end,
    irreducible_summary,
    print_summary,
    targets,
)
from bench.preprocess.runs import CONFIG, MODES, QUIET_WAIT, Setting, irreducible, mib, run_pipeline, startup_cost

MEASURED_CODE = ("preprocess/**/*.py", "configs/preprocess/*.yaml")   # a change mid-run is flagged
SEPARATE_SECTIONS = ("memory_calibration", "memory_stages", "profile_8x_workers_1")  # results not written here


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the shared data once; no budget or Dask run")
    parser.add_argument("--copies", type=int, help="copies of the shared data (default 8; 1 with --quick)")
    parser.add_argument("--scale-copies", type=int, default=32,
                        help="copies of the shared data for the memory budget at scale (default 32; 0: none)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of items 1-2 (default 5: this VM drifts)")
    parser.add_argument("--against", metavar="REF", help="only paired runs against REF (a commit or a directory)")
    parser.add_argument("--label", help="name of the --against comparison in the results (default: REF)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs per mode with --against (default 3)")
    parser.add_argument("--extra", default="", metavar="ARGS",
                        help="more pipeline arguments for every --against run, e.g. --extra='--parts 16'")
    parser.add_argument("--work", type=Path, default=record.WORK / "preprocess",
                        help="scratch dir (default bench/work/preprocess)")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA,
                        help="real data dir with wikipedia/ and books/ (default ../shared/data)")
    parser.add_argument("--results", type=Path, default=record.RESULTS,
                        help="directory of the results file (default bench/results)")
    parser.add_argument("--note", help="free text recorded in the results")
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT,
                        help="seconds to wait, before each timed run, for other processes to go quiet (default 10)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    copies = args.copies or (1 if args.quick else 8)
    work = args.work.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    begun = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - begun:6.1f}s] {message}", flush=True)

    machine = record.machine_info()
    source_at_start = record.source_digest(MEASURED_CODE)
    shared = real_inputs(args.data)
    tokenizer, tok_info = prepare_tokenizer(shared, work)
    setting = Setting(make_copies(shared, work, copies), tokenizer, work, args.quiet_wait)
    described = describe_inputs(setting.inputs)
    say(f"machine {machine['slug']}: {machine['cpu_model']}; input {copies}x: {described['file_count']} files, "
        f"{mib(described['bytes'])} MiB; tokenizer {'reused' if tok_info['reused'] else 'trained'}")
    out_file = record.results_file(args.results, "preprocess", machine)
    previous = json.loads(out_file.read_text()) if out_file.exists() else {}
    if args.against:
        return against(setting, args, copies, say)

    startup = startup_cost(setting.logs / "startup.log")
    say(f"start-up: driver imports {startup['driver_import_cpu_s']:.2f} CPU-s")
    irr_runs, runs = repetitions(setting, args.reps, say)
    irr = irreducible_summary(irr_runs)
    e2e = end_to_end(runs, irr_runs, described["bytes"], startup)
    w1, w2 = e2e["workers_1"], e2e["workers_2"]
    speedup = round(w1["wall_s"] / w2["wall_s"], 3)
    budget = dask = None
    if not args.quick:
        budget = budget_run(setting, {"peak_tree_rss_bytes": w1["peak_tree_rss_bytes"],
                                      "shard_sha256": runs["workers_1"][0]["shard_sha256"]})
        say("; ".join(describe_budget(name, budget[name]) for name in BUDGETS if name in budget))
        if "floor" in budget:
            say(describe_floor(budget))
        if args.scale_copies:
            scaled = Setting(make_copies(shared, work, args.scale_copies), tokenizer, work, args.quiet_wait)
            budget["at_scale"] = budget_at_scale(scaled, args.scale_copies)
            say(describe_at_scale(budget["at_scale"]))
        dask = dask_run(setting)
        dask["cpu_ratio_vs_irreducible"] = round(dask["cpu_s"] / irr["cpu_s"], 3)
        dask["shards_identical"] = dask["shard_sha256"] == runs["workers_1"][0]["shard_sha256"]
        say(f"dask: wall {dask['driver_wall_s']:.2f} s, CPU {dask['cpu_s']:.2f} s (ratio "
            f"{dask['cpu_ratio_vs_irreducible']:.2f}), identical {dask['shards_identical']}")

    found = checks(runs, irr, irr_runs, budget, dask)
    same_machine = previous.get("machine", {}).get("slug") == machine["slug"]
    first = runs["workers_1"][0]
    results = {
        "benchmark": "preprocess", "date": record.utc_now(), "mode": "quick" if args.quick else "large",
        "copies": copies, "repetitions": args.reps, "machine": machine,
        "versions": record.versions(record.DISTRIBUTIONS["preprocess"], ("preprocess", "configs")),
        "source_sha256": source_at_start,
        "source_changed_during_run": record.source_digest(MEASURED_CODE) != source_at_start,
        "note": args.note, "config": CONFIG,
        "tokenizer": {"kind": "sentencepiece", "vocab_size": VOCAB_SIZE, "lowercase": True, **tok_info},
        "input": described | {"copies": copies, "corpus_tokens": first["corpus_tokens"],
                              "documents_used": first["documents_used"], "instances": first["instances"]},
        "method": METHOD,
        "startup": startup, "irreducible": irr, "end_to_end": e2e,
        "scaling": {"speedup_wall_1_over_2_workers": speedup, "wall_1_worker_s": w1["wall_s"],
                    "wall_2_workers_s": w2["wall_s"]},
        "memory_budget": budget, "dask": dask, "checks": found, "targets": targets(e2e, speedup, args.quick),
        "all_checks_pass": all_pass(found),
        "comparisons": previous.get("comparisons", {}) if same_machine else {},
        # Measured separately (each says how), kept until measured again.
        **{key: previous[key] for key in SEPARATE_SECTIONS if key in previous and same_machine},
        "bench_wall_s": round(time.perf_counter() - begun, 1),
    }
    record.write_json(out_file, results)
    print_summary(results, out_file)
    return 0 if results["all_checks_pass"] else 1


def repetitions(setting: Setting, reps: int, say) -> tuple[list[dict], dict[str, list[dict]]]:
    """``reps`` times: the irreducible work, then the pipeline in each mode (a repetition's runs are paired)."""
    irr_runs: list[dict] = []
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for rep in range(reps):
        r = irreducible(setting, setting.logs / f"irreducible-{rep}.log")
        irr_runs.append(r)
        say(f"irreducible #{rep + 1}: {r['cpu_s']:.2f} CPU-s (work {r['work_cpu_s']:.2f}), "
            f"{r['corpus_tokens']:,} tokens")
        for mode, beam in MODES.items():
            r = run_pipeline(setting, setting.work / "out" / mode, beam, setting.logs / f"{mode}-{rep}.log")
            runs[mode].append(r)
            say(f"{mode} #{rep + 1}: wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s, peak tree RSS "
                f"{mib(r['peak_tree_rss_bytes'])} MiB; cpu check {r['cpu_accounting_check']}; "
                f"other load {r['foreign_load_cores']:.2f} cores")
    return irr_runs, runs


def against(setting: Setting, args: argparse.Namespace, copies: int, say) -> int:
    """``--against REF``: the paired comparison, added to the results file under ``comparisons.LABEL``."""
    label = args.label or args.against
    result = compare(setting, args.against, args.pairs, say, shlex.split(args.extra))
    result |= {"date": record.utc_now(), "copies": copies,
               "versions": record.versions(record.DISTRIBUTIONS["preprocess"], ("preprocess", "configs")),
               "note": args.note}
    record.add_comparison(args.results, "preprocess", label, result)
    for mode in MODES:
        say(f"{label}, {mode}: CPU {result[mode]['cpu_s_change']:+.1%}, wall {result[mode]['wall_s_change']:+.1%},"
            f" peak RSS {result[mode]['peak_tree_rss_bytes_change']:+.1%} (this tree against {args.against}); "
            f"shards identical: {result[mode]['shards_identical']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
