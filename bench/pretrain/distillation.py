"""Distillation on CPU: the packaged MiniLM (6 layers, 384 wide) distilled into a 3-layer student on the shared corpus,
by DistilBERT's loss and by TinyBERT's, against the same student trained without the teacher, then the same
finetuning of all of them.

    python -m bench.pretrain.distillation [--budget-cpu-s 600] [--head-cpu-s 500] [--tasks sst2] [--seeds 1]
        [--variants distilled,tinybert,mlm_teacher_init,mlm_random_init] [--label NAME] [--quick]

1. Data: the objectives benchmark's datasets (``bench.pretrain.objectives``, shared with it under bench/work/objectives):
   RoBERTa's rows (FULL-SENTENCES, dynamic masking, no NSP; DistilBERT's recipe) for pretraining, its static BERT rows
   for the teacher's head, its held-out books for the probe. Sequence length 128.
2. Teacher: MiniLM has no MLM head, so one is fitted on its frozen encoder first (``bench.pretrain.distillation_models``):
   the teacher's encoder is MiniLM's unchanged.
3. Students, 3 layers of the teacher's shape: ``distilled`` (``distillation.teacher``: initialised from teacher
   layers 0, 2, 4; loss 5 x KL at T=2 + 2 x MLM + 1 x cosine), ``tinybert`` (the same initialisation, TinyBERT's
   general-distillation loss: MSE of the embeddings and of student layers 1-3's outputs and attention scores
   against teacher layers 2, 4, 6; the widths are equal, so no projection), ``mlm_teacher_init`` (the same
   initialisation, MLM only: DistilBERT's ablation without the teacher's losses) and ``mlm_random_init`` (BERT's random
   initialisation, MLM only). Each runs ``pretrain/run.py`` in one process with the objectives benchmark's training
   settings and the same number of steps: the distilled run's, calibrated (two short runs) to fit the CPU budget,
   which the teacher's forward makes the most expensive per step. CPU seconds of each are reported.
   ``--variants`` runs some of them (the teacher always); ``--label`` names the results file apart.
4. Held-out masked-token accuracy of each MLM head (``bench.pretrain.objectives_probe``) and GLUE dev scores after
   ``python -m finetune glue`` with one recipe (the objectives benchmark's: the first 2,000 training examples,
   2 epochs, lr 1e-4) for the teacher and the three students.

Writes ``bench/results/distillation-<machine>[-quick].json`` and prints the table. ``--quick``: a smoke run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench import record
from bench.pretrain import objectives
from bench.shards import vocab_path

STUDENT_LAYERS = 3
DISTILLATION = {"distillation.temperature": 2.0, "distillation.kl_weight": 5.0, "distillation.mlm_weight": 2.0,
                "distillation.cosine_weight": 1.0, "distillation.student_layers": STUDENT_LAYERS,
                "distillation.teacher_precision": "bf16"}
TINYBERT = {"distillation.loss": "tinybert", "distillation.temperature": 1.0,
            "distillation.student_layers": STUDENT_LAYERS, "distillation.teacher_precision": "bf16"}
VARIANTS = ("distilled", "tinybert", "mlm_teacher_init", "mlm_random_init")
DATA_RECIPE = "roberta"  # bench.pretrain.objectives.RECIPES: its rows and pretraining switches
HEAD_DATA_RECIPE = "bert"  # static masks: the teacher's head fit reads them as they are


def pretrain(run_dir: Path, settings: dict, steps: int, budget_cpu_s: float | None, log: Path) -> dict:
    """One single-process ``pretrain/run.py`` of ``steps`` steps with ``settings`` (over the objectives benchmark's
    training settings), stopped by SIGTERM when its CPU reaches the budget; with its last metrics record."""
    settings = {**objectives.TRAINING, **objectives.RECIPES[DATA_RECIPE][1], **settings, "output_dir": str(run_dir),
                "train.max_steps": steps, "schedule.total_steps": steps, "schedule.warmup_steps": max(1, steps // 10)}
    return {**objectives.run_budgeted(run_dir, settings, steps, budget_cpu_s, log), "last_record": _last_record(run_dir)}


def _last_record(run_dir: Path) -> dict | None:
    """The run's last metrics record (its losses, throughput and MFU), rounded."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    lines = [line for line in metrics.read_text().splitlines() if line.strip()]
    last = json.loads(lines[-1]) if lines else {}
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in last.items()}


