"""Deployment benchmark on CPU: inference of exported encoders through ``transformers`` and through ONNX Runtime.

    python -m bench.finetune.deployment [--size base|tiny] [--models bert,distilled,albert,electra] [--repeats 3]
                                        [--threads 2] [--seq 128] [--latency-warmup 3] [--latency-iterations 20]
                                        [--throughput-batch 32] [--throughput-warmup 1] [--throughput-iterations 2]
                                        [--reuse-exports]
                                        [--work DIR] [--results DIR]

Models (``bench.finetune.deployment_models``; random weights: speed, size and memory do not depend on their
values): the distillation teacher (BERT-base, 12x768) and the student of ``configs/pretrain/distilbert_base.yaml``
(6x768, initialised from teacher layers 0, 2, ..., 10), and ALBERT-base and ELECTRA-base beside BERT-base, every one
written by our own export code as a Hugging Face directory. Each is exported from ``transformers.AutoModel`` to ONNX
with ``torch.onnx.export`` and its ONNX Runtime outputs are checked against ``transformers``' (every output element
within ``TOLERANCE``) before anything is timed; a model that fails the check is not timed.

Each measurement is a fresh process (``bench.finetune.deployment_child``, started with ``common.processes.run`` so
a timeout kills its whole group): it loads one model in one runtime, runs warm-up iterations, then times each
iteration of one shape, and reports its kernel high-water mark of resident memory (VmHWM: imports, model and
activations of that runtime). Latency: batch 1, the median iteration. Throughput: batch ``--throughput-batch``
(32), sequences per second over the timed iterations. Every measurement is repeated ``--repeats`` times, the models
and runtimes interleaved (the order reversed on odd repeats) so that drift of a shared machine hits all alike; the
figures are medians over the repeats, with the smallest and largest. Threads: ``--threads`` intra-op threads in
both runtimes (torch.set_num_threads; ONNX Runtime's intra_op_num_threads), one inter-op thread, and
OMP_NUM_THREADS / MKL_NUM_THREADS set to the same in each child.

Writes bench/results/deployment-<machine>[-tiny].json and prints the Markdown tables of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import record
from bench.cpu import CONTENDED_LOAD, OtherProcesses
from bench.finetune import deployment_models as models
from bench.processes import child_env
from common import processes

DISTRIBUTIONS = ("torch", "transformers", "onnxruntime", "onnx", "onnxscript", "numpy", "safetensors")
CODE = ("bench/finetune", "models", "pretrain/families/distillation.py")
RUNTIMES = ("torch", "onnxruntime")
DISTILLATION_RESULTS = record.RESULTS / "distillation-cpu2-x86_64.json"
# DistilBERT (Sanh et al. 2019): 40% fewer parameters, 60% faster inference (CPU, batch 1), 97% of BERT-base's
# GLUE score.
PAPER = {"smaller_percent": 40, "faster_percent": 60, "score_percent": 97}


@dataclass(frozen=True)
class Settings:
    """Everything that decides a run; saved whole in the results."""

    size: str = "base"
    models: tuple[str, ...] = models.MODELS
    seq: int = 128
    threads: int = 2
    repeats: int = 3
    latency_batch: int = 1
    latency_warmup: int = 3
    latency_iterations: int = 20
    throughput_batch: int = 32
    throughput_warmup: int = 1
    throughput_iterations: int = 2
    child_timeout_s: float = 900.0
    reuse_exports: bool = False         # keep the exports and ONNX files of an earlier run (checked again all the same)

    def __post_init__(self):
        if self.size not in models.PRESETS:
            raise ValueError(f"size {self.size!r} is not one of {', '.join(models.PRESETS)}")
        unknown = sorted(set(self.models) - set(models.MODELS))
        if unknown or not self.models:
            raise ValueError(f"models: unknown {unknown}; choose from {', '.join(models.MODELS)}")
        if min(self.seq, self.threads, self.repeats, self.latency_iterations, self.throughput_iterations) < 1:
            raise ValueError("seq, threads, repeats and iterations must be at least 1")


def prepare(settings: Settings, work: Path) -> dict[str, dict]:
    """The exports and their ONNX files, each checked against ``transformers``; sizes on disk."""
    exported = models.build_exports(settings.size, work, tuple(settings.models), reuse=settings.reuse_exports)
    for name, entry in exported.items():
        hf_dir = Path(entry["hf_dir"])
        onnx_path = hf_dir / "onnx" / "model.onnx"
        entry["onnx"] = str(onnx_path)
        if settings.reuse_exports and onnx_path.is_file():
            entry["onnx_export"] = {"reused": True, "opset": models.onnx_opset(onnx_path)}
        else:
            entry["onnx_export"] = models.export_onnx(hf_dir, onnx_path, settings.seq)
        entry["onnx_check"] = models.verify_onnx(hf_dir, onnx_path, settings.seq, settings.threads)
        entry["config"] = json.loads((hf_dir / "config.json").read_text())
        entry["safetensors_bytes"] = models.bytes_on_disk(hf_dir / "model.safetensors")
        entry["onnx_bytes"] = models.bytes_on_disk(onnx_path.parent)  # with any external-data file beside it
        print(f"{name}: ONNX within {entry['onnx_check']['max_abs_diff']:.2e} of transformers "
              f"(tolerance {models.TOLERANCE:g})", flush=True)
    return exported


def measure(settings: Settings, model: dict, runtime: str, kind: str) -> dict:
    """One fresh child process: one model, one runtime, one shape; its report and the load of other processes."""
    batch, warmup, iterations = (
        (settings.latency_batch, settings.latency_warmup, settings.latency_iterations) if kind == "latency" else
        (settings.throughput_batch, settings.throughput_warmup, settings.throughput_iterations))
    path = model["hf_dir"] if runtime == "torch" else model["onnx"]
    command = [sys.executable, "-m", "bench.finetune.deployment_child", "--runtime", runtime, "--model", path,
               "--batch", str(batch), "--seq", str(settings.seq), "--threads", str(settings.threads),
               "--warmup", str(warmup), "--iterations", str(iterations)]
    threads = str(settings.threads)
    env = child_env() | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    others, started = OtherProcesses(), time.perf_counter()
    done = processes.run(command, timeout=settings.child_timeout_s, capture_output=True, text=True, env=env,
                         cwd=record.REPO)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    times = report["iterations_s"]
    report["median_s"] = statistics.median(times)
    report["sequences_per_s"] = batch * len(times) / sum(times)
    report["child_wall_s"] = round(wall, 2)
    report["foreign_load_cores"] = round(others.cores(children_cpu_s=report["cpu_s"]), 3)
    report["contended"] = report["foreign_load_cores"] > CONTENDED_LOAD
    return report


def run_measurements(settings: Settings, exported: dict[str, dict]) -> list[dict]:
    """Every model x runtime x kind, ``repeats`` times, interleaved; the order reversed on odd repeats."""
    plan = [(name, runtime, kind) for kind in ("latency", "throughput") for name in exported for runtime in RUNTIMES]
    out = []
    for repeat in range(settings.repeats):
        for name, runtime, kind in (plan if repeat % 2 == 0 else plan[::-1]):
            result = measure(settings, exported[name], runtime, kind)
            out.append({"model": name, "kind": kind, "repeat": repeat, **result})
            print(f"repeat {repeat} {name:9} {runtime:11} {kind:10} median {result['median_s'] * 1e3:9.1f} ms  "
                  f"{result['sequences_per_s']:7.2f} seq/s  peak {result['peak_rss_bytes'] / 2**20:6.0f} MiB  "
                  f"others {result['foreign_load_cores']:.2f} cores", flush=True)
    return out


def _spread(values: list[float], digits: int) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "n": len(values)}


def summarise(exported: dict[str, dict], measurements: list[dict]) -> dict:
    """Per model and runtime: latency (ms), throughput (seq/s), peak RSS (MiB) as median/min/max over the repeats;
    sizes on disk and parameters."""
    summary = {}
    for name, entry in exported.items():
        summary[name] = {"safetensors_mib": round(entry["safetensors_bytes"] / 2**20, 1),
                         "onnx_mib": round(entry["onnx_bytes"] / 2**20, 1), "runtimes": {}}
        for runtime in RUNTIMES:
            rows = [m for m in measurements if m["model"] == name and m["runtime"] == runtime]
            latency = [m for m in rows if m["kind"] == "latency"]
            throughput = [m for m in rows if m["kind"] == "throughput"]
            summary[name]["runtimes"][runtime] = {
                "latency_ms": _spread([m["median_s"] * 1e3 for m in latency], 1),
                "throughput_seq_per_s": _spread([m["sequences_per_s"] for m in throughput], 2),
                "peak_rss_mib_latency": _spread([m["peak_rss_bytes"] / 2**20 for m in latency], 0),
                "peak_rss_mib_throughput": _spread([m["peak_rss_bytes"] / 2**20 for m in throughput], 0),
                "rss_before_load_mib": _spread([m["rss_before_load_bytes"] / 2**20 for m in rows], 0),
                "contended_measurements": sum(m["contended"] for m in rows),
            }
            if runtime == "torch":
                summary[name]["parameters"] = rows[0]["parameters"]
    return summary


def distillation_scores(path: Path = DISTILLATION_RESULTS) -> dict | None:
    """The student's score as a share of its teacher's, from the distillation benchmark's recorded results
    (``bench.pretrain.distillation``; not retrained here), per task and metric."""
    if not path.is_file():
        return None
    results = json.loads(path.read_text())["results"]
    teacher, student = results["teacher"]["glue"], results["distilled"]["glue"]
    shares = {f"{task}.{metric}": {"teacher": value["mean"], "student": student[task][metric]["mean"],
                                   "percent": round(100 * student[task][metric]["mean"] / value["mean"], 1)}
              for task, metrics in teacher.items() for metric, value in metrics.items()}
    return {"results_file": record.shown(path), "teacher": "MiniLM-L6-H384 (fitted MLM head)",
            "student_layers": json.loads(path.read_text()).get("student_layers"), "scores": shares}


def against_paper(summary: dict, scores: dict | None) -> dict | None:
    """The student against the teacher, beside DistilBERT's claims: fewer parameters, smaller files, faster at
    batch 1 (teacher latency / student latency - 1, the paper's sense of "60% faster"), higher throughput."""
    if "bert" not in summary or "distilled" not in summary:
        return None
    teacher, student = summary["bert"], summary["distilled"]
    ours = {f"smaller_percent_{what}": round(100 * (1 - student[key] / teacher[key]), 1)
            for what, key in (("parameters", "parameters"), ("safetensors", "safetensors_mib"), ("onnx", "onnx_mib"))}
    for runtime in RUNTIMES:
        t, s = teacher["runtimes"][runtime], student["runtimes"][runtime]
        ours[f"faster_percent_latency_{runtime}"] = round(
            100 * (t["latency_ms"]["median"] / s["latency_ms"]["median"] - 1), 1)
        ours[f"faster_percent_throughput_{runtime}"] = round(
            100 * (s["throughput_seq_per_s"]["median"] / t["throughput_seq_per_s"]["median"] - 1), 1)
    return {"paper": PAPER, "ours": ours, "score": scores}


def tables(summary: dict, settings: Settings) -> str:
    """The Markdown tables of docs/benchmarks.md."""
    head = (f"| model | params | safetensors | ONNX | runtime | latency, batch {settings.latency_batch} (ms) | "
            f"throughput, batch {settings.throughput_batch} (seq/s) | peak RSS b1 / b{settings.throughput_batch} "
            "(MiB) |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for name, entry in summary.items():
        for runtime, figures in entry["runtimes"].items():
            lat, thr = figures["latency_ms"], figures["throughput_seq_per_s"]
            lines.append(f"| {name} | {entry['parameters'] / 1e6:.1f} M | {entry['safetensors_mib']:.0f} MiB | "
                         f"{entry['onnx_mib']:.0f} MiB | {runtime} | {lat['median']:.1f} ({lat['min']:.1f}–"
                         f"{lat['max']:.1f}) | {thr['median']:.2f} ({thr['min']:.2f}–{thr['max']:.2f}) | "
                         f"{figures['peak_rss_mib_latency']['median']:.0f} / "
                         f"{figures['peak_rss_mib_throughput']['median']:.0f} |")
    return "\n".join(lines)


def run(settings: Settings, work: Path, results: Path) -> Path:
    machine, started = record.machine_info(), time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    exported = prepare(settings, work)
    failed = [name for name, entry in exported.items() if not entry["onnx_check"]["within_tolerance"]]
    if failed:
        raise RuntimeError(f"ONNX Runtime's outputs differ from transformers' beyond {models.TOLERANCE:g} for "
                           f"{failed}: not timed ({ {n: exported[n]['onnx_check'] for n in failed} })")
    others = OtherProcesses()
    measurements = run_measurements(settings, exported)
    foreign = others.cores(children_cpu_s=sum(m["cpu_s"] for m in measurements))
    summary = summarise(exported, measurements)
    document = {
        "benchmark": "deployment", "date": record.utc_now(), "command": record.command_line(), "machine": machine,
        "versions": record.versions(DISTRIBUTIONS, CODE), "method": __doc__.split("\n\n", 2)[2].strip(),
        "settings": asdict(settings), "weights": "random (seeded): speed, size and memory do not depend on values",
        "threads": {"torch_intra_op": settings.threads, "torch_inter_op": 1, "onnxruntime_intra_op": settings.threads,
                    "onnxruntime_inter_op": 1, "OMP_NUM_THREADS": settings.threads,
                    "MKL_NUM_THREADS": settings.threads},
        "foreign_load_cores_during_measurements": round(foreign, 3), "models": exported, "measurements": measurements,
        "summary": summary, "distillation": against_paper(summary, distillation_scores()),
        "bench_wall_s": round(time.perf_counter() - started, 1),
    }
    out = record.results_file(results, "deployment", machine, "" if settings.size == "base" else f"-{settings.size}")
    record.write_json(out, document)
    print(tables(summary, settings))
    if document["distillation"]:
        print(json.dumps(document["distillation"]["ours"], indent=1))
    print(f"results: {record.shown(out)}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    parser.add_argument("--size", default=defaults.size, choices=sorted(models.PRESETS))
    parser.add_argument("--models", default=",".join(defaults.models), help="comma-separated, of the defaults")
    parser.add_argument("--seq", type=int, default=defaults.seq)
    parser.add_argument("--threads", type=int, default=min(defaults.threads, len(os.sched_getaffinity(0))))
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--latency-warmup", type=int, default=defaults.latency_warmup)
    parser.add_argument("--latency-iterations", type=int, default=defaults.latency_iterations)
    parser.add_argument("--throughput-warmup", type=int, default=defaults.throughput_warmup)
    parser.add_argument("--throughput-iterations", type=int, default=defaults.throughput_iterations)
    parser.add_argument("--throughput-batch", type=int, default=defaults.throughput_batch)
    parser.add_argument("--reuse-exports", action="store_true", help="keep the exports of an earlier run in --work")
    parser.add_argument("--work", type=Path, default=record.WORK / "deployment")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    settings = Settings(size=args.size, models=tuple(args.models.split(",")), seq=args.seq, threads=args.threads,
                        repeats=args.repeats, latency_warmup=args.latency_warmup,
                        latency_iterations=args.latency_iterations, throughput_batch=args.throughput_batch,
                        throughput_warmup=args.throughput_warmup, throughput_iterations=args.throughput_iterations,
                        reuse_exports=args.reuse_exports)
    run(settings, args.work / settings.size, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
