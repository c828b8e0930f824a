"""The preprocessing benchmark's figures from its runs: medians, ratios, checks, targets, and the printed summary."""
from __future__ import annotations

import statistics
from pathlib import Path

from bench.preprocess.budget import describe_budget
from bench.preprocess.runs import MODES, median, mib
from bench.processes import SAMPLE_INTERVAL
from bench.record import shown

TARGETS = {
    "cpu_ratio_max": 1.3,          # end-to-end CPU (all processes) / irreducible CPU
    "scaling_speedup_min": 1.8,    # wall(1 worker) / wall(2 workers)
    "startup_share_max": 0.05,     # interpreter start-up and imports / the run's CPU (large input)
}
IRREDUCIBLE_FIGURES = ("cpu_s", "wall_s", "work_cpu_s", "startup_cpu_s", "read_cpu_s", "clean_split_cpu_s",
                       "tokenize_cpu_s")
BUDGETS = ("quarter", "smallest_accepted")

METHOD = {
    "irreducible": "python -m bench.preprocess.irreducible as a child process, measured like the pipeline (os.wait4 rusage): "
                   "interpreter, the imports the work needs, tokenizer load, read + clean + split + tokenize",
    "pipeline_cpu": "os.wait4 rusage of the `python -m preprocess run` child and every descendant it reaped",
    "peak_rss": f"max over psutil samples every {SAMPLE_INTERVAL} s of the summed RSS of the process tree "
                "(at least the largest process's ru_maxrss)",
    "cpu_ratio": "median over the repetitions of pipeline CPU / irreducible CPU of the same repetition",
    "startup_share": "CPU of `python -m bench.stage_imports preprocess`, importing the CLI and the pipeline modules "
                     "(median of 3) / the run's CPU; the local pool forks its workers from the driver, so it is paid "
                     "once",
    "budget": "--max-memory a quarter of the median peak of the in-memory (1 worker) runs, 1 worker; "
              "when refused, also the smallest budget the estimate accepts (one input file per part); at_scale: "
              "the same input copied --scale-copies times, one unbudgeted in-memory run and one under a quarter of "
              "its peak",
    "dask": "DaskRunner, `dask scheduler` and 2 `dask worker --nthreads 1` on 127.0.0.1 started for the run; "
            "CPU of scheduler, workers (nannies and their worker processes) and the driver's tree; contended when "
            "other processes beyond the cluster used more than bench.cpu.CONTENDED_LOAD cores during the run",
}


def irreducible_summary(irr_runs: list[dict]) -> dict:
    """The medians of the irreducible runs' figures, their counts (equal in every run) and the runs."""
    irr = {key: median(irr_runs, key) for key in IRREDUCIBLE_FIGURES}
    return irr | {"corpus_tokens": irr_runs[0]["corpus_tokens"], "documents": irr_runs[0]["documents"],
                  "runs": irr_runs}


def end_to_end(runs: dict[str, list[dict]], irr_runs: list[dict], input_bytes: int, startup: dict) -> dict:
    """Per mode: medians, the paired CPU ratio, tokens per CPU-second, peak RSS per input byte, start-up share."""
    e2e = {}
    for mode, rs in runs.items():
        quiet = [r for r in rs if not r["contended"]]   # other processes skew wall time far more than CPU time
        cpu, wall = median(quiet or rs, "cpu_s"), median(quiet or rs, "wall_s")
        pairs = [(r, i) for r, i in zip(rs, irr_runs) if not (r["contended"] or i["contended"])] \
            or list(zip(rs, irr_runs))
        peak = int(statistics.median(r["peak_tree_rss_bytes"] for r in rs))
        e2e[mode] = {
            "beam_args": MODES[mode], "wall_s": wall, "cpu_s": cpu,
            "medians_over": f"{len(quiet)} uncontended run(s)" if quiet else f"all {len(rs)} runs (all contended)",
            "cpu_ratio_vs_irreducible": round(statistics.median(r["cpu_s"] / i["cpu_s"] for r, i in pairs), 3),
            "cpu_ratio_vs_irreducible_runs": [round(r["cpu_s"] / i["cpu_s"], 3) for r, i in pairs],
            "cpu_ratio_vs_irreducible_work_only": round(statistics.median(r["cpu_s"] / i["work_cpu_s"]
                                                                          for r, i in pairs), 3),
            "corpus_tokens_per_cpu_s": round(rs[0]["corpus_tokens"] / cpu, 1),
            "corpus_tokens_per_wall_s": round(rs[0]["corpus_tokens"] / wall, 1),
            "peak_tree_rss_bytes": peak,
            "peak_rss_per_input_byte": round(peak / input_bytes, 2),
            "startup_share_of_cpu": round(startup["driver_import_cpu_s"] / cpu, 4),
            "runs": rs,
        }
    return e2e