def finetune(checkpoint: Path, out: Path, tasks: list[str], seeds: list[int], data: Path, quick: bool,
             log: Path) -> dict:
    """GLUE dev scores with the objectives benchmark's recipe on ``tasks``: per task, mean and spread over seeds."""
    recipe = json.loads(json.dumps(objectives.FINETUNE))
    recipe["seeds"] = seeds
    recipe["glue"]["per_task"] = {t: {"max_train_examples": 256 if quick else 2000} for t in tasks}
    if quick:
        recipe["glue"]["training"]["epochs"] = 1
    config = out.parent / f"{out.name}.finetune.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(recipe, indent=1))
    if not (out / "report.json").is_file():
        objectives._run([sys.executable, "-m", "finetune", "glue", "--checkpoint", str(checkpoint), "--tasks",
                         ",".join(tasks), "--data", str(data), "--output", str(out), "--config", str(config)], log)
    return objectives.scores(json.loads((out / "report.json").read_text()))


def calibrate(work: Path, settings: dict, budget: float, logs: Path) -> tuple[int, dict]:
    """Steps of the distilled run that fit ``budget`` CPU seconds, from two short runs (their difference: 10 steps)."""
    short, longer = (pretrain(work / "calibration" / f"distilled-{steps}", settings, steps, None,
                              logs / "calibration-distilled.log") for steps in objectives.CALIBRATION_STEPS)
    per_step = max(1e-3, (longer["cpu_s"] - short["cpu_s"]) / (objectives.CALIBRATION_STEPS[1]
                                                                - objectives.CALIBRATION_STEPS[0]))
    fixed = max(0.0, short["cpu_s"] - objectives.CALIBRATION_STEPS[0] * per_step)
    steps = max(objectives.CALIBRATION_STEPS[0], int((budget - fixed) / per_step))
    return steps, {"cpu_s_per_step": round(per_step, 3), "start_up_cpu_s": round(fixed, 1)}


