"""CPU cost of one pretraining step of the newer variants against their base, on the same real-format rows.

    python -m bench.pretrain.variants [--rows 8] [--seq-len 128] [--rounds 3] [--steps 2] [--threads N] [--quick]
        [--work DIR] [--data DIR] [--results DIR]

One step: forward + loss + backward + gradient clipping (``train.gradient_clipping``, as the engine clips) + a torch
AdamW step (the config's lr, betas, eps and weight decay, ``pretrain.weight_decay``'s groups) of the family's loss
module (``pretrain.families.for_config``), fp32, no DeepSpeed engine; models built by ``pretrain.train.build_model``
(seeded by the config's seed; the dataset's vocabulary, 30,528 ids, for every model).

Comparisons (the first member is the variant; ratios are variant / member, taken per round, then median):
1. ``spanbert_sbo``: configs/pretrain/spanbert_base.yaml (BERT-base, MLM + span-boundary objective, whose head the
   loss trains) against the same config with ``objective.span_boundary=false`` (MLM only); the same initial BERT
   weights, span masks.
2. ``deberta_v3_small``: configs/pretrain/deberta_v3_small.yaml (discriminator 6 x 768, generator 3 x 768,
   disentangled attention, GDES; RTD) against configs/pretrain/electra_small.yaml (12 x 256, generator 1/4 wide) and
   against ``electra_at_deberta_sizes``, ELECTRA (BERT attention, absolute positions, shared embeddings) at
   DeBERTa's sizes: the attention apart from the size. ELECTRA's config keys cannot give those sizes (its generator
   keeps the discriminator's depth), so it is electra_small.yaml with ``model.preset=electra_base`` and
   ``electra.generator_fraction=1.0`` (768 wide, 12 heads, FFN 3072: DeBERTa's widths) and the depths set in code
   (6 and 3 layers). Masks: deberta_v3_small's recipe for all three. DeBERTa-v3's own 128K vocabulary would make
   its embeddings and generator head larger than here.

Rows: a small DOC-SENTENCES dataset stored unmasked (as spanbert_seq512's and electra_seq128's), made once under
``--work`` by ``python -m preprocess run`` from two books at ``--seq-len`` (``bench.pretrain.objectives.preprocess``);
``--rows`` x ``--steps`` of its full-length rows, masked by the loader's dynamic masking and padded by its ``pad``.
The same batches for every member and round; one warm-up step per member (not counted); each round runs every
member ``--steps`` steps, the order rotated each round (A/B, B/A). Per step: wall and process CPU seconds (all
threads), median, min and max over rounds; other processes' load recorded. Writes
``bench/results/variants-<machine>[-quick].json``, prints a table. ``--quick``: a smoke run (2 rows x 32 tokens,
1 round of 1 step, one thread unless ``--threads`` or OMP_NUM_THREADS), not a measurement.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bench import record
from bench.cpu import OtherProcesses, wait_for_quiet
from bench.pretrain.objectives import RECIPES
from bench.pretrain.objectives import preprocess as make_dataset
from models.electra.model import ElectraPair, ElectraPairConfig
from pretrain import config as config_module
from pretrain import families
from pretrain.data import ShardedInstances, mask_dynamically, pad, read_rows
from pretrain.dynamic_masking import DynamicMasking
from pretrain.loop import to_device
from pretrain.recipe import resolve
from pretrain.train import build_model
from pretrain.weight_decay import parameter_groups

SEED = 1234
SPANBERT, DEBERTA, ELECTRA = (f"configs/pretrain/{name}.yaml"
                               for name in ("spanbert_base", "deberta_v3_small", "electra_small"))
# Two small books: their dataset is made in seconds yet holds enough full-length rows for 8 x 2 even at 512 tokens.
BOOKS = ("shakespeare-caesar.txt", "shakespeare-hamlet.txt")
FULL = {"rows": 8, "seq_len": 128, "rounds": 3, "steps": 2}
QUICK = {"rows": 2, "seq_len": 32, "rounds": 1, "steps": 1}


@dataclass
class Member:
    name: str
    what: str
    family: families.Family
    objective: nn.Module        # the family's loss module: what the engine would wrap and train
    optimizer: torch.optim.Optimizer
    clipping: float


def load_config(path: str, dataset: Path, overrides: list[str]):
    return config_module.load(str(record.REPO / path), [f"data.path={dataset}", *overrides])


def dataset_vocab(manifest) -> int:
    return -(-manifest.tokenizer.vocab_size // 8) * 8  # as pretrain.train.build_model rounds it


def build_member(name: str, path: str, overrides: list[str], dataset: Path, manifest,
                 make_model: Callable[[families.Family], nn.Module] | None = None, note: str = "") -> Member:
    """The config's family, model (seeded by the config's seed), loss module and AdamW."""
    cfg = load_config(path, dataset, overrides)
    resolve(cfg.objective, manifest)  # the config must accept the dataset, as a run's start-up checks
    family = families.for_config(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, manifest, family) if make_model is None else make_model(family)
    objective = family.loss_module(model).float().train()
    opt = cfg.optimizer
    optimizer = torch.optim.AdamW(parameter_groups(objective, opt.weight_decay), lr=opt.lr, betas=opt.betas,
                                  eps=opt.eps)
    what = " ".join([path, *(f"--set {o}" for o in overrides), *([note] if note else [])])
    return Member(name, what, family, objective, optimizer, cfg.train.gradient_clipping)


def widths(encoder_config) -> tuple[int, int, int]:
    return encoder_config.hidden_size, encoder_config.num_attention_heads, encoder_config.intermediate_size


def electra_at_deberta_sizes(dataset: Path, manifest) -> Member:
    """ELECTRA with DeBERTa-v3-small's widths by config keys and its depths set in code (see the docstring)."""
    vocab, pad_id = dataset_vocab(manifest), manifest.tokenizer.special_ids["[PAD]"]
    deberta = families.for_config(load_config(DEBERTA, dataset, [])).pair_config(vocab_size=vocab, pad_token_id=pad_id)

    def sized(family) -> ElectraPair:
        pair = family.pair_config(vocab_size=vocab, pad_token_id=pad_id)
        for part in ("discriminator", "generator"):
            ours, theirs = getattr(pair, part), getattr(deberta, part)
            if widths(ours) != widths(theirs):
                raise SystemExit(f"electra_base's {part} widths {widths(ours)} differ from deberta_v3_small's "
                                 f"{widths(theirs)}: the presets changed; update this benchmark")
        return ElectraPair(ElectraPairConfig(
            discriminator=replace(pair.discriminator, num_hidden_layers=depths[0]),
            generator=replace(pair.generator, num_hidden_layers=depths[1])))

    depths = (deberta.discriminator.num_hidden_layers, deberta.generator.num_hidden_layers)
    return build_member("electra_at_deberta_sizes", ELECTRA,
                        ["model.preset=electra_base", "electra.generator_fraction=1.0"], dataset, manifest, sized,
                        note=f"(depths set in code: discriminator {depths[0]}, generator {depths[1]} layers)")


