"""The objectives menu side by side: BERT, RoBERTa-, SpanBERT- (its masking alone, and with its span-boundary
objective), ALBERT(SOP)- and modern-style pretraining of the same small encoder on the same real data for the same CPU
time, then the same held-out probe and the same finetuning.

    python -m bench.pretrain.objectives [--budget-cpu-s 600] [--seeds 1,2] [--quick] [--work DIR] [--data DIR]

1. Data: the shared Wikipedia slice and books, two books held out. Each recipe's training set is made by
   ``python -m preprocess run`` from configs/preprocess/phase1_seq128.yaml with the recipe's instance switches
   (``--set instances.…``), at sequence length 128 for all (CPU). The held-out probe set: the two books as
   ``doc_sentences`` rows with static 15% token masking, the same rows for every model.
2. Model: one 4-layer, 256-wide BERT (``bench.pretrain.objectives_probe.MODEL``), initialised once (seed 0) and exported
   as a Hugging Face directory that every recipe starts from (``model.init_from``); that initialisation
   finetuned as is is the floor.
3. Pretraining: ``pretrain/run.py`` in one process (both cores), the same global batch, learning rate and warm-up
   for every recipe. The budget is CPU time: a short calibration run of each recipe gives its CPU seconds per
   step, its schedule is set to fit the budget, and the run is stopped (SIGTERM: it saves and exits as when
   preempted) if it still reaches the budget first. CPU is the process tree's (user + system).
4. Held-out masked-token accuracy and loss of each model's MLM head on the probe set
   (``bench.pretrain.objectives_probe``), and GLUE dev scores after ``python -m finetune glue`` on SST-2 and MRPC (the
   first 2,000 training examples of each; the whole dev sets), one recipe, the given seeds (mean and spread reported).

Writes ``bench/results/objectives-<machine>[-quick].json`` and prints the table. ``--quick``: a smoke run
(tiny budget and subsamples), not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench import record
from bench.cpu import CONTENDED_LOAD, OtherProcesses
from bench.processes import child_env
from bench.shards import vocab_path
from common import processes

PREPROCESS_CONFIG = "configs/preprocess/phase1_seq128.yaml"
PRETRAIN_CONFIG = "configs/pretrain/tiny.yaml"
HELD_OUT_BOOKS = 2          # the last two books by name
SEQ = 128
STEP_TIMEOUT_S = 4 * 3600   # wall seconds of one preprocessing, pretraining, export or finetuning child: past it, stuck

# name -> (preprocessing switches, pretraining switches). Everything else is the same for all.
RECIPES = {
    "bert": ({"kind": "pairs", "sentence_objective": "nsp", "masking": "static", "mask_unit": "token"},
             {"objective.masking": "static", "objective.sentence_objective": "nsp"}),
    "roberta": ({"kind": "full_sentences", "sentence_objective": "none", "masking": "dynamic", "dupe_factor": 1},
                {"objective.masking": "dynamic", "objective.mask_unit": "token", "objective.sentence_objective": "none",
                 "objective.attention": "full"}),
    "spanbert": ({"kind": "doc_sentences", "sentence_objective": "none", "masking": "dynamic", "dupe_factor": 1},
                 {"objective.masking": "dynamic", "objective.mask_unit": "span",
                  "objective.sentence_objective": "none", "objective.attention": "full"}),
    "spanbert_sbo": ({"kind": "doc_sentences", "sentence_objective": "none", "masking": "dynamic", "dupe_factor": 1},
                     {"objective.masking": "dynamic", "objective.mask_unit": "span",
                      "objective.sentence_objective": "none", "objective.attention": "full",
                      "objective.span_boundary": "true"}),
    "albert_sop": ({"kind": "pairs", "sentence_objective": "sop", "masking": "static", "mask_unit": "token"},
                   {"objective.masking": "static", "objective.sentence_objective": "sop"}),
    "modern": ({"kind": "full_sentences", "sentence_objective": "none", "masking": "dynamic", "dupe_factor": 1},
               {"objective.masking": "dynamic", "objective.mask_unit": "token", "objective.masked_lm_prob": 0.3,
                "objective.max_predictions": 40, "objective.sentence_objective": "none",
                "objective.attention": "document"}),
}
PROBE_SWITCHES = {"kind": "doc_sentences", "sentence_objective": "none", "masking": "static", "mask_unit": "token",
                  "masked_lm_prob": 0.15, "dupe_factor": 1}
TRAINING = {"train.global_batch_size": 64, "train.micro_batch_size": 32, "train.precision": "bf16",
            "optimizer.lr": 5e-4, "optimizer.torch_adam": "true", "checkpoint.every_steps": 0,
            "checkpoint.export_hf": "true", "logging.log_every": 10, "logging.tensorboard": "false",
            "logging.progress": "false", "model.max_position_embeddings": 512}
CALIBRATION_STEPS = (3, 13)  # two short runs: the difference of their CPU is 10 steps' worth
FINETUNE = {"seeds": None, "glue": {"training": {"lr": 1e-4, "epochs": 2, "batch_size": 32, "eval_batch_size": 128,
                                                 "max_seq_length": 128, "warmup_proportion": 0.1,
                                                 "weight_decay": 0.01, "dropout": 0.1, "precision": "auto",
                                                 "select_best_epoch": True},
                                    "per_task": {"sst2": {"max_train_examples": 2000},
                                                 "mrpc": {"max_train_examples": 2000}}}}


def split_inputs(data: Path, quick: bool) -> tuple[list[str], list[str], list[str]]:
    """(training dumps, training books, held-out books): the held-out books are the last by name."""
    books = sorted(str(p) for p in (data / "books").glob("*.txt"))
    dumps = sorted(str(p) for p in (data / "wikipedia").glob("*.bz2"))
    if len(books) <= HELD_OUT_BOOKS or not dumps:
        sys.exit(f"{data}: expected wikipedia/*.bz2 and more than {HELD_OUT_BOOKS} books/*.txt; pass --data")
    train_books = books[:-HELD_OUT_BOOKS]
    return dumps, (train_books[:3] if quick else train_books), books[-HELD_OUT_BOOKS:]


def preprocess(name: str, switches: dict, dumps: list[str], books: list[str], work: Path, log: Path) -> Path:
    """A dataset made with ``switches`` (instance config keys), reused when already made with the same ones."""
    out = work / "data" / name
    stamp = {"switches": switches, "inputs": [[os.path.basename(p), os.path.getsize(p)] for p in dumps + books],
             "config": (record.REPO / PREPROCESS_CONFIG).read_text()}
    stamp_file = out.with_suffix(".stamp.json")
    if (out / "manifest.json").is_file() and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return out
    cmd = [sys.executable, "-m", "preprocess", "run", "--config", PREPROCESS_CONFIG, "--tokenizer", str(vocab_path()),
           "--output", str(out), "--overwrite", *(["--wikipedia", *dumps] if dumps else []), "--books", *books,
           *[a for k, v in switches.items() for a in ("--set", f"instances.{k}={v}")]]
    _run(cmd, log)
    stamp_file.write_text(json.dumps(stamp, indent=1) + "\n")
    return out


def _run(cmd: list[str], log: Path, env: dict | None = None) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            status = processes.run(cmd, check=False, cwd=record.REPO, stdout=out, stderr=subprocess.STDOUT,
                                   env=env or child_env(), timeout=STEP_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            status = f"killed after {STEP_TIMEOUT_S} s"
    if status != 0:
        sys.exit(f"{cmd[:4]} failed ({status}); see {log}:\n{log.read_text(errors='replace')[-3000:]}")


def _tree_cpu(process: psutil.Process) -> float:
    """CPU seconds of ``process`` (its reaped children included) and of its live descendants."""
    total = 0.0
    for proc in [process, *process.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + (t.children_user + t.children_system if proc is process else 0.0)
        except psutil.NoSuchProcess:
            pass
    return total


def pretrain(run_dir: Path, dataset: Path, init: Path, switches: dict, steps: int, budget_cpu_s: float | None,
             log: Path) -> dict:
    """One single-process pretraining run of ``steps`` steps, stopped by SIGTERM when its CPU reaches the budget."""
    warmup = max(1, steps // 10)
    settings = {**TRAINING, **switches, "output_dir": str(run_dir), "data.path": str(dataset),
                "model.init_from": str(init), "train.max_steps": steps, "schedule.total_steps": steps,
                "schedule.warmup_steps": warmup}
    return run_budgeted(run_dir, settings, steps, budget_cpu_s, log)


def run_budgeted(run_dir: Path, settings: dict, steps: int, budget_cpu_s: float | None, log: Path) -> dict:
    """``pretrain/run.py`` with ``settings`` (``--set`` values over ``PRETRAIN_CONFIG``) in one process, stopped by
    SIGTERM when its CPU reaches ``budget_cpu_s``; its status, CPU, the others' load and the last logged step."""
    cmd = [sys.executable, "pretrain/run.py", "--config", PRETRAIN_CONFIG,
           *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")]]
    env = {**child_env(), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": str(os.cpu_count() or 2)}
    log.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)  # a measured run starts fresh: an earlier one's run is another teacher's
    started, stopped, cpu, others = time.perf_counter(), False, 0.0, OtherProcesses()
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        with processes.started(cmd, cwd=record.REPO, stdout=out, stderr=subprocess.STDOUT, env=env) as child:
            watched = psutil.Process(child.pid)
            while child.poll() is None:
                try:
                    cpu = max(cpu, _tree_cpu(watched))
                except psutil.NoSuchProcess:
                    break
                if budget_cpu_s is not None and cpu >= budget_cpu_s and not stopped:
                    child.send_signal(signal.SIGTERM)
                    stopped = True
                if time.perf_counter() - started > STEP_TIMEOUT_S:  # stuck: leaving the block kills its session
                    sys.exit(f"pretraining {run_dir.name} still running after {STEP_TIMEOUT_S} s; see {log}")
                time.sleep(0.2)
            status = child.wait()
    if status not in (0, 75):
        sys.exit(f"pretraining {run_dir.name} failed ({status}); see {log}")
    # Other processes' CPU meanwhile: under contention OpenMP's waiting threads spin, so a step costs more CPU and
    # the budget buys fewer steps (flagged; measure such a recipe again with --recipes on a quiet machine).
    foreign = others.cores(children_cpu_s=cpu)
    return {"status": status, "stopped_at_budget": stopped, "cpu_s": round(cpu, 1),
            "others_cores": round(foreign, 2), "contended": foreign > CONTENDED_LOAD,
            "wall_s": round(time.perf_counter() - started, 1), "steps_planned": steps,
            "last_logged_step": _last_logged_step(run_dir)}


def _last_logged_step(run_dir: Path) -> int | None:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    steps = [json.loads(line).get("step") for line in metrics.read_text().splitlines() if line.strip()]
    return max((s for s in steps if isinstance(s, int)), default=None)


def export(run_dir: Path, log: Path) -> Path:
    """The run's Hugging Face directory: written at the end of a finished run, else exported from its checkpoint."""
    hf = run_dir / "hf"
    if not (hf / "config.json").is_file():
        _run([sys.executable, "-m", "pretrain.export", str(run_dir), str(hf)], log,
             env={**child_env(), "DS_ACCELERATOR": "cpu"})
    return hf


def finetune(checkpoint: Path, out: Path, seeds: list[int], data: Path, quick: bool, log: Path) -> dict:
    """SST-2 (subsampled) and MRPC dev scores with one recipe: per task, the mean and spread over ``seeds``."""
    recipe = json.loads(json.dumps(FINETUNE))
    recipe["seeds"] = seeds
    if quick:
        recipe["glue"]["training"]["epochs"] = 1
        recipe["glue"]["per_task"] = {"sst2": {"max_train_examples": 256}, "mrpc": {"max_train_examples": 256}}
    config = out.parent / f"{out.name}.finetune.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(recipe, indent=1))
    if not (out / "report.json").is_file():
        _run([sys.executable, "-m", "finetune", "glue", "--checkpoint", str(checkpoint), "--tasks", "sst2,mrpc",
              "--data", str(data), "--output", str(out), "--config", str(config)], log)
    return scores(json.loads((out / "report.json").read_text()))


def scores(report: dict) -> dict:
    """{task: {metric: {mean, std, per_seed}}} from a finetuning report (metrics as fractions; std over seeds as
    the report gives it, the population standard deviation)."""
    found = {}
    for result in report["results"]:
        found[result["task"]] = {metric: {"mean": round(result["mean"][metric], 4), "std": round(result["std"][metric], 4),
                                          "per_seed": [round(run["metrics"][metric], 4) for run in result["runs"]]}
                                 for metric in result["mean"]}
    return found


def main(argv=None) -> int:
    from bench.pretrain import objectives_probe  # torch: imported once the arguments are known

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-cpu-s", type=float, default=600.0, help="pretraining CPU seconds per recipe")
    parser.add_argument("--seeds", default="1,2", help="finetuning seeds")
    parser.add_argument("--recipes", default=",".join(RECIPES),
                        help="a subset of " + ",".join(RECIPES) + "; the results file keeps the other recipes' entries "
                             "(e.g. to measure one again on a quiet machine)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny budget and subsamples")
    parser.add_argument("--work", type=Path, default=record.WORK / "objectives")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    budget = 30.0 if args.quick else args.budget_cpu_s
    seeds = [int(s) for s in args.seeds.split(",")][: 1 if args.quick else None]
    names = [n for n in args.recipes.split(",") if n]
    unknown = sorted(set(names) - set(RECIPES))
    if unknown:
        parser.error(f"unknown recipes {unknown}; choose from {', '.join(RECIPES)}")
    work, logs = args.work, args.work / "logs"
    machine, started = record.machine_info(), time.perf_counter()
    dumps, books, held_out = split_inputs(args.data, args.quick)

    probe_set = preprocess("probe", PROBE_SWITCHES, [], held_out, work, logs / "preprocess-probe.log")
    init = objectives_probe.initial_model(work / "init", probe_set)
    results = {"floor": {"pretraining": None, "probe": objectives_probe.probe(init, probe_set, args.quick),
                         "glue": finetune(init, work / "finetune" / "floor", seeds, args.data, args.quick,
                                          logs / "finetune-floor.log")}}
    print(f"floor: {json.dumps(results['floor'])}", flush=True)
    for name in names:
        data_switches, train_switches = RECIPES[name]
        dataset = preprocess(name, data_switches, dumps, books, work, logs / f"preprocess-{name}.log")
        short, longer = (pretrain(work / "calibration" / f"{name}-{steps}", dataset, init, train_switches, steps, None,
                                  logs / f"calibration-{name}.log") for steps in CALIBRATION_STEPS)
        per_step = max(1e-3, (longer["cpu_s"] - short["cpu_s"]) / (CALIBRATION_STEPS[1] - CALIBRATION_STEPS[0]))
        fixed = max(0.0, short["cpu_s"] - CALIBRATION_STEPS[0] * per_step)
        steps = max(CALIBRATION_STEPS[0], int((budget - fixed) / per_step))
        run = pretrain(work / "runs" / name, dataset, init, train_switches, steps, budget, logs / f"pretrain-{name}.log")
        hf = export(work / "runs" / name, logs / f"export-{name}.log")
        results[name] = {"switches": {"preprocess": data_switches, "pretrain": train_switches},
                         "calibration": {"cpu_s_per_step": round(per_step, 3), "start_up_cpu_s": round(fixed, 1)},
                         "pretraining": run, "probe": objectives_probe.probe(hf, probe_set, args.quick),
                         "glue": finetune(hf, work / "finetune" / name, seeds, args.data, args.quick,
                                          logs / f"finetune-{name}.log")}
        print(f"{name}: {json.dumps({k: results[name][k] for k in ('pretraining', 'probe', 'glue')})}", flush=True)

    document = {
        "benchmark": "objectives", "date": record.utc_now(), "quick": args.quick, "command": record.command_line(),
        "machine": machine, "versions": record.versions(record.DISTRIBUTIONS["pretrain"],
                                                        ("pretrain", "preprocess", "common", "finetune")),
        "method": __doc__.split("\n\n", 2)[2].strip(), "budget_cpu_s": budget, "seeds": seeds, "sequence_length": SEQ,
        "model": objectives_probe.MODEL, "training": TRAINING, "finetuning": FINETUNE,
        "inputs": {"wikipedia": [os.path.basename(p) for p in dumps], "books": [os.path.basename(p) for p in books],
                   "held_out_books": [os.path.basename(p) for p in held_out]},
        "results": results, "bench_wall_s": round(time.perf_counter() - started, 1),
    }
    out_file = record.results_file(args.results, "objectives", machine, "-quick" if args.quick else "")
    if set(names) != set(RECIPES) and out_file.is_file():
        earlier = json.loads(out_file.read_text())
        kept = {k: v for k, v in earlier["results"].items() if k not in results}
        document["results"] = {**kept, **results}
        document["measured_again"] = {"recipes": names, "date": document["date"],
                                      "earlier_date": earlier.get("date"), "earlier_command": earlier.get("command")}
    record.write_json(out_file, document)
    print(objectives_probe.table(document["results"]))
    print(f"results: {record.shown(out_file)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
