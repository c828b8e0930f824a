"""Soak: a long tiny run must not grow in memory, open files, threads or disk beyond what it keeps.

    python -m bench.soak [--steps 5000] [--every 50] [--epochs 1000] [--work bench/work/soak]

1. Pretraining: the tiny preset (global batch 8) on a synthetic dataset in the real format (seq 128), ``--steps``
   optimizer steps with a checkpoint every ``--every`` steps (``checkpoint.keep_last: 2``), metrics every 10 steps
   and TensorBoard on, one rank started as users start one (``python pretrain/run.py``), its Hugging Face export at
   the end.
2. Finetuning: that export finetuned on SST-2 (a 64-example slice of the real GLUE data; a task without a
   per-task epoch count in the default config) for ``--epochs`` epochs,
   evaluated on dev after every epoch and the best epoch kept (``select_best_epoch``): as many evaluations.

While each runs, its process tree is sampled every second: the summed resident memory, open file descriptors,
threads and processes, and the bytes and files under the run's output directory. Growth is judged after a warm-up
(the first fifth of the samples: the first checkpoints, the allocator's first plateaus; for pretraining, of the
samples taken between its first and last logged step): the largest value of the last half against the largest of
the first half, and a least-squares slope per thousand steps (or epochs). The run's own checks are recorded
beside: the checkpoints left (``keep_last``) and the run's exit.
Writes ``bench/results/soak-<machine>.json``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from bench.processes import child_env
from bench.record import REPO, RESULTS, SHARED_DATA, WORK, machine_info, results_file, versions, write_json
from common import processes

SAMPLE_EVERY_S = 1.0
# One thread: what is soaked is the machinery, not the GEMMs, and it keeps its pace on a machine shared with others.
ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
WARM_UP_SHARE = 0.2
KEYS = ("rss_bytes", "open_files", "threads", "processes", "disk_bytes", "disk_files")


def tree_sample(pid: int) -> dict | None:
    """The process tree under ``pid`` right now; None once it has exited."""
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    out = dict.fromkeys(("rss_bytes", "open_files", "threads", "processes"), 0)
    for proc in members:
        try:
            with proc.oneshot():
                out["rss_bytes"] += proc.memory_info().rss
                out["open_files"] += proc.num_fds()
                out["threads"] += proc.num_threads()
                out["processes"] += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a short-lived worker gone between listing and reading
    return out


def directory_usage(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path`` (0, 0 before it exists); files that vanish while walking are skipped."""
    total = files = 0
    if path.exists():
        for item in path.rglob("*"):
            try:
                if item.is_file() and not item.is_symlink():
                    total += item.stat().st_size
                    files += 1
            except OSError:
                continue  # renamed or removed (a checkpoint published or pruned) while walking
    return total, files


class Sampler(threading.Thread):
    """Samples a running child's tree and its output directory until the child exits or ``stop`` is set."""

    def __init__(self, pid: int, output: Path, progress=None, interval: float = SAMPLE_EVERY_S):
        super().__init__(daemon=True)
        self.pid, self.output, self.progress, self.interval = pid, output, progress, interval
        self.stop = threading.Event()
        self.samples: list[dict] = []
        self.started = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            tree = tree_sample(self.pid)
            if tree is None:
                return
            disk_bytes, disk_files = directory_usage(self.output)
            self.samples.append({"t": round(time.monotonic() - self.started, 2), **tree,
                                 "disk_bytes": disk_bytes, "disk_files": disk_files,
                                 "progress": self.progress() if self.progress else None})
            self.stop.wait(self.interval)


def growth(samples: list[dict], key: str, progress: list[float] | None = None) -> dict:
    """How ``key`` moved after the warm-up: the last half's largest value against the first half's, and a
    least-squares slope per 1,000 units of ``progress`` (steps or epochs at each sample; seconds without it)."""
    values = np.array([s[key] for s in samples], dtype=np.float64)
    x = np.array(progress if progress is not None else [s["t"] for s in samples], dtype=np.float64)
    start = int(len(values) * WARM_UP_SHARE)
    values, x = values[start:], x[start:]
    if len(values) < 4:
        raise ValueError(f"{len(values)} samples after the warm-up: the run was too short to judge growth")
    half = len(values) // 2
    first, last = float(values[:half].max()), float(values[half:].max())
    slope = float(np.polyfit(x, values, 1)[0]) * 1000 if np.ptp(x) > 0 else 0.0
    return {"first_half_max": first, "last_half_max": last, "ratio": last / first if first else None,
            "slope_per_1000": slope, "samples": len(values)}


def last_step(metrics: Path, key: str = "step") -> int:
    """``key`` (the step, the epoch) of the last complete record of a JSONL log (0 before the first)."""
    try:
        with open(metrics, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - 4096))
            lines = [line for line in handle.read().splitlines() if line.strip()]
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)[key])
        except (ValueError, KeyError):
            continue  # the first, cut line of the tail, or one being written
    return 0


def watched(cmd: list[str], output: Path, logs: Path, timeout: float, progress=None) -> tuple[int, list[dict], float]:
    """Run ``cmd`` (its session killed on timeout), sampled; (exit status, samples, wall seconds)."""
    started = time.time()
    with open(logs, "wb") as log, processes.started(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                                     env=child_env() | ENV) as child:
        sampler = Sampler(child.pid, output, progress)
        sampler.start()
        try:
            status = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            sys.exit(f"{cmd[1]} ran past {timeout} s; its session is killed (log: {logs})")
        finally:
            sampler.stop.set()
            sampler.join()
    return status, sampler.samples, time.time() - started


