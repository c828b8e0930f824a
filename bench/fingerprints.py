"""Fingerprints of what the pipeline makes, to show that a change of layout changed nothing it computes.

    python -m bench.fingerprints --out before.json          # on the code before the move
    python -m bench.fingerprints --out after.json --against before.json

Runs, from the bundled samples (``samples/``), on this CPU:
1. the README's demo (``scripts/demo.sh``'s commands without its installs): the tokenizer, the dataset (2 Beam
   workers), the tiny BERT on 2 ranks and its export, the finetuning report on the bundled GLUE sample;
2. one run of each other family with the shipped configs made tiny on 1 rank: ALBERT (``albert_base.yaml``,
   ``albert_tiny``, SOP rows), ELECTRA (``electra_small.yaml``, ``electra_tiny``, unmasked rows) and DistilBERT-style
   distillation (``distilbert_base.yaml``, the demo's BERT as the teacher, RoBERTa's packed rows).

Records the sha256 of every shard, the loss of every logged step, the sha256 of every exported ``model.safetensors``
and the finetuning report without its times and paths. ``--against`` lists every difference and exits 1 if there is
one. The runs use fixed seeds; where the CPU computes bf16 natively the demo's ``precision: auto`` picks bf16, so
compare fingerprints made on the same kind of CPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from bench import record
from bench.processes import free_port
from common import processes

SAMPLES = record.REPO / "samples"
STEP_TIMEOUT_S = 1200
TINY_RUN = {"train.max_steps": 6, "schedule.total_steps": 6, "schedule.warmup_steps": 1,
            "train.global_batch_size": 16, "train.micro_batch_size": 8, "data.window_batches": 1,
            "model.max_position_embeddings": 128, "train.precision": "fp32", "optimizer.torch_adam": "true",
            "checkpoint.every_steps": 0, "checkpoint.export_hf": "true", "logging.log_every": 1,
            "logging.tensorboard": "false", "logging.progress": "false"}
FAMILIES = {  # name -> (pretraining config, its tiny settings, preprocessing config of its rows)
    "albert": ("albert_base.yaml", {"model.preset": "albert_tiny", "optimizer.lr": 3e-3}, "albert_sop_seq128.yaml"),
    "electra": ("electra_small.yaml", {"model.preset": "electra_tiny"}, "electra_seq128.yaml"),
    "distillation": ("distilbert_base.yaml", {"distillation.student_layers": 1}, "roberta_seq512.yaml"),
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run(argv: list[str], log: Path) -> None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(record.REPO)}
    with open(log, "w") as out:
        result = processes.run(argv, cwd=record.REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                               timeout=STEP_TIMEOUT_S)
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} ... failed (status {result.returncode}); its log: {log}\n"
                 + log.read_text(errors="replace")[-3000:])


def preprocess(config: str, tokenizer: Path, output: Path, log: Path, *settings: str) -> dict:
    run([sys.executable, "-m", "preprocess", "run", "--config", f"configs/preprocess/{config}",
         "--wikipedia", str(SAMPLES / "wikipedia"), "--books", str(SAMPLES / "books"), "--tokenizer", str(tokenizer),
         "--output", str(output), "--overwrite", "--direct_num_workers", "2", "--direct_running_mode",
         "multi_processing", *[a for s in settings for a in ("--set", s)]], log)
    manifest = json.loads((output / "manifest.json").read_text())
    return {"rows": manifest["rows"], "shards": {s["name"]: sha256(output / s["name"]) for s in manifest["shards"]}}


def pretraining(out: Path) -> dict:
    losses = [json.loads(line).get("loss") for line in (out / "metrics.jsonl").read_text().splitlines()]
    weights = {str(p.relative_to(out)): sha256(p) for p in sorted(out.glob("hf/**/model.safetensors"))}
    return {"losses": losses, "model.safetensors": weights}


def report(directory: Path) -> dict:
    found = json.loads((directory / "report.json").read_text())
    return {"glue_average": found.get("glue_average"),
            "results": [{"task": r["task"], "per_seed": [run.get("metrics") for run in r["runs"]]}
                        for r in found["results"]]}


def fingerprints(work: Path) -> dict:
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tokenizer, dataset, pretrain = work / "tokenizer", work / "dataset", work / "pretrain"
    run([sys.executable, "-m", "preprocess", "tokenizer", "train", "--input", str(SAMPLES / "wikipedia"),
         str(SAMPLES / "books"), "--vocab-size", "2000", "--lowercase", "--output", str(tokenizer)],
        logs / "tokenizer.log")
    found = {"tokenizer": {p.name: sha256(p) for p in sorted(tokenizer.iterdir()) if p.is_file()},
             "demo": {"dataset": preprocess("tiny.yaml", tokenizer, dataset, logs / "dataset.log")}}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         "pretrain/run.py", "--config", "configs/pretrain/tiny.yaml", "--set", f"data.path={dataset}",
         "--set", f"output_dir={pretrain}", "--set", "logging.progress=false"], logs / "pretrain.log")
    found["demo"]["pretrain"] = pretraining(pretrain)
    run([sys.executable, "-m", "finetune", "suite", "--checkpoint", str(pretrain), "--tasks", "sst2,rte", "--data",
         str(SAMPLES), "--config", "configs/finetune/tiny.yaml", "--output", str(work / "finetune")],
        logs / "finetune.log")
    found["demo"]["finetune"] = report(work / "finetune")
    for name, (config, tiny, rows) in FAMILIES.items():
        data = work / f"{name}-dataset"
        found[name] = {"dataset": preprocess(rows, tokenizer, data, logs / f"{name}-dataset.log",
                                             "instances.max_seq_length=128", "output.num_shards=2")}
        settings = {**TINY_RUN, **tiny, "data.path": data, "output_dir": work / name}
        if name == "distillation":
            settings["distillation.teacher"] = pretrain / "hf"
        run([sys.executable, "pretrain/run.py", "--config", f"configs/pretrain/{config}",
             *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")]], logs / f"{name}.log")
        found[name]["pretrain"] = pretraining(work / name)
    return found


def differences(before, after, where: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        return [d for key in sorted(set(before) | set(after), key=str)
                for d in differences(before.get(key), after.get(key), f"{where}.{key}" if where else str(key))]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in differences(b, a, f"{where}[{i}]")]
    return [] if before == after else [f"{where}: {before!r} -> {after!r}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where to write the fingerprints (JSON)")
    parser.add_argument("--against", type=Path, help="earlier fingerprints: list every difference, exit 1 if any")
    parser.add_argument("--work", type=Path, default=record.WORK / "fingerprints")
    args = parser.parse_args(argv)
    found = {"measured_at": record.utc_now(), "machine": record.machine_info(),
             "versions": record.versions(record.DISTRIBUTIONS["pretrain"], ["common", "preprocess", "pretrain",
                                                                              "finetune"]),
             "fingerprints": fingerprints(args.work)}
    record.write_json(args.out, found)
    print(f"fingerprints: {args.out}")
    if args.against:
        changed = differences(json.loads(args.against.read_text())["fingerprints"], found["fingerprints"])
        print("\n".join(changed) if changed else f"identical to {args.against}")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
