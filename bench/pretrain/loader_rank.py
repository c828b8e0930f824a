"""One rank of the loader benchmark, in a fresh process: open a dataset, read its first step, read on; print figures.

    python -m bench.pretrain.loader_rank DATASET --seconds S --shape JSON

``bench.pretrain.loader`` starts it (one process per rank, several at once for ranks of one node) and reads the JSON line
it prints: wall times and the process's USS (``psutil`` ``memory_full_info().uss``: memory no other process
shares) after imports, after opening, after the first step and at the end, with and without the shard pages
the process maps.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psutil

from pretrain.data import PretrainingLoader, ShardedInstances


def mapped_shard_bytes() -> int:
    """This process's private resident bytes in mappings of shard files (from /proc/self/smaps)."""
    total, in_shard = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            # A mapping's first line: range perms offset dev inode [path]; its counters follow.
            if head and "-" in head[0] and len(head) >= 5:
                in_shard = len(head) >= 6 and head[-1].endswith(".arrow")
            elif in_shard and head and head[0] in ("Private_Clean:", "Private_Dirty:"):
                total += int(head[1]) * 1024
    return total


def _barrier(shape: dict, name: str) -> None:
    """Wait until every rank of ``shape["together"]`` has reached ``name`` (files in a shared directory)."""
    together = shape.get("together")
    if not together:
        return
    Path(together["directory"], f"{name}-{shape['rank']}").touch()
    while not all(Path(together["directory"], f"{name}-{rank}").exists() for rank in together["ranks"]):
        time.sleep(0.01)


def measure_rank(dataset: str, seconds: float, shape: dict) -> dict:
    """One rank's figures: ``shape`` gives its batch (global, micro), world size, rank and length-grouping window."""
    process = psutil.Process()

    def memory() -> dict:
        uss, mapped = process.memory_full_info().uss, mapped_shard_bytes()
        return {"uss": uss, "mapped_shard_pages": mapped, "uss_without_shard_pages": uss - mapped}

    uss = {"after_imports": memory()}
    started = time.perf_counter()
    data = ShardedInstances(dataset)
    open_s = time.perf_counter() - started
    uss["after_open"] = memory()
    accumulation = shape["global_batch"] // (shape["micro_batch"] * shape["world_size"])
    loader = PretrainingLoader(data, micro_batch=shape["micro_batch"], accumulation=accumulation,
                               world_size=shape["world_size"], rank=shape["rank"], seed=1234,
                               window_batches=shape["window_batches"])
    first = loader.next_step()
    first_batch_s = time.perf_counter() - started
    uss["after_first_step"] = memory()
    steps, samples, tokens, padded, began = 0, 0, 0, 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        for micro in loader.next_step():
            samples += len(micro["input_ids"])
            tokens += int(micro["attention_mask"].sum())
            padded += micro["input_ids"].size
        steps += 1
    wall = time.perf_counter() - began
    _barrier(shape, "read")  # ranks run together measure while all of them still map the shards
    uss["end"] = memory()
    _barrier(shape, "measured")
    shards = len(json.loads((Path(dataset) / "manifest.json").read_text())["shards"])
    return {"rows": len(data), "shards": shards, "open_s": round(open_s, 3),
            "first_step_s": round(first_batch_s, 3), "first_step_samples": int(sum(len(m["input_ids"]) for m in first)),
            "steps": steps, "wall_s": round(wall, 2), "samples_per_s": round(samples / wall),
            "tokens_per_s": round(tokens / wall), "mean_length": round(tokens / max(1, samples), 1),
            "padding_share": round(1 - tokens / max(1, padded), 4), "memory_bytes": uss,
            "batches_per_epoch": loader.batches_per_epoch}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.loader_rank", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--seconds", type=float, required=True, help="how long to read steps after the first")
    parser.add_argument("--shape", required=True, help="the rank's shape, JSON (see bench.pretrain.loader.rank_shape)")
    args = parser.parse_args(argv)
    print(json.dumps(measure_rank(args.dataset, args.seconds, json.loads(args.shape))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