def soak_pretraining(work: Path, steps: int, every: int) -> dict:
    from bench.shards import vocab_path
    from preprocess.synthetic import SyntheticSpec, write_synthetic

    dataset, out = work / "dataset", work / "pretrain"
    if not (dataset / "manifest.json").is_file():
        write_synthetic(SyntheticSpec(rows=20000, max_seq_length=128), str(vocab_path()), dataset)
    settings = {"data.path": dataset, "output_dir": out, "train.max_steps": steps, "schedule.total_steps": steps,
                "schedule.warmup_steps": steps // 10, "checkpoint.every_steps": every, "checkpoint.keep_last": 2,
                "logging.log_every": 10, "logging.tensorboard": "true", "train.precision": "fp32",
                # small steps: what is soaked is the run's machinery (loader, checkpoints, logs) over many steps
                "train.global_batch_size": 8, "train.micro_batch_size": 8}
    cmd = [sys.executable, "pretrain/run.py", "--config", "configs/pretrain/tiny.yaml",
           *[arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]]
    status, samples, wall = watched(cmd, out, work / "pretrain.log", timeout=6 * 3600,
                                    progress=lambda: last_step(out / "metrics.jsonl"))
    training = [s for s in samples if 0 < s["progress"] < steps]  # not start-up, nor the export after the last step
    steps_at = [s["progress"] for s in training]
    left = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    return {"exit_status": status, "steps": steps, "checkpoint_every": every, "checkpoints_written": steps // every,
            "checkpoints_left": left, "wall_s": round(wall, 1), "sample_every_s": SAMPLE_EVERY_S,
            "growth_per_1000_steps": {key: growth(training, key, steps_at) for key in KEYS},
            "series": _thinned(samples)}


def soak_finetuning(work: Path, epochs: int, data: Path) -> dict:
    out = work / "finetune"
    overrides = {"glue.training.epochs": epochs, "glue.training.max_train_examples": 64,
                 "glue.training.max_eval_examples": 64, "glue.training.batch_size": 32, "seeds": "[1]",
                 "glue.training.precision": "fp32"}
    cmd = [sys.executable, "-m", "finetune", "glue", "--checkpoint", str(work / "pretrain"), "--tasks", "sst2",
           "--data", str(data), "--output", str(out),
           *[arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]]
    log = out / "logs" / "sst2-seed1.jsonl"  # the trainer's record of every step and evaluation
    status, samples, wall = watched(cmd, out, work / "finetune.log", timeout=3 * 3600,
                                    progress=lambda: last_step(log, "epoch"))
    report = json.loads((out / "report.json").read_text()) if status == 0 else {}
    trained = [epochs_run(r) for r in report.get("results", [])]
    if status == 0 and trained != [epochs]:
        sys.exit(f"finetuning ran {trained} epochs, not {epochs}: see {out / 'report.json'}")
    training = [s for s in samples if 0 < s["progress"] < epochs - 1]  # not start-up, nor the report at the end
    return {"exit_status": status, "epochs": epochs, "evaluations": epochs, "wall_s": round(wall, 1),
            "growth_per_1000_epochs": {key: growth(training, key, [s["progress"] for s in training]) for key in KEYS},
            "series": _thinned(samples)}


def epochs_run(result: dict) -> int | None:
    """How many epochs (each with its dev evaluation) a task's report entry says every seed trained."""
    counts = {len(run.get("history", [])) for run in result.get("runs", [])}
    return counts.pop() if len(counts) == 1 else None


def _thinned(samples: list[dict], keep: int = 200) -> list[dict]:
    """At most ``keep`` samples, evenly spaced, for the results file."""
    if len(samples) <= keep:
        return samples
    return [samples[int(i)] for i in np.linspace(0, len(samples) - 1, keep)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--epochs", type=int, default=1000, help="finetuning epochs, one evaluation each")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="holds glue/RTE")
    parser.add_argument("--work", type=Path, default=WORK / "soak")
    parser.add_argument("--stages", default="pretraining,finetuning",
                        help="finetuning alone reuses the pretraining run under --work and its recorded figures")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    machine = machine_info()
    path = results_file(RESULTS, "soak", machine)
    result = json.loads(path.read_text()) if "pretraining" not in stages and path.is_file() else {}
    result.update({"benchmark": "soak", "machine": machine,
                   "versions": versions(("torch", "deepspeed", "transformers", "numpy", "psutil"),
                                        ("pretrain", "finetune", "models", "common", "bench/soak.py"))})
    if "pretraining" in stages:
        shutil.rmtree(args.work / "pretrain", ignore_errors=True)
        result["pretraining"] = soak_pretraining(args.work, args.steps, args.every) | {
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if "finetuning" in stages:
        shutil.rmtree(args.work / "finetune", ignore_errors=True)
        result["finetuning"] = soak_finetuning(args.work, args.epochs, args.data) | {
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_json(path, result)
    for stage, per in (("pretraining", "growth_per_1000_steps"), ("finetuning", "growth_per_1000_epochs")):
        part = result[stage]
        print(f"{stage}: exit {part['exit_status']}, {part['wall_s']} s")
        for key, g in part[per].items():
            print(f"  {key}: first half max {g['first_half_max']:.0f}, last half max {g['last_half_max']:.0f}, "
                  f"slope {g['slope_per_1000']:.1f} per 1000")
    print(f"wrote {path}")
    return 0 if all(result[s]["exit_status"] == 0 for s in ("pretraining", "finetuning")) else 1


if __name__ == "__main__":
    sys.exit(main())