# What each comparison builds (variant first), and whose masking recipe its rows get. Built one comparison at a
# time: BERT-base twice with AdamW state is ~3.5 GB.
COMPARISONS = {
    "spanbert_sbo": (SPANBERT, lambda d, m: [
        build_member("spanbert_sbo", SPANBERT, ["objective.span_boundary=true"], d, m),
        build_member("spanbert_mlm_only", SPANBERT, ["objective.span_boundary=false"], d, m)]),
    "deberta_v3_small": (DEBERTA, lambda d, m: [
        build_member("deberta_v3_small", DEBERTA, [], d, m), build_member("electra_small", ELECTRA, [], d, m),
        electra_at_deberta_sizes(d, m)]),
}


def make_batches(data: ShardedInstances, recipe_config: str, rows: int, seq_len: int, steps: int) -> list[dict]:
    """``steps`` micro-batches of ``rows`` full-length rows, masked and padded as the loader does."""
    lengths = data.lengths_of(np.arange(len(data)))
    full = np.flatnonzero(lengths == seq_len)
    if len(full) < rows * steps:
        raise SystemExit(f"{data.directory}: {len(full)} rows of {seq_len} tokens, fewer than {rows} x {steps}")
    chosen = np.random.default_rng(SEED).permutation(full)[:rows * steps]
    cfg = load_config(recipe_config, data.directory, [])
    masking = DynamicMasking.for_dataset(resolve(cfg.objective, data.manifest).dynamic_masking, data.tokenizer_dir,
                                         cfg.seed)
    batches = []
    for step in range(steps):
        ids = chosen[step * rows:(step + 1) * rows]
        block = mask_dynamically(data, read_rows(data, ids), ids, 0, masking)
        batch = pad(block, data.pad_id, limit=seq_len)
        # One micro-batch per global batch (world size 1, no accumulation): the loader's scales are 1 / count.
        batch.update(mlm_loss_scale=np.float32(1 / max(1, int(block.counts.sum()))),
                     token_loss_scale=np.float32(1 / int(block.lengths.sum())))
        batches.append(to_device(batch, torch.device("cpu")))
    return batches


