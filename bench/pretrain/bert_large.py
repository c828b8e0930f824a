"""BERT-Large through every stage on CPU, with the shipped phase configs and small batch overrides.

    python -m bench.pretrain.bert_large [--steps 6] [--resume-steps 3] [--phase2-steps 3] [--work DIR] [--data DIR]

1. phase 1 (configs/pretrain/bert_large_phase1_seq128.yaml): 2 ranks (torchrun), ZeRO 2, precision auto (bf16 where
   the CPU computes it natively, else fp32), AdamW, global
   batch 8 = micro-batch 4 x 2 ranks; a checkpoint at the end and the Hugging Face export;
2. resume on 1 rank from that checkpoint (converted to a universal checkpoint by the run) for a few more steps;
3. phase 2 (configs/pretrain/bert_large_phase2_seq512.yaml) initialised from the phase-1 run (``model.init_from``),
   2 ranks, global batch 4 = micro-batch 2 x 2 ranks;
4. the phase-2 export loaded by ``transformers.BertForPreTraining`` against our model on a real seq-512 batch
   (fp32, eval mode), and the offline export of its DeepSpeed checkpoint (``python -m pretrain.export``) against
   the run's own export;
5. ``python -m finetune glue`` on the phase-2 export: SST-2, 32 training and 32 dev examples, one epoch.

Measured: seconds per optimizer step (the first step of each run left out), each rank's peak RSS (the kernel's
high-water mark VmHWM, sampled until the rank exits), checkpoint bytes on disk, the save, universal conversion,
load and export seconds the runs record in summary.json, and the model-state memory estimate of
``pretrain.memory`` (what ``--dry-run`` prints) next to the measured peaks. Shards: built once under --work by
``python -m preprocess run`` (``bench.shards``). Writes bench/results/bert-large-<machine>.json.
Run it alone (two BERT-Large ranks take most of a small machine's memory; the peaks are in the results):
``flock /tmp/heavy.lock python -m bench.pretrain.bert_large``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import record
from bench.processes import RankPeaks, free_port
from bench.shards import ensure_dataset
from common import processes

PHASE1, PHASE2 = "configs/pretrain/bert_large_phase1_seq128.yaml", "configs/pretrain/bert_large_phase2_seq512.yaml"
RUN = "pretrain/run.py"
JOB_TIMEOUT_S = 4 * 3600  # a stage past this is stuck: its whole session is killed (BERT-Large on CPU is slow)
LOGITS_TOLERANCE = 1e-3  # max |ours - transformers| on fp32 logits of 24 layers: summation order only
COMMON = {"zero.stage": 2, "optimizer.name": "adamw", "optimizer.lr": 1e-4,
          "optimizer.torch_adam": "true", "checkpoint.every_steps": 0, "logging.log_every": 1,
          "logging.tensorboard": "false", "logging.progress": "false"}


def run_job(name: str, cmd: list[str], env: dict, logs: Path) -> dict:
    """Run ``cmd`` to completion (its output in logs/<name>.log); wall seconds and peak RSS per rank."""
    logs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(logs / f"{name}.log", "wb") as log, processes.started(cmd, cwd=record.REPO, env=env, stdout=log,
                                                                       stderr=subprocess.STDOUT) as process:
        sampler = RankPeaks(process)
        sampler.start()
        try:
            status = process.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            status = None  # leaving the block kills the launcher's whole session, its ranks included
        finally:
            sampler.done.set()
            sampler.join()
    wall = time.perf_counter() - started
    if status != 0:
        tail = (logs / f"{name}.log").read_text(errors="replace")[-4000:]
        why = f"timed out after {JOB_TIMEOUT_S} s" if status is None else f"failed with status {status}"
        sys.exit(f"{name} {why}:\n{tail}")
    return {"wall_s": round(wall, 1), "peak_rss_bytes_by_rank": {str(r): b for r, b in sorted(sampler.peaks.items())},
            "command": " ".join(os.path.relpath(c, record.REPO) if c.startswith(str(record.REPO)) else c for c in cmd)}


def environment(ranks: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    threads = max(1, (os.cpu_count() or 2) // ranks)  # one core per rank: oversubscribing stalls OpenMP barriers
    return {**env, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(record.REPO)}


def pretrain_command(config: str, ranks: int, settings: dict, *, resume: bool = False) -> list[str]:
    args = [RUN, "--config", config, *(["--resume"] if resume else []),
            *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")]]
    if ranks == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port()), *args]


def run_stats(out: Path, global_batch: int) -> dict:
    """Step seconds from metrics.jsonl (one record per step), the summary's timings and the checkpoint sizes."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = [global_batch / r["sequences_per_second"] for r in records]
    summary = json.loads((out / "summary.json").read_text())
    sizes = {c.name: sum(f.stat().st_size for f in c.rglob("*") if f.is_file())
             for c in sorted((out / "checkpoints").glob("step_*"))}
    universal = out / "checkpoints" / "universal"
    if universal.is_dir():
        sizes["universal"] = sum(f.stat().st_size for f in universal.rglob("*") if f.is_file())
    later = seconds[1:]
    return {"steps": [r["step"] for r in records], "step_s": [round(s, 2) for s in seconds],
            "step_s_mean_without_first": round(sum(later) / len(later), 2) if later else None,
            "losses": [round(r["loss"], 4) for r in records], "summary": summary, "checkpoint_bytes": sizes}


