"""Benchmark of the pretraining loader at real scale: memory per rank, start-up and throughput vs dataset rows.

    python -m bench.pretrain.loader [--rows 100000000] [--small-rows 10000000] [--work bench/work/loader] [--quick]

1. Writes synthetic datasets in the real shard format (``python -m preprocess.synthetic``, seq 128, the
   bert-base-uncased vocabulary) once under ``--work``; the disk is checked first.
2. For each dataset, a fresh process (``bench.pretrain.loader_rank``: one rank of an 8-rank job with the shipped
   BERT-Large phase-1 config's batch: global 65,536, micro-batch 64, accumulation 128, its length-grouping window;
   --quick: global 8,192), run once after the page cache is dropped (cold) and once again (warm), opens the
   dataset, reads its first step, then reads steps for ``--seconds``; it records wall times and its USS (``psutil``
   ``memory_full_info().uss``: memory no other process shares) after imports, after opening, after the
   first step and at the end.
3. The growth of USS between the two datasets, divided by the growth in rows, is the per-row private
   memory of a rank (target <= 16 bytes, goal 8). The mapped shard pages a lone rank touches count in its USS
   (no other process maps them); on a node, the ranks share them through the page cache. So the target is
   judged on two ranks of the job run together (the pages both map drop out of each one's USS), and the
   figures without any mapped shard pages are recorded beside it.
Writes ``bench/results/loader-<machine>[-quick].json`` and prints a summary.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import record
from common import processes

TARGETS = {"uss_bytes_per_row_max": 16, "uss_bytes_per_row_goal": 8, "first_batch_s_max": 10.0,
           "samples_per_s_per_rank_min": 20_000}
PHASE1_CONFIG = record.REPO / "configs" / "pretrain" / "bert_large_phase1_seq128.yaml"
WORLD_SIZE, RANK = 8, 3  # one node of 8 GPUs; rank 3 stands for any
WRITE_TIMEOUT_S = 4 * 3600  # writing 100 M synthetic rows takes a while; past this the writer is stuck
RANK_TIMEOUT_S = 1800       # a rank reads for --seconds after opening; past this it is stuck


def rank_shape(quick: bool) -> dict:
    """The data shape of one rank of an 8-GPU node under the shipped BERT-Large phase-1 config."""
    from pretrain import config

    cfg = config.load(str(PHASE1_CONFIG), [])
    shape = {"config": record.shown(PHASE1_CONFIG), "global_batch": cfg.train.global_batch_size,
             "micro_batch": cfg.train.micro_batch_size, "world_size": WORLD_SIZE, "rank": RANK,
             "window_batches": cfg.data.window_batches}
    # Quick mode's datasets hold a few windows of a smaller global batch.
    return {**shape, "global_batch": 8192} if quick else shape


def ensure_dataset(work: Path, rows: int) -> dict:
    """The synthetic dataset of ``rows`` rows under ``work`` (written once); how long writing it took."""
    from bench.shards import vocab_path

    out = work / f"synthetic-{rows}"
    if (out / "manifest.json").is_file():
        return {"path": str(out), "written_now": False}
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    processes.run([sys.executable, "-m", "preprocess.synthetic", "--rows", str(rows), "--output", str(out),
                   "--tokenizer", str(vocab_path()), "--workers", str(os.cpu_count() or 1)], cwd=record.REPO,
                  check=True, timeout=WRITE_TIMEOUT_S)
    return {"path": str(out), "written_now": True, "write_s": round(time.perf_counter() - started, 1)}


def drop_page_cache() -> bool:
    """Empty the kernel's page cache (root only), so the next run reads the shards from disk."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def run_ranks(dataset: str, seconds: float, shape: dict, ranks: tuple[int, ...]) -> list[dict]:
    """Ranks ``ranks`` of the job at once, each in its own process (``bench.pretrain.loader_rank``); their figures."""
    with tempfile.TemporaryDirectory(prefix="loader-barrier-") as barrier, contextlib.ExitStack() as running:
        together = {"directory": barrier, "ranks": list(ranks)} if len(ranks) > 1 else None
        procs = [running.enter_context(processes.started(
            [sys.executable, "-m", "bench.pretrain.loader_rank", dataset, "--seconds", str(seconds),
             "--shape", json.dumps({**shape, "rank": rank, "together": together})],
            cwd=record.REPO, stdout=subprocess.PIPE, text=True)) for rank in ranks]
        deadline = time.monotonic() + seconds + RANK_TIMEOUT_S  # a late rank's whole session is killed on leaving
        outputs = [proc.communicate(timeout=max(0.0, deadline - time.monotonic()))[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a rank of the loader benchmark failed on {dataset}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


def run_rank(dataset: str, seconds: float, shape: dict) -> dict:
    return run_ranks(dataset, seconds, shape, (shape["rank"],))[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--small-rows", type=int, default=10_000_000)
    parser.add_argument("--work", type=Path, default=record.WORK / "loader")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each rank reads steps")
    parser.add_argument("--quick", action="store_true", help="1M and 4M rows, 3 s of reading")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.small_rows, args.seconds = 4_000_000, 1_000_000, 3.0
    args.work.mkdir(parents=True, exist_ok=True)
    machine = record.machine_info()
    datasets = {rows: ensure_dataset(args.work, rows) for rows in (args.small_rows, args.rows)}
    shape = rank_shape(args.quick)
    ranks, cold, pair = {}, {}, {}
    for rows, info in datasets.items():
        # Cold: the shards come from disk (a dataset larger than memory always partly does); warm: run again.
        dropped = drop_page_cache()
        cold[rows] = {**run_rank(info["path"], args.seconds, shape), "page_cache_dropped": dropped}
        ranks[rows] = run_rank(info["path"], args.seconds, shape)
        # Two ranks of one node read the same blocks: the shard pages they share drop out of each one's USS.
        pair[rows] = run_ranks(info["path"], args.seconds, shape, (shape["rank"], shape["rank"] + 1))
    small, large = ranks[args.small_rows], ranks[args.rows]
    growth = {f"{measure}_{stage}": (large["memory_bytes"][stage][measure] - small["memory_bytes"][stage][measure])
              / (args.rows - args.small_rows)
              for stage in ("after_open", "after_first_step", "end") for measure in ("uss", "uss_without_shard_pages")}
    growth["uss_end_two_ranks"] = max(
        (big["memory_bytes"]["end"]["uss"] - little["memory_bytes"]["end"]["uss"]) / (args.rows - args.small_rows)
        for big, little in zip(pair[args.rows], pair[args.small_rows]))
    shard_bytes = {rows: sum(s["bytes"] for s in json.loads((Path(info["path"]) / "manifest.json").read_text())["shards"])
                   for rows, info in datasets.items()}
    result = {
        "benchmark": "loader", "date": record.utc_now(), "mode": "quick" if args.quick else "full",
        "command": record.command_line(), "machine": machine,
        # The datasets are written by the preprocessing package (preprocess.synthetic) and read by pretrain's loader.
        "versions": record.versions(record.DISTRIBUTIONS["preprocess"], ("preprocess", "pretrain", "configs")),
        "rank_shape": shape, "seconds_per_rank": args.seconds,
        "datasets": {str(rows): {**info, "shard_bytes": shard_bytes[rows]} for rows, info in datasets.items()},
        "ranks": {str(rows): figures for rows, figures in ranks.items()},
        "ranks_cold_page_cache": {str(rows): figures for rows, figures in cold.items()},
        "two_ranks_together": {str(rows): figures for rows, figures in pair.items()},
        "growth_bytes_per_row": {key: round(value, 2) for key, value in growth.items()},
        "targets": TARGETS,
        "met": {"uss_bytes_per_row": growth["uss_end_two_ranks"] <= TARGETS["uss_bytes_per_row_max"],
                "first_batch_s": large["first_step_s"] <= TARGETS["first_batch_s_max"],
                "samples_per_s_per_rank": large["samples_per_s"] >= TARGETS["samples_per_s_per_rank_min"]},
    }
    path = record.results_file(args.results, "loader", machine, "-quick" if args.quick else "")
    record.write_json(path, result)
    print(record.shown(path))
    for rows, figures in ranks.items():
        print(f"  {rows:>13,} rows ({shard_bytes[rows] / 2**30:.1f} GiB, {figures['shards']} shards): open "
              f"{figures['open_s']:.2f} s, first step {figures['first_step_s']:.2f} s, "
              f"{figures['samples_per_s']:,} samples/s, USS {figures['memory_bytes']['end']['uss'] / 2**20:.0f} MiB "
              f"(of which mapped shard pages {figures['memory_bytes']['end']['mapped_shard_pages'] / 2**20:.0f} MiB)")
    for rows, figures in cold.items():
        print(f"  {rows:>13,} rows, cold page cache: open {figures['open_s']:.2f} s, first step "
              f"{figures['first_step_s']:.2f} s, {figures['samples_per_s']:,} samples/s")
    print(f"  USS growth per row: {growth['uss_end']:.2f} B (after the first step {growth['uss_after_first_step']:.2f} B);"
          f" without the mapped shard pages {growth['uss_without_shard_pages_end']:.2f} B; two ranks together "
          f"{growth['uss_end_two_ranks']:.2f} B per rank; targets met: {result['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
