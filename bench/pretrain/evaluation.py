"""What evaluation on the held-out split costs against training, on CPU, and its share of every shipped run.

    python -m bench.pretrain.evaluation [--quick] [--results DIR]

Measures, at the shipped BERT-base (seq 128) and BERT-Large (seq 512) presets, in fp32 (and base at seq 128 also in
the precision ``auto`` picks on this CPU, when that is not fp32: bf16 autocast):
1. seconds per 1,000 evaluation rows (wall and CPU) of ``pretrain.evaluation.evaluate`` itself (the family's loss
   module forward in eval mode without gradients, ``LocalEngine``) on synthetic rows in the real row format
   (``pretrain.data.RowBlock``: full-length pairs with 15 % of positions masked), a few micro-batches;
2. seconds per training row of a real step at the same shape: forward, backward, AdamW step, on a small batch.
Then, for every config in configs/pretrain/, the share of the run's time its evaluations take at its own
``eval.every_steps`` and ``eval.max_rows`` (``share``; the end-of-run evaluation included), with the eval/train cost
ratio measured at its sequence length (seq 128: base's, seq 512: Large's; the ratio of a forward to a training step
hardly depends on the width). Each timing waits (up to 20 s) for the rest of the machine to go quiet and records
the cores other processes used during it (``contended`` above ``bench.cpu.CONTENDED_LOAD``). Writes
``bench/results/evaluation-<machine>[-quick].json``.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from bench import record
from bench.cpu import CONTENDED_LOAD, OtherProcesses, wait_for_quiet
from pretrain import config as pretrain_config
from pretrain import evaluation, families, precision
from pretrain.data import RowBlock, pad

CONFIGS = record.REPO / "configs" / "pretrain"
VOCAB, PAD_ID, MASKED = 30528, 0, 0.15
# (preset, seq): (evaluation batch, evaluation micro-batches, training batch, training steps after one warm-up)
SHAPES = {("base", 128): (32, 4, 8, 3), ("large", 512): (2, 3, 2, 2)}
QUICK_SHAPES = {("base", 128): (4, 1, 2, 1), ("large", 512): (1, 1, 1, 1)}


# The share arithmetic and the configs (tested in tests/bench/pretrain/test_evaluation.py) ---------------------------

def evaluations(max_steps: int, every_steps: int) -> int:
    """How many evaluations a run of ``max_steps`` makes: every ``every_steps`` (0: none) plus the end's, once."""
    during = max_steps // every_steps if every_steps else 0
    return during + (0 if every_steps and max_steps % every_steps == 0 else 1)


def share(*, max_steps: int, every_steps: int, max_rows: int, global_batch_size: int, eval_s_per_row: float,
          train_s_per_row: float) -> float:
    """The fraction of a run's time spent evaluating: evaluation time / (evaluation + training time)."""
    evaluating = evaluations(max_steps, every_steps) * max_rows * eval_s_per_row
    training = max_steps * global_batch_size * train_s_per_row
    return evaluating / (evaluating + training)


def sequence_length(cfg) -> int:
    """The row length of a config's dataset: its path's ``seq<N>`` (data/phase2_seq512), else the model's positions."""
    found = re.search(r"seq(\d+)", cfg.data.path or "")
    return int(found.group(1)) if found else cfg.model.max_position_embeddings


def shipped(directory: Path = CONFIGS) -> list[dict]:
    """What the share needs of every shipped pretraining config: steps, batch, evaluation cadence, rows, shape."""
    out = []
    for path in sorted(directory.glob("*.yaml")):
        cfg = pretrain_config.load(path)
        out.append({"config": path.name, "family": cfg.model.family, "preset": cfg.model.preset,
                    "seq": sequence_length(cfg), "max_steps": cfg.train.max_steps,
                    "global_batch_size": cfg.train.global_batch_size, "every_steps": cfg.eval.every_steps,
                    "max_rows": cfg.eval.max_rows, "target": cfg.eval.target})
    return out


def shares(configs: list[dict], costs: dict[int, dict]) -> list[dict]:
    """Each config's share, with the costs measured at its sequence length (``costs[seq]``: s per row)."""
    out = []
    for c in configs:
        cost = costs[min(costs, key=lambda seq: abs(seq - c["seq"]))]
        rows = c["max_rows"]
        value = None if rows is None else share(
            max_steps=c["max_steps"], every_steps=c["every_steps"], max_rows=rows,
            global_batch_size=c["global_batch_size"], eval_s_per_row=cost["eval_s_per_row"],
            train_s_per_row=cost["train_s_per_row"])
        out.append({**c, "evaluations": evaluations(c["max_steps"], c["every_steps"]),
                    "costs_from": cost["shape"], "share": None if value is None else round(value, 5)})
    return out


# The measurements ---------------------------------------------------------------------------------------------------

class SyntheticSplit:
    """What ``evaluate`` reads of a split (its length, pad id, row length); its rows come from ``synthetic_rows``."""

    def __init__(self, rows: int, seq: int):
        self.rows, self.pad_id = rows, PAD_ID
        self.manifest = type("Manifest", (), {"max_seq_length": seq})()

    def __len__(self) -> int:
        return self.rows