def train_step(member: Member, batch: dict, step: int) -> tuple[float, torch.Tensor]:
    """One optimizer step; (loss, statistics). ``step`` picks ELECTRA's sampling seed, the same every round."""
    loss, stats = member.objective(**batch, **member.family.micro_batch_inputs(step=step, micro=0, rank=0))
    loss.backward()
    if member.clipping > 0:
        torch.nn.utils.clip_grad_norm_(member.objective.parameters(), member.clipping)
    member.optimizer.step()
    member.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach()), stats


def time_member(member: Member, batches: list[dict]) -> dict:
    """Wall and process CPU seconds (every thread) per step over ``batches``."""
    wall, cpu = time.perf_counter(), time.process_time()
    for step, batch in enumerate(batches):
        train_step(member, batch, step)
    return {"wall_s": round((time.perf_counter() - wall) / len(batches), 4),
            "cpu_s": round((time.process_time() - cpu) / len(batches), 4)}


def parameter_counts(objective: nn.Module) -> dict:
    """Trained parameters (shared ones once), then each network's as its modules hold them: ELECTRA's discriminator
    holds the embeddings it shares with its generator, DeBERTa's only E_Delta (it reads E_G, not owns it)."""
    def count(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    model = objective.model
    parts = {n: count(c) for n, c in model.named_children() if n in ("generator", "discriminator")}
    heads = {n: count(c) for n, c in objective.named_children() if n != "model" and count(c)}  # e.g. span_boundary
    return {"trained": count(objective), **(parts or {"model": count(model)}), **heads}


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def measure(members: list[Member], batches: list[dict], rounds: int, quiet_budget: float) -> dict:
    warmup = {m.name: train_step(m, batches[0], 0) for m in members}  # first-touch allocations, AdamW's state
    table, deadline = [], time.monotonic() + quiet_budget
    for r in range(rounds):
        # Other processes stall every OpenMP barrier: wait (within a budget) for quiet and record their load.
        row = {"load_before_cores": wait_for_quiet(max(0.0, min(30.0, deadline - time.monotonic())))}
        others = OtherProcesses()
        order = members[r % len(members):] + members[:r % len(members)]  # who goes first rotates
        row["order"] = [m.name for m in order]
        row.update({m.name: time_member(m, batches) for m in order})
        row["foreign_load_cores"] = round(others.cores(), 2)
        table.append(row)
    out = {"members": {}, "ratios": {}, "rounds": table}
    for m in members:
        loss, stats = warmup[m.name]
        out["members"][m.name] = {
            "config": m.what, "parameters": parameter_counts(m.objective),
            **{f"{key}_per_step": spread([row[m.name][key] for row in table]) for key in ("wall_s", "cpu_s")},
            "warmup_loss": loss, "warmup_summary": {k: round(v, 4) for k, v in m.family.summary(stats).items()}}
    variant = members[0].name
    for other in members[1:]:  # per round, so a drift of the machine between rounds cancels
        out["ratios"][f"{variant}/{other.name}"] = {
            key: spread([row[variant][key] / row[other.name][key] for row in table]) for key in ("wall_s", "cpu_s")}
    return out


def print_table(comparisons: dict) -> None:
    print(f"  {'member':<26}{'trained params':>15}{'wall s/step':>26}{'CPU s/step':>26}  variant / member")
    for name, result in comparisons.items():
        print(f"  {name}:")
        variant = next(iter(result["members"]))
        for member, m in result["members"].items():
            cells = [f"{s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]" for s in (m["wall_s_per_step"],
                                                                                    m["cpu_s_per_step"])]
            ratio = result["ratios"].get(f"{variant}/{member}")
            shown = (f"wall {ratio['wall_s']['median']:.2f}x, CPU {ratio['cpu_s']['median']:.2f}x" if ratio
                     else "(variant)")
            print(f"    {member:<24}{m['parameters']['trained']:>15,}{cells[0]:>26}{cells[1]:>26}  {shown}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.variants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, help=f"rows per micro-batch (default {FULL['rows']})")
    parser.add_argument("--seq-len", type=int, help=f"tokens per row (default {FULL['seq_len']})")
    parser.add_argument("--rounds", type=int, help=f"timed rounds (default {FULL['rounds']})")
    parser.add_argument("--steps", type=int, help=f"optimizer steps per member and round (default {FULL['steps']})")
    parser.add_argument("--threads", type=int, help="torch threads (default: the usable cores; --quick: "
                        "OMP_NUM_THREADS if set, else 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"{k} {v}" for k, v in
                                                                                    QUICK.items()))
    parser.add_argument("--work", type=Path, default=record.WORK / "variants")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    sizes = {k: getattr(args, k) or v for k, v in (QUICK if args.quick else FULL).items()}
    begun, machine = time.perf_counter(), record.machine_info()
    threads = args.threads or (int(os.environ.get("OMP_NUM_THREADS", "1")) if args.quick else machine["usable_cores"])
    torch.set_num_threads(threads)
    books = [str(args.data / "books" / name) for name in BOOKS]
    if missing := [b for b in books if not os.path.isfile(b)]:
        parser.error(f"missing {missing}; pass --data (the shared data with books/)")
    seq = sizes["seq_len"]
    switches = {**RECIPES["spanbert"][0], "mask_unit": "span", "max_seq_length": seq,
                "max_predictions_per_seq": max(1, math.ceil(0.15 * seq))}
    dataset = make_dataset(f"doc_sentences_seq{seq}", switches, [], books, args.work,
                           args.work / "logs" / f"preprocess-seq{seq}.log")
    data = ShardedInstances(dataset)
    print(f"rows: {record.shown(dataset)} ({len(data):,} rows); {threads} torch threads", flush=True)

    comparisons = {}
    for name, (recipe_config, build) in COMPARISONS.items():
        batches = make_batches(data, recipe_config, sizes["rows"], seq, sizes["steps"])
        members = build(dataset, data.manifest)
        comparisons[name] = {"masking_recipe_of": recipe_config,
                             "masked_tokens_per_step": [int(b["masked_labels"].numel()) for b in batches],
                             **measure(members, batches, sizes["rounds"], 0.0 if args.quick else 120.0)}
        print(f"{name}: done ({time.perf_counter() - begun:.0f} s)", flush=True)
        del members, batches
        gc.collect()  # free one comparison's models and optimizer state before the next is built

    results = {
        "benchmark": "variants", "date": record.utc_now(), "mode": "quick" if args.quick else "full",
        "command": record.command_line(), "machine": machine,
        "versions": record.versions(record.DISTRIBUTIONS["pretrain"], ("pretrain", "models", "common",
                                                                          "bench/pretrain/variants.py")),
        "config": {**sizes, "torch_threads": threads, "dtype": "float32", "warmup_steps_per_member": 1,
                   "seed_of_rows": SEED, "books": list(BOOKS)},
        "dataset": {"path": record.shown(dataset), "rows": len(data), "preprocess_switches": switches},
        "method": __doc__.split("\n\n", 1)[1].strip(), "comparisons": comparisons,
        "bench_wall_s": round(time.perf_counter() - begun, 1)}
    out_file = record.results_file(args.results, "variants", machine, "-quick" if args.quick else "")
    record.write_json(out_file, results)
    print(f"\nVariants step cost, {machine['slug']} ({machine['cpu_model']}), {results['mode']}, {threads} threads, "
          f"{sizes['rows']} rows x {seq} tokens, {sizes['rounds']} round(s) x {sizes['steps']} step(s); "
          "median [min-max] over rounds")
    print_table(comparisons)
    loads = {n: [r["foreign_load_cores"] for r in c["rounds"]] for n, c in comparisons.items()}
    print(f"  other processes' cores per round: {loads}")
    print(f"  results: {record.shown(out_file)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
