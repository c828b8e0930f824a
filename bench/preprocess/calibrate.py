"""Calibration of the ``--max-memory`` estimate (``preprocess.executors.part_budget``): peaks of in-memory runs, and a fit.

    python -m bench.preprocess.calibrate [--copies 1 8 32] [--work DIR] [--data DIR] [--results DIR]

Runs ``python -m preprocess run`` in memory (``--direct_num_workers 1``, the benchmark's config and tokenizer) on
each kind of input alone (the dumps, the books) at each number of copies, both kinds at the largest, and both
kinds at 8 copies and at the largest in 4 and 16 parts, and records each run's peak RSS (summed over its process
tree) and CPU.

The fit: slopes per kind (peak bytes per input byte as stored) by least squares over the one-part runs, rounded up
to 0.5, then the smallest base, rounded up to 10 MiB, under which ``preprocess.executors.part_budget``'s estimate with those slopes
is at or above every measured peak, multi-part runs included (``fitted_estimate_over_peak`` of each run). The
estimate with the constants in ``preprocess/executors/part_budget.py`` is compared with every run too (``estimate_over_peak``;
``estimate_errs_high``: none below 1). The result goes into ``memory_calibration`` of
``bench/results/preprocess-<machine>.json``; the constants in ``preprocess/executors/part_budget.py`` are then set from it by hand.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from bench import record
from bench.preprocess.inputs import make_copies, prepare_tokenizer, real_inputs, sized_files
from bench.preprocess.runs import MODES, Setting, mib, run_pipeline

BASE_STEP = 10 << 20   # the base is rounded up to this
SLOPE_STEP = 0.5       # and the slopes to this


def runs_to_make(copies: list[int]) -> list[tuple[str, int, tuple[str, ...], int]]:
    """(label, copies, kinds, parts) of every calibration run."""
    largest = max(copies)
    runs = [(f"{kind}_{n}x_parts_1", n, (kind,), 1) for kind in ("wiki", "books") for n in copies]
    runs.append((f"all_{largest}x_parts_1", largest, ("wiki", "books"), 1))
    # Split runs at two sizes: up to 512 transport groups a part's instance stage cuts its rows by every key-range
    # group of the corpus, so it also grows with the whole corpus, which one size alone would not show.
    runs += [(f"all_{n}x_parts_{parts}", n, ("wiki", "books"), parts)
             for n in sorted({8, largest}) for parts in (4, 16) if n in copies]
    return runs


def weighted_input(files: list[tuple[str, str, int]]) -> dict[str, int]:
    """Input bytes by ``preprocess.executors.part_budget`` kind (``.bz2`` dump, plain dump, book): what the slopes multiply."""
    from preprocess.executors import part_budget

    weighted: dict[str, int] = {}
    for kind, uri, size in files:
        weighted[part_budget.input_kind(kind, uri)] = weighted.get(part_budget.input_kind(kind, uri), 0) + size
    return weighted


def fit(measured: list[dict]) -> dict:
    """Slopes per input kind from the one-part runs (least squares, rounded up), the smallest base (rounded up)
    under which the estimate with them covers every run, and each run's estimate over its peak with both."""
    from preprocess.executors import part_budget

    kinds = sorted({kind for run in measured for kind in run["weighted_input"]})
    one_part = [run for run in measured if run["parts"] == 1]
    design = np.array([[1.0, *(run["weighted_input"].get(kind, 0) for kind in kinds)] for run in one_part])
    peaks = np.array([run["peak_tree_rss_bytes"] for run in one_part], dtype=float)
    solution, *_ = np.linalg.lstsq(design, peaks, rcond=None)
    least_squares = {kind: round(float(slope), 3) for kind, slope in zip(kinds, solution[1:])}
    slopes = {kind: math.ceil(round(slope / SLOPE_STEP, 6)) * SLOPE_STEP for kind, slope in least_squares.items()}
    # The base each run needs with these slopes: its peak less the heaviest part's weighted input.
    needed = [run["peak_tree_rss_bytes"] - part_budget.estimated_peak(run["files"], run["parts"], slopes, base=0)
              for run in measured]
    base = -(-int(max(needed)) // BASE_STEP) * BASE_STEP
    return {"least_squares": {"peak_bytes_per_input_byte": least_squares, "base_bytes": int(solution[0])},
            "peak_bytes_per_input_byte": slopes, "base_bytes": base, "base_mib": base >> 20,
            "fitted_estimate_over_peak": {
                run["label"]: round(part_budget.estimated_peak(run["files"], run["parts"], slopes, base)
                                    / run["peak_tree_rss_bytes"], 3) for run in measured}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--work", type=Path, default=record.WORK / "preprocess")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    from preprocess.executors import part_budget

    work = args.work.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    shared = real_inputs(args.data)
    tokenizer, _ = prepare_tokenizer(shared, work)
    measured = []
    begun = time.perf_counter()
    for label, copies, kinds, parts in runs_to_make(args.copies):
        inputs = make_copies(shared, work, copies)
        setting = Setting({"wiki": inputs["wiki"] if "wiki" in kinds else [],
                           "books": inputs["books"] if "books" in kinds else []}, tokenizer, work)
        files = sized_files(inputs, kinds)
        result = run_pipeline(setting, work / "out" / "calibration", [*MODES["workers_1"], "--parts", str(parts)],
                              work / "logs" / f"calibration-{label}.log")
        estimate = part_budget.estimated_peak(files, parts)
        measured.append({"label": label, "parts": parts, "files": files, "weighted_input": weighted_input(files),
                         "peak_tree_rss_bytes": result["peak_tree_rss_bytes"], "cpu_s": result["cpu_s"],
                         "wall_s": result["wall_s"], "contended": result["contended"], "estimate_bytes": estimate,
                         "estimate_over_peak": round(estimate / result["peak_tree_rss_bytes"], 3)})
        print(f"[{time.perf_counter() - begun:6.1f}s] {label}: peak {mib(result['peak_tree_rss_bytes'])} MiB, "
              f"estimate {mib(estimate)} MiB, {result['cpu_s']:.1f} CPU-s", flush=True)
    fitted = fit(measured)
    machine = record.machine_info()
    out_file = record.results_file(args.results, "preprocess", machine)
    results = json.loads(out_file.read_text()) if out_file.exists() else {}
    results["memory_calibration"] = {
        "date": record.utc_now(), "command": record.command_line(),
        "versions": record.versions(record.DISTRIBUTIONS["preprocess"], ("preprocess", "configs")),
        "method": "peak_tree_rss_bytes of one in-memory run each (python -m preprocess run --direct_num_workers 1 "
                  "--parts N, the phase-1 config), measured as bench.preprocess.scale measures its runs",
        "constants_in_use": {"peak_bytes_per_input_byte": dict(part_budget.PEAK_BYTES_PER_INPUT_BYTE),
                             "base_bytes": part_budget.BASE_PEAK_BYTES},
        "runs": [{key: value for key, value in run.items() if key != "files"}
                 | {"input_bytes": sum(size for _, _, size in run["files"])} for run in measured],
        "estimate_errs_high": all(run["estimate_over_peak"] >= 1 for run in measured),
        "fit": fitted,
    }
    record.write_json(out_file, results)
    print(f"fit: {fitted['peak_bytes_per_input_byte']} bytes per input byte, base {fitted['base_mib']} MiB; "
          f"the estimate in use errs high on every run: {results['memory_calibration']['estimate_errs_high']}; "
          f"written to {record.shown(out_file)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