def main(argv=None) -> int:
    from bench.pretrain import (  # torch: imported once the arguments are known
        distillation_models,
        objectives_probe,
    )

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-cpu-s", type=float, default=600.0, help="the distilled run's pretraining CPU s")
    parser.add_argument("--head-cpu-s", type=float, default=500.0, help="CPU s to fit the teacher's MLM head")
    parser.add_argument("--tasks", default="sst2", help="GLUE tasks, comma-separated")
    parser.add_argument("--seeds", default="1", help="finetuning seeds")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="students, comma-separated")
    parser.add_argument("--label", default="", help="appended to the results file's name")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny budgets and subsamples")
    parser.add_argument("--work", type=Path, default=record.WORK / "distillation")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    budget, head_budget = (40.0, 10.0) if args.quick else (args.budget_cpu_s, args.head_cpu_s)
    seeds, tasks = [int(s) for s in args.seeds.split(",")][: 1 if args.quick else None], args.tasks.split(",")
    work, logs = args.work, args.work / "logs"
    shared = work if args.quick else record.WORK / "objectives"  # a quick run's subsample must not replace its data
    machine, started = record.machine_info(), time.perf_counter()
    dumps, books, held_out = objectives.split_inputs(args.data, args.quick)
    data = {name: objectives.preprocess(name, objectives.RECIPES[name][0], dumps, books, shared,
                                        logs / f"preprocess-{name}.log") for name in (DATA_RECIPE, HEAD_DATA_RECIPE)}
    probe_set = objectives.preprocess("probe", objectives.PROBE_SWITCHES, [], held_out, shared,
                                      logs / "preprocess-probe.log")
    minilm = vocab_path().parent  # the packaged MiniLM's directory
    teacher = work / "teacher"
    head_fit = distillation_models.fit_mlm_head(minilm, data[HEAD_DATA_RECIPE], teacher, head_budget)
    print(f"teacher head: {json.dumps(head_fit)}", flush=True)
    inits = distillation_models.student_inits(teacher, STUDENT_LAYERS, data[DATA_RECIPE] / "tokenizer", work)
    common = {"data.path": str(data[DATA_RECIPE])}
    variants = {"distilled": {**common, **DISTILLATION, "distillation.teacher": str(teacher)},
                "tinybert": {**common, **TINYBERT, "distillation.teacher": str(teacher)},
                "mlm_teacher_init": {**common, "model.init_from": str(inits["teacher_layers"])},
                "mlm_random_init": {**common, "model.init_from": str(inits["random"])}}
    chosen = args.variants.split(",")
    if set(chosen) - set(VARIANTS):
        parser.error(f"--variants {args.variants}: choose from {', '.join(VARIANTS)}")
    steps, calibration = calibrate(work, variants["distilled"], budget, logs)
    results = {"teacher": {"pretraining": None, "head_fit": head_fit,
                           "probe": objectives_probe.probe(teacher, probe_set, args.quick),
                           "glue": finetune(teacher, work / "finetune" / "teacher", tasks, seeds, args.data,
                                            args.quick, logs / "finetune-teacher.log")}}
    print(f"teacher: {json.dumps(results['teacher'])}", flush=True)
    for name, settings in ((n, variants[n]) for n in VARIANTS if n in chosen):
        run_dir = work / "runs" / name
        run = pretrain(run_dir, settings, steps, budget if name == "distilled" else None, logs / f"pretrain-{name}.log")
        hf = objectives.export(run_dir, logs / f"export-{name}.log")
        results[name] = {"settings": settings, "pretraining": run,
                         "probe": objectives_probe.probe(hf, probe_set, args.quick),
                         "glue": finetune(hf, work / "finetune" / name, tasks, seeds, args.data, args.quick,
                                          logs / f"finetune-{name}.log")}
        print(f"{name}: {json.dumps({k: results[name][k] for k in ('pretraining', 'probe', 'glue')})}", flush=True)

    document = {
        "benchmark": "distillation", "date": record.utc_now(), "quick": args.quick, "command": record.command_line(),
        "machine": machine, "versions": record.versions(record.DISTRIBUTIONS["pretrain"],
                                                        ("pretrain", "preprocess", "common", "finetune")),
        "method": __doc__.split("\n\n", 2)[2].strip(), "budget_cpu_s": budget, "head_cpu_s": head_budget,
        "steps": steps, "calibration": calibration, "seeds": seeds, "tasks": tasks,
        "sequence_length": objectives.SEQ, "teacher": {"encoder": str(minilm.name), "head_fit": head_fit},
        "student_layers": STUDENT_LAYERS, "distillation": DISTILLATION, "tinybert": TINYBERT,
        "variants": chosen, "training": objectives.TRAINING,
        "data_recipe": objectives.RECIPES[DATA_RECIPE], "finetuning": objectives.FINETUNE["glue"]["training"],
        "inputs": {"wikipedia": [os.path.basename(p) for p in dumps], "books": [os.path.basename(p) for p in books],
                   "held_out_books": [os.path.basename(p) for p in held_out]},
        "results": results, "bench_wall_s": round(time.perf_counter() - started, 1),
    }
    suffix = (f"-{args.label}" if args.label else "") + ("-quick" if args.quick else "")
    out_file = record.results_file(args.results, "distillation", machine, suffix)
    record.write_json(out_file, document)
    print(objectives_probe.table(results))
    print(f"results: {record.shown(out_file)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