def checks(runs: dict[str, list[dict]], irr: dict, irr_runs: list[dict], budget: dict | None,
           dask: dict | None) -> dict:
    """What must hold for the figures to stand: identical shards everywhere, equal token counts, complete CPU
    accounting, budgets kept; and which runs other processes contended with."""
    first = runs["workers_1"][0]
    found = {
        "shards_identical_1_vs_2_workers": len({tuple(r["shard_sha256"]) for rs in runs.values() for r in rs}) == 1,
        "shard_sha256": first["shard_sha256"],
        "irreducible_tokens_equal_pipeline_corpus_tokens": irr["corpus_tokens"] == first["corpus_tokens"],
        "cpu_accounting": sorted({r["cpu_accounting_check"] for rs in runs.values() for r in rs}),
        "contended_runs": [f"{mode} #{i + 1}" for mode, rs in runs.items() for i, r in enumerate(rs) if r["contended"]]
                          + [f"irreducible #{i + 1}" for i, r in enumerate(irr_runs) if r["contended"]],
    }
    for name in BUDGETS if budget else ():
        if name in budget:
            found[f"budget_{name}_under_budget"] = budget[name]["under_budget"]
            found[f"budget_{name}_shards_identical"] = budget[name]["shards_identical"]
    if budget and "at_scale" in budget:
        found["budget_at_scale_quarter_under_budget"] = budget["at_scale"]["quarter"]["under_budget"]
        found["budget_at_scale_quarter_shards_identical"] = budget["at_scale"]["quarter"]["shards_identical"]
    if dask:
        found["dask_shards_identical"] = dask["shards_identical"]
    return found


def all_pass(found: dict) -> bool:
    return all(v is not False for k, v in found.items() if k != "contended_runs") and found["cpu_accounting"] == ["ok"]


def targets(e2e: dict, speedup: float, quick: bool) -> dict:
    """Each target's value, bound and whether it is met (the start-up share only on the large input)."""
    w1, w2 = e2e["workers_1"], e2e["workers_2"]
    bounds = {
        "cpu_ratio_workers_1": (w1["cpu_ratio_vs_irreducible"], "<=", TARGETS["cpu_ratio_max"]),
        "cpu_ratio_workers_2": (w2["cpu_ratio_vs_irreducible"], "<=", TARGETS["cpu_ratio_max"]),
        "speedup_1_to_2_workers": (speedup, ">=", TARGETS["scaling_speedup_min"]),
        "startup_share_workers_1": (w1["startup_share_of_cpu"], "<=", TARGETS["startup_share_max"]),
    }
    if quick:
        bounds.pop("startup_share_workers_1")   # the 1x input is too small for start-up to be a small share
    return {name: {"value": v, "target": f"{op} {t}", "pass": v <= t if op == "<=" else v >= t}
            for name, (v, op, t) in bounds.items()}


