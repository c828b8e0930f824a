"""The preprocessing benchmark's memory-budget section: runs under ``--max-memory`` and the floor under any budget.

A budget a quarter of the in-memory run's peak must be kept (peak under it, shards byte-identical). When the CLI
refuses it (its estimate for one input file per part is above it), the smallest budget the estimate accepts is
run too, and the floor no budget can go under is measured: the peak of a process that imports the pipeline,
loads the tokenizer and runs one trivial pipeline (``python -m bench.preprocess.floor``).

``budget_at_scale`` does the same on a larger input (32 copies by default), where a quarter of the unbudgeted peak
is well above that floor: the unbudgeted in-memory run and the run under a quarter of its peak.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from bench.preprocess.floor import OPTIONAL_CLIENTS
from bench.preprocess.inputs import sized_files
from bench.preprocess.runs import MODES, Setting, mib, run_pipeline
from bench.processes import run_measured


def budget_run(setting: Setting, unbudgeted: dict) -> dict:
    """The in-memory run under ``--max-memory`` a quarter of its unbudgeted peak (``unbudgeted``: its
    ``peak_tree_rss_bytes`` and ``shard_sha256``); when the CLI refuses that, also under the smallest budget it
    accepts, and the floor under any budget."""
    from preprocess.executors import part_budget

    files = sized_files(setting.inputs)
    smallest = part_budget.estimated_peak(files, len(files))
    out = {"unbudgeted_peak_bytes": unbudgeted["peak_tree_rss_bytes"],
           "smallest_accepted_budget_bytes": smallest}
    budgets = {"quarter": unbudgeted["peak_tree_rss_bytes"] // 4, "smallest_accepted": smallest}
    for name, budget in budgets.items():
        log = setting.logs / f"budget-{name}.log"
        try:
            r = run_pipeline(setting, setting.work / "out" / f"budget-{name}",
                             [*MODES["workers_1"], "--max-memory", str(budget)], log)
        except RuntimeError as exc:   # refused: the budget is below one input file per part
            out[name] = {"budget_bytes": budget, "refused": str(exc).strip().splitlines()[-1],
                         "under_budget": False, "shards_identical": False}
            continue
        chosen = re.search(r"max-memory \S+: \d+ parts? \(estimated peak \S+ per part\)", log.read_text())
        out[name] = {"budget_bytes": budget, "parts_chosen": r["parts"], "log_line": chosen and chosen.group(0),
                     "peak_tree_rss_bytes": r["peak_tree_rss_bytes"], "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
                     "peak_over_budget": round(r["peak_tree_rss_bytes"] / budget, 3),
                     "under_budget": r["peak_tree_rss_bytes"] <= budget,
                     "shards_identical": r["shard_sha256"] == unbudgeted["shard_sha256"], "run": r}
        if name == "quarter" and budget >= smallest:
            break
    if not out["quarter"]["under_budget"]:
        out["floor"] = memory_floor(setting, setting.logs / "memory-floor.log")
    return out


def budget_at_scale(setting: Setting, copies: int) -> dict:
    """The in-memory run of ``setting``'s input (``copies`` copies of the shared data) without a budget, then under a
    quarter of its peak: peaks, parts chosen, and whether the shards are byte-identical."""
    unbudgeted = run_pipeline(setting, setting.work / "out" / "at-scale-unbudgeted", list(MODES["workers_1"]),
                              setting.logs / "budget-at-scale-unbudgeted.log")
    input_bytes = sum(os.path.getsize(f) for f in setting.inputs["wiki"] + setting.inputs["books"])
    budget = unbudgeted["peak_tree_rss_bytes"] // 4
    log = setting.logs / "budget-at-scale-quarter.log"
    quarter = run_pipeline(setting, setting.work / "out" / "at-scale-quarter",
                           [*MODES["workers_1"], "--max-memory", str(budget)], log)
    chosen = re.search(r"max-memory \S+: \d+ parts? \(estimated peak \S+ per part\)", log.read_text())
    return {"copies": copies, "input_bytes": input_bytes, "instances": unbudgeted["instances"],
            "unbudgeted": {"peak_tree_rss_bytes": unbudgeted["peak_tree_rss_bytes"],
                           "peak_rss_per_input_byte": round(unbudgeted["peak_tree_rss_bytes"] / input_bytes, 2),
                           "wall_s": unbudgeted["wall_s"], "cpu_s": unbudgeted["cpu_s"], "run": unbudgeted},
            "quarter": {"budget_bytes": budget, "parts_chosen": quarter["parts"],
                        "log_line": chosen and chosen.group(0),
                        "peak_tree_rss_bytes": quarter["peak_tree_rss_bytes"], "wall_s": quarter["wall_s"],
                        "cpu_s": quarter["cpu_s"],
                        "peak_over_budget": round(quarter["peak_tree_rss_bytes"] / budget, 3),
                        "under_budget": quarter["peak_tree_rss_bytes"] <= budget,
                        "shards_identical": quarter["shard_sha256"] == unbudgeted["shard_sha256"], "run": quarter}}


def memory_floor(setting: Setting, log: Path, runs: int = 3) -> dict:
    """Peak RSS of ``python -m bench.preprocess.floor``: a process that imports the pipeline, loads the tokenizer and
    runs one trivial in-memory Beam pipeline, what every part of a budgeted run needs before it holds any data; and
    the same with the optional clients that Beam imports when present hidden, what is left without them."""
    cmd = [sys.executable, "-m", "bench.preprocess.floor", str(setting.tokenizer)]

    def peak(args: list[str]) -> int:
        run_measured([*cmd, *args], log)
        reported = [line for line in log.read_text().splitlines() if line.startswith("{")][-1]
        return json.loads(reported)["peak_rss_bytes"]

    return {"one_trivial_pipeline_peak_bytes": max(peak([]) for _ in range(runs)),
            "optional_clients_hidden_peak_bytes": max(peak(["--hide", *OPTIONAL_CLIENTS]) for _ in range(runs)),
            "optional_clients": list(OPTIONAL_CLIENTS),
            "method": "max of the VmHWM that python -m bench.preprocess.floor reports: load_pipeline_modules(), "
                      f"load_tokenizer, one Create | Map | GroupByKey pipeline on the in-memory runner ({runs} runs); "
                      "then with --hide and the optional clients (imports of them fail, as if not installed)"}


def describe_budget(name: str, b: dict) -> str:
    """One line of the summary for the budget ``name``: refused, or its parts, peak and checks."""
    if "refused" in b:
        return f"{name} {mib(b['budget_bytes'])} MiB: refused ({b['refused'][:160]})"
    return (f"{name} {mib(b['budget_bytes'])} MiB: {b['parts_chosen']} parts, peak {mib(b['peak_tree_rss_bytes'])} "
            f"MiB, under budget {b['under_budget']}, shards identical {b['shards_identical']}")