def compare_logits(hf_dir: Path, dataset: Path, rows: int) -> dict:
    """Our model and transformers' on the same export and a real batch, fp32, eval mode."""
    import numpy as np
    import torch
    import transformers

    from models.bert.hf import load_pretrained
    from pretrain.data import PretrainingLoader, ShardedInstances

    loader = PretrainingLoader(ShardedInstances(dataset), micro_batch=rows, accumulation=1, world_size=1, rank=0,
                               seed=7)
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in loader.next_step()[0].items()}
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    started = time.perf_counter()
    theirs = transformers.BertForPreTraining.from_pretrained(hf_dir).eval()
    load_theirs = time.perf_counter() - started
    ours = load_pretrained(hf_dir)[0].eval()
    with torch.no_grad():
        expected = theirs(**inputs)
        mlm, nsp = ours(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    mlm_diff = float((mlm[real] - expected.prediction_logits[real]).abs().max())
    nsp_diff = float((nsp - expected.seq_relationship_logits).abs().max())
    return {"rows": rows, "padded_width": int(inputs["input_ids"].shape[1]), "real_tokens": int(real.sum()),
            "mlm_logits_max_abs_diff": mlm_diff, "nsp_logits_max_abs_diff": nsp_diff,
            "mlm_logits_max_abs": float(expected.prediction_logits[real].abs().max()),
            "tolerance": LOGITS_TOLERANCE, "pass": max(mlm_diff, nsp_diff) <= LOGITS_TOLERANCE,
            "transformers_load_s": round(load_theirs, 1)}


def weights_diff(left: Path, right: Path) -> float:
    from safetensors.torch import load_file

    a, b = load_file(str(left / "model.safetensors")), load_file(str(right / "model.safetensors"))
    if a.keys() != b.keys():
        return float("inf")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def runtime_baseline(env: dict) -> int:
    """Peak RSS of a process that only imports what a rank imports (torch, DeepSpeed, the training loop)."""
    out = processes.run([sys.executable, "-m", "bench.stage_imports", "pretrain"], cwd=record.REPO, env=env,
                        capture_output=True, text=True, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_rss_bytes"]


def memory_check(config: str, overrides: dict, ranks: int, vocab: int, job: dict, baseline: int) -> dict:
    """The estimate next to the measured peaks, with the two known terms outside the model states: the runtime
    (baseline) and the fp32 copies each rank holds beside them: the model it builds before DeepSpeed casts it to
    16 bits (none in fp32), and with ``init_from`` the clone its weights are restored from."""
    from pretrain import config as config_module
    from pretrain import precision
    from pretrain.memory import estimate_for_run

    cfg = config_module.load(config, [f"{k}={v}" for k, v in overrides.items()])
    cfg, _ = precision.resolve_run(cfg, precision.cpu_hardware())  # as the run resolved it on this CPU
    found = estimate_for_run(cfg, ranks, vocab)
    total = found.device_bytes + found.host_bytes
    fp32_model = 4 * found.parameters * ((cfg.train.precision != "fp32") + bool(cfg.model.init_from))
    peaks = job["peak_rss_bytes_by_rank"]
    return {"world_size": ranks, "estimate_table": found.table().splitlines(), "estimate_bytes_per_rank": round(total),
            "estimate_paper_bytes_per_rank": round(found.paper_bytes),
            "measured_peak_rss_bytes_by_rank": peaks, "runtime_baseline_rss_bytes": baseline,
            "fp32_model_before_cast_bytes": fp32_model,
            "measured_minus_baseline_over_estimate": {r: round((b - baseline) / total, 2) for r, b in peaks.items()},
            "unaccounted_bytes_by_rank": {r: round(b - baseline - total - fp32_model) for r, b in peaks.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.bert_large", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="phase-1 steps on 2 ranks")
    parser.add_argument("--resume-steps", type=int, default=3, help="more steps after resuming on 1 rank")
    parser.add_argument("--phase2-steps", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs=2, default=(8, 4), metavar=("PHASE1", "PHASE2"),
                        help="global batch of phase 1 (and the resume) and of phase 2, split over 2 ranks (the test "
                             "runs 2 2: one sequence a rank, as the real size is the point there, not the rate)")
    parser.add_argument("--preset", default="large", help="model.preset of phase 1 (tiny: a smoke test of the script)")
    parser.add_argument("--work", type=Path, default=record.WORK / "bert-large")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    parser.add_argument("--keep-runs", action="store_true", help="keep every run directory (about 22 GB); by default "
                        "each is removed once measured and no longer needed (at most about 15 GB at a time)")
    args = parser.parse_args(argv)
    begun = time.perf_counter()
    machine = record.machine_info()
    datasets = {seq: ensure_dataset(seq, args.data, args.work) for seq in (128, 512)}
    vocab = json.loads((datasets[128][0] / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    runs, logs = args.work / "runs", args.work / "logs"
    shutil.rmtree(runs, ignore_errors=True)
    stages, stats, memory = {}, {}, {}

    def done_with(*paths: Path) -> None:
        for path in paths if not args.keep_runs else ():
            shutil.rmtree(path)

    baseline = runtime_baseline(environment(1))

    phase1 = {**COMMON, "model.preset": args.preset, "data.path": datasets[128][0], "output_dir": runs / "phase1",
              "train.max_steps": args.steps, "schedule.total_steps": args.steps,
              "train.global_batch_size": args.batch[0], "train.micro_batch_size": max(1, args.batch[0] // 2)}
    stages["phase1"] = run_job("phase1", pretrain_command(PHASE1, 2, phase1), environment(2), logs)
    stats["phase1"] = run_stats(runs / "phase1", args.batch[0])
    memory["phase1"] = memory_check(PHASE1, phase1, 2, vocab, stages["phase1"], baseline)
    print(f"phase 1: {stats['phase1']['step_s']} s/step, peaks {stages['phase1']['peak_rss_bytes_by_rank']}",
          flush=True)

    # Resume on 1 rank in a run directory of its own that holds the phase-1 checkpoint (hard links: no copy).
    resumed = runs / "resume-1rank"
    tag = max((runs / "phase1" / "checkpoints").glob("step_*")).name
    shutil.copytree(runs / "phase1" / "checkpoints" / tag, resumed / "checkpoints" / tag, copy_function=os.link)
    total = args.steps + args.resume_steps
    resume = {**phase1, "output_dir": resumed, "train.max_steps": total, "schedule.total_steps": total,
              "checkpoint.export_hf": "false"}
    stages["resume"] = run_job("resume-1rank", pretrain_command(PHASE1, 1, resume, resume=True), environment(1), logs)
    stats["resume"] = run_stats(resumed, args.batch[0])
    memory["resume"] = memory_check(PHASE1, resume, 1, vocab, stages["resume"], baseline)
    done_with(resumed)
    print(f"resume: {stats['resume']['step_s']} s/step, timings {stats['resume']['summary']['timings']}", flush=True)

    phase2 = {**COMMON, "data.path": datasets[512][0], "output_dir": runs / "phase2",
              "model.init_from": runs / "phase1", "train.max_steps": args.phase2_steps,
              "schedule.total_steps": args.phase2_steps, "train.global_batch_size": args.batch[1],
              "train.micro_batch_size": max(1, args.batch[1] // 2),
              "eval.target": "null"}  # the shards have no evaluation split (bench.shards): evaluation is off
    stages["phase2"] = run_job("phase2", pretrain_command(PHASE2, 2, phase2), environment(2), logs)
    stats["phase2"] = run_stats(runs / "phase2", args.batch[1])
    memory["phase2"] = memory_check(PHASE2, phase2, 2, vocab, stages["phase2"], baseline)
    done_with(runs / "phase1" / "checkpoints")  # phase1/hf stays: the phase-2 run's model config comes from it
    print(f"phase 2: {stats['phase2']['step_s']} s/step", flush=True)

    logits = compare_logits(runs / "phase2" / "hf", datasets[512][0], rows=4)
    print(f"logits vs transformers: {logits}", flush=True)
    offline = runs / "phase2-offline-export"
    stages["offline_export"] = run_job("offline-export", [sys.executable, "-m", "pretrain.export", str(runs / "phase2"),
                                                          str(offline)], environment(1), logs)
    export_diff = weights_diff(runs / "phase2" / "hf", offline)
    done_with(offline, runs / "phase2" / "checkpoints")

    finetune_out = runs / "finetune-sst2"
    finetune_cmd = [sys.executable, "-m", "finetune", "glue", "--checkpoint", str(runs / "phase2" / "hf"), "--tasks",
                    "sst2", "--data", str(args.data), "--output", str(finetune_out), "--set", "seeds=[1]",
                    *[a for s in ("glue.training.max_train_examples=32", "glue.training.max_eval_examples=32",
                                  "glue.training.epochs=1", "glue.training.batch_size=8",
                                  "glue.training.eval_batch_size=32", "glue.per_task={}") for a in ("--set", s)]]
    stages["finetune"] = run_job("finetune-sst2", finetune_cmd, environment(1), logs)
    report = json.loads((finetune_out / "report.json").read_text())
    done_with(runs)
    finetune = {"wall_s": stages["finetune"]["wall_s"],
                "tasks": [{**{k: t.get(k) for k in ("task", "mean", "seconds", "train_examples", "eval_examples")},
                           "steps": [r["steps"] for r in t["runs"]]} for t in report["results"]]}

    results = {
        "benchmark": "bert-large",
        "date": record.utc_now(),
        "command": record.command_line(),
        "machine": machine,
        "versions": record.versions((*record.DISTRIBUTIONS["pretrain"], "deepspeed"),
                                    ("pretrain", "preprocess", "finetune", "configs")),
        "datasets": {f"seq{seq}": {"path": os.path.relpath(d, record.REPO), **info}
                     for seq, (d, info) in datasets.items()},
        "settings": {"phase1": {k: str(v) for k, v in phase1.items()}, "resume": {k: str(v) for k, v in resume.items()},
                     "phase2": {k: str(v) for k, v in phase2.items()}, "finetune": finetune_cmd[3:]},
        "method": {"step_s": "global batch / sequences_per_second of each step's metrics.jsonl record; the mean leaves "
                             "out the first step of the run",
                   "peak_rss": f"VmHWM of each rank's process (kernel high-water mark), read every "
                               f"{RankPeaks.INTERVAL} s",
                   "save_s": "until every rank's files are written and the checkpoint is marked complete; no fsync, "
                             "so with free memory the bytes may still be in the page cache",
                   "timings": "summary.json of each run (rank 0): checkpoint save (all ranks written, published), "
                              "universal conversion (rank 0), DeepSpeed load, Hugging Face export",
                   "estimate": "pretrain.memory (as --dry-run prints it): model states only; the runtime baseline is "
                               "the peak RSS of a process that imports torch, DeepSpeed and pretrain.train",
                   "threads": "OMP_NUM_THREADS = cores / ranks"},
        "stages": stages, "runs": stats, "memory": memory, "logits": logits,
        "offline_export": {"wall_s": stages["offline_export"]["wall_s"],
                           "weights_max_abs_diff_vs_run_export": export_diff},
        "finetune": finetune, "bench_wall_s": round(time.perf_counter() - begun, 1),
    }
    suffix = "" if args.preset == "large" else f"-{args.preset}"
    out_file = record.results_file(args.results, "bert-large", machine, suffix)
    record.write_json(out_file, results)

    gib = lambda b: f"{b / 2 ** 30:.2f} GiB"  # noqa: E731
    p1, rs, p2 = stats["phase1"], stats["resume"], stats["phase2"]
    print(f"\nBERT-Large on CPU ({machine['slug']}, {machine['cpu_model']}), {results['bench_wall_s']} s in all")
    for name, label in (("phase1", f"phase 1, 2 ranks, seq 128, batch {args.batch[0]}"),
                        ("resume", f"resumed, 1 rank, batch {args.batch[0]}"),
                        ("phase2", f"phase 2, 2 ranks, seq 512, batch {args.batch[1]}")):
        peaks = ", ".join(gib(b) for b in stages[name]["peak_rss_bytes_by_rank"].values())
        print(f"  {label}: {stats[name]['step_s_mean_without_first']} s/step (first step left out), peak RSS "
              f"{peaks}; estimate of model states {gib(memory[name]['estimate_bytes_per_rank'])} per rank")
    print(f"  checkpoint: {gib(max(v for k, v in p1['checkpoint_bytes'].items() if k != 'universal'))}, saved in "
          f"{p1['summary']['timings']['checkpoint_save_s']} s; universal conversion "
          f"{rs['summary']['timings']['universal_conversion_s']} s ({gib(rs['checkpoint_bytes']['universal'])}), load "
          f"{rs['summary']['timings']['checkpoint_load_s']} s; export {p1['summary']['timings'].get('export_hf_s')} s")
    print(f"  logits vs transformers: MLM {logits['mlm_logits_max_abs_diff']:.2e}, NSP "
          f"{logits['nsp_logits_max_abs_diff']:.2e} (tolerance {LOGITS_TOLERANCE:g}: "
          f"{'PASS' if logits['pass'] else 'FAIL'}); offline export = run export within {export_diff:.1e}")
    print(f"  finetune (SST-2, 32 examples): {stages['finetune']['wall_s']} s, {finetune['tasks']}")
    print(f"  results: {record.shown(out_file)}; phase-2 loss {p2['losses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