def describe_floor(budget: dict) -> str:
    floor = budget["floor"]
    hidden = floor.get("optional_clients_hidden_peak_bytes")
    return (f"memory floor (imports, tokenizer, one trivial pipeline): {mib(floor['one_trivial_pipeline_peak_bytes'])} "
            f"MiB" + (f"; {mib(hidden)} MiB with Beam's optional clients hidden" if hidden else ""))


def describe_at_scale(scaled: dict) -> str:
    quarter = scaled["quarter"]
    return (f"at {scaled['copies']}x ({mib(scaled['input_bytes'])} MiB): unbudgeted peak "
            f"{mib(scaled['unbudgeted']['peak_tree_rss_bytes'])} MiB; quarter {mib(quarter['budget_bytes'])} MiB: "
            f"{quarter['parts_chosen']} parts, peak {mib(quarter['peak_tree_rss_bytes'])} MiB, under budget "
            f"{quarter['under_budget']}, shards identical {quarter['shards_identical']}")


def print_summary(results: dict, out_file: Path) -> None:
    """The results in a few lines, each target with PASS or MISS."""
    machine, described, e2e, irr = results["machine"], results["input"], results["end_to_end"], results["irreducible"]
    found, reached, budget, dask = results["checks"], results["targets"], results["memory_budget"], results["dask"]
    speedup = results["scaling"]["speedup_wall_1_over_2_workers"]

    def ok(name: str) -> str:
        return "PASS" if reached[name]["pass"] else "MISS"

    print()
    print(f"Preprocess benchmark, {machine['slug']} ({machine['cpu_model']}), {results['mode']}, "
          f"{results['repetitions']} rep(s)")
    print(f"  input: {described['copies']}x, {described['file_count']} files, {mib(described['bytes'])} MiB, "
          f"{described['corpus_tokens']:,} corpus tokens")
    print(f"  irreducible: {irr['cpu_s']:.2f} CPU-s (the work alone {irr['work_cpu_s']:.2f})")
    for mode, name in (("workers_1", "cpu_ratio_workers_1"), ("workers_2", "cpu_ratio_workers_2")):
        m = e2e[mode]
        print(f"  {mode}: wall {m['wall_s']:.2f} s, CPU {m['cpu_s']:.2f} s, ratio {m['cpu_ratio_vs_irreducible']:.2f} "
              f"[{ok(name)} <= {TARGETS['cpu_ratio_max']}], {m['corpus_tokens_per_cpu_s']:,.0f} tokens/CPU-s, peak "
              f"{mib(m['peak_tree_rss_bytes'])} MiB = {m['peak_rss_per_input_byte']:.1f} B per input byte, start-up "
              f"{m['startup_share_of_cpu']:.1%}")
    print(f"  speed-up 1 -> 2 workers: {speedup:.2f} [{ok('speedup_1_to_2_workers')} >= "
          f"{TARGETS['scaling_speedup_min']}]; shards identical: {found['shards_identical_1_vs_2_workers']} "
          f"({found['shard_sha256'][0][:16]}...)")
    if budget:
        print(f"  memory budget (unbudgeted peak {mib(budget['unbudgeted_peak_bytes'])} MiB): "
              + "; ".join(describe_budget(n, budget[n]) for n in BUDGETS if n in budget))
        if "floor" in budget:
            print(f"  {describe_floor(budget)}")
        if "at_scale" in budget:
            print(f"  {describe_at_scale(budget['at_scale'])}")
    if dask:
        print(f"  dask (2 workers): wall {dask['driver_wall_s']:.2f} s, CPU {dask['cpu_s']:.2f} s, ratio "
              f"{dask['cpu_ratio_vs_irreducible']:.2f}, identical {dask['shards_identical']}")
    if results["source_changed_during_run"]:
        print("  WARNING: preprocess/ or configs/ changed while the benchmark ran: the figures mix code versions")
    if found["contended_runs"]:
        print(f"  WARNING: other processes were busy during {', '.join(found['contended_runs'])}")
    print(f"  results: {shown(out_file)}")
