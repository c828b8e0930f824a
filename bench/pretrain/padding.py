"""The padding each choice of ``data.pad_multiple`` costs on the real shards, and the widths it makes.

    python -m bench.pretrain.padding [--data ../shared/data] [--results bench/results]

For BERT-Large's two phases (the shards ``bench.shards`` builds from the shared Wikipedia slice and books with the
phase configs), one epoch of the loader's row order: the recipe's window of 262,144 rows grouped by length (or the
whole dataset where it is smaller), micro-batches of the shipped size and of the size that fills an H100/H200.
For each multiple: the share of the padded tokens that are padding, the mean width and how many distinct widths
occur (each is a compiled graph, a set of kernel plans and a CUDA graph). The rows and their order are the
loader's; only the width differs between choices. Writes bench/results/padding-<machine>.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench import record
from bench.shards import ensure_dataset
from pretrain.data import ShardedInstances, padded_width, split_global_batch
from pretrain.sampling import EpochOrder

SEED = 1234
ACCUMULATION = 4                 # micro-batches in a global batch (the grouping is by window, so this barely matters)
WINDOW_ROWS = 262_144            # the shipped recipes' grouping window (window_batches x global batch)
PHASES = {128: {"micro_batches": (64, 256), "multiples": (8, 32, 64, 128)},   # shipped, fills the card
          512: {"micro_batches": (8, 64), "multiples": (8, 64, 128, 512)}}


def widths_of(data: ShardedInstances, micro: int) -> tuple[np.ndarray, int, int]:
    """The longest row of every micro-batch of one epoch in the loader's order (one rank), the real tokens, and
    the global batch."""
    global_batch = micro * ACCUMULATION
    window = max(1, min(WINDOW_ROWS, len(data)) // global_batch)
    order = EpochOrder(len(data), epoch=0, seed=SEED, global_batch=global_batch, window_batches=window,
                       lengths_of=data.lengths_of)
    longest, real = [], 0
    for index in range(len(order)):
        rows = split_global_batch(order.batch(index), accumulation=ACCUMULATION, world_size=1,
                                  micro_batch=micro).reshape(-1, micro)
        lengths = data.lengths_of(rows.reshape(-1)).reshape(rows.shape)
        longest.append(lengths.max(axis=1))
        real += int(lengths.sum())
    return np.concatenate(longest), real, global_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.padding", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--work", type=Path, default=record.WORK / "bert-large")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    machine, found = record.machine_info(), {}
    for seq, phase in PHASES.items():
        directory, _ = ensure_dataset(seq, args.data, args.work)
        data = ShardedInstances(directory)
        for micro in phase["micro_batches"]:
            began = time.perf_counter()
            longest, real, global_batch = widths_of(data, micro)
            entry = {"rows": len(data), "micro_batch": micro, "global_batch": global_batch,
                     "micro_batches": len(longest), "real_tokens": real, "multiples": {}}
            for multiple in phase["multiples"]:
                widths = np.array([padded_width(n, multiple, data.manifest.max_seq_length) for n in longest])
                padded = int(widths.sum()) * micro
                entry["multiples"][str(multiple)] = {"padding_share": round(1 - real / padded, 4),
                                                     "mean_width": round(float(widths.mean()), 1),
                                                     "distinct_widths": len(np.unique(widths))}
            entry["wall_s"] = round(time.perf_counter() - began, 1)
            found[f"seq{seq}-micro{micro}"] = entry
            shares = ", ".join(f"{m}: {v['padding_share']:.1%} ({v['distinct_widths']} widths)"
                               for m, v in entry["multiples"].items())
            print(f"seq {seq}, micro-batch {micro}: {shares}", flush=True)
    results = {"benchmark": "padding", "date": record.utc_now(), "command": record.command_line(),
               "machine": machine, "versions": record.versions(("numpy", "pyarrow"), ("pretrain", "configs")),
               "method": {"order": f"one epoch of pretrain.sampling.EpochOrder (seed {SEED}), windows of "
                                   f"{WINDOW_ROWS:,} rows or the whole dataset, global batch of {ACCUMULATION} "
                                   "micro-batches",
                          "padding_share": "1 - real tokens / (micro-batch x padded width), over the epoch",
                          "width": "pretrain.data.padded_width(longest row, multiple, the dataset's sequence length)"},
               "phases": found}
    out = record.results_file(args.results, "padding", machine)
    record.write_json(out, results)
    print(f"wrote {record.shown(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