def synthetic_rows(rows: np.ndarray, seq: int) -> RowBlock:
    """Full-length sentence pairs, ``MASKED`` of each row's positions masked (at most BERT's predictions), seeded by
    the row numbers: the row format the shards hold (``pretrain.data.read_rows``)."""
    rng = np.random.default_rng(int(rows[0]))
    n, picks = len(rows), min(int(round(seq * MASKED)), 80 if seq >= 512 else 20)
    tokens = rng.integers(5, VOCAB, size=n * seq)
    positions = np.concatenate([np.sort(rng.choice(np.arange(1, seq - 1), picks, replace=False)) for _ in range(n)])
    return RowBlock(tokens, np.full(n, seq), positions, np.full(n, picks), rng.integers(5, VOCAB, size=n * picks),
                    np.full(n, seq // 2), rng.integers(0, 2, size=n))


def build(preset: str, seq: int):
    cfg = pretrain_config.load(CONFIGS / "bert_large_phase1_seq128.yaml",
                               [f"model.preset={preset}", f"model.max_position_embeddings={max(seq, 512)}"])
    family = families.for_config(cfg)
    torch.manual_seed(1234)
    return family, family.loss_module(family.new_model(vocab_size=VOCAB, pad_token_id=PAD_ID))


def timed(fn, loads: list) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()``, after waiting (up to 20 s) for the rest of the machine to go quiet; appends
    the cores other processes used meanwhile to ``loads`` (above ``CONTENDED_LOAD``: the figure is contended)."""
    wait_for_quiet(20.0)
    others = OtherProcesses()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    loads.append(round(others.cores(), 2))
    return wall, cpu


def measure(preset: str, seq: int, eval_batch: int, eval_batches: int, train_batch: int, train_steps: int,
            autocast: bool) -> dict:
    family, loss = build(preset, seq)
    context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else nullcontext
    engine, loads = evaluation.LocalEngine(loss), []
    original = evaluation.read_rows
    evaluation.read_rows = lambda data, rows: synthetic_rows(rows, seq)  # synthetic rows, the real evaluate
    try:
        with context():
            evaluation.evaluate(engine, family, SyntheticSplit(eval_batch, seq), batch_size=eval_batch)  # warm-up
            rows = eval_batch * eval_batches
            e_wall, e_cpu = timed(lambda: evaluation.evaluate(engine, family, SyntheticSplit(rows, seq),
                                                              batch_size=eval_batch), loads)
    finally:
        evaluation.read_rows = original
    optimizer = torch.optim.AdamW(loss.parameters(), lr=1e-4)
    rows_block = pad(synthetic_rows(np.arange(1, train_batch + 1), seq), PAD_ID, limit=seq)
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in rows_block.items()}
    batch.update(mlm_loss_scale=torch.tensor(1.0), token_loss_scale=torch.tensor(1.0))
    batch.update(family.micro_batch_inputs(step=0, micro=0, rank=0))

    def step():
        with context():
            out = loss(**batch)
        out[0].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    loss.train()
    step()  # warm-up (the optimizer's state is made here)
    t_wall, t_cpu = timed(lambda: [step() for _ in range(train_steps)], loads)
    eval_s, train_s = e_wall / rows, t_wall / (train_steps * train_batch)
    return {"shape": f"{preset}/seq{seq}", "preset": preset, "seq": seq,
            "precision": "bf16 (autocast)" if autocast else "fp32",
            "eval_rows": rows, "eval_batch_size": eval_batch, "train_rows_per_step": train_batch,
            "train_steps": train_steps,
            "eval_wall_s_per_1000_rows": round(1000 * eval_s, 2),
            "eval_cpu_s_per_1000_rows": round(1000 * e_cpu / rows, 2),
            "train_wall_s_per_row": round(train_s, 4),
            "train_cpu_s_per_row": round(t_cpu / (train_steps * train_batch), 4),
            "eval_s_per_row": eval_s, "train_s_per_row": train_s, "eval_to_train_ratio": round(eval_s / train_s, 4),
            "foreign_load_cores": {"evaluation": loads[0], "training": loads[1]},
            "contended": max(loads) > CONTENDED_LOAD}


def run(quick: bool) -> dict:
    auto = precision.choose("auto", precision.detect("cpu")).precision
    measured = []
    for (preset, seq), sizes in (QUICK_SHAPES if quick else SHAPES).items():
        print(f"evaluation bench: {preset} seq {seq} fp32 ...", flush=True)
        measured.append(measure(preset, seq, *sizes, autocast=False))
        print(f"  {measured[-1]}", flush=True)
    if auto == "bf16":
        sizes = (QUICK_SHAPES if quick else SHAPES)[("base", 128)]
        print("evaluation bench: base seq 128 bf16 (auto) ...", flush=True)
        measured.append(measure("base", 128, *sizes, autocast=True))
        print(f"  {measured[-1]}", flush=True)
    fp32 = {m["seq"]: m for m in measured if m["precision"] == "fp32"}
    return {"auto_precision_on_this_cpu": auto, "measured": measured, "shares": shares(shipped(), fp32)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small batch per shape: a smoke run")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results = run(args.quick)
    machine = record.machine_info()
    out = {"benchmark": "evaluation", "date": record.utc_now(), "command": record.command_line(),
           "machine": machine, "versions": record.versions(["torch", "numpy"], ["pretrain", "bench"]),
           "threads": torch.get_num_threads(), **results,
           "wall_s": round(time.perf_counter() - started, 1)}
    path = record.results_file(args.results, "evaluation", machine, "-quick" if args.quick else "")
    record.write_json(path, out)
    for s in results["shares"]:
        print(f"{s['config']}: every {s['every_steps']} steps, {s['max_rows']} rows, {s['evaluations']} evaluations: "
              f"share {s['share']}")
    print(f"wrote {record.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
