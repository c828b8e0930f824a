"""report.json and report.md: per task and seed the metrics, their mean and spread, the BERT paper's
figures next to ours, the protocol, and the time taken."""
from __future__ import annotations

from pathlib import Path

from finetune import metrics

# Devlin et al. 2019 (arXiv:1810.04805v2). GLUE: Table 1, *test* sets (GLUE server); MRPC and QQP F1,
# STS-B Spearman, CoLA Matthews, the rest accuracy. SQuAD v1.1: Table 2, dev EM/F1 (single model).
# SQuAD v2.0: Table 3 (BERT-Large only, dev). CoNLL-2003: Table 7, dev and test F1 (fine-tuning).
PAPER = {
    "base": {"mnli_matched": 84.6, "mnli_mismatched": 83.4, "qqp": 71.2, "qnli": 90.5, "sst2": 93.5, "cola": 52.1,
             "stsb": 85.8, "mrpc": 88.9, "rte": 66.4, "glue_average": 79.6,
             "squad": {"exact_match": 80.8, "f1": 88.5}, "conll_dev": 95.4, "conll_test": 92.4},
    "large": {"mnli_matched": 86.7, "mnli_mismatched": 85.9, "qqp": 72.1, "qnli": 92.7, "sst2": 94.9, "cola": 60.5,
              "stsb": 86.5, "mrpc": 89.3, "rte": 70.1, "glue_average": 82.1,
              "squad": {"exact_match": 84.1, "f1": 90.9}, "squad_v2": {"exact": 78.7, "f1": 81.9},
              "conll_dev": 96.6, "conll_test": 92.8},
}
# The official dev sets' sizes: the paper's columns stand beside ours only for a run on the whole official dev set
# after training on the whole train set (a subset, a sample or another file is another protocol).
OFFICIAL_DEV = {"cola": 1043, "sst2": 872, "mrpc": 408, "stsb": 1500, "qqp": 40430, "mnli_matched": 9815,
                "mnli_mismatched": 9832, "qnli": 5463, "rte": 277, "wnli": 71, "squad": 10570, "squad_v2": 11873,
                "conll_dev": 3250, "conll_test": 3453}
PAPER_SIZES = "BERT-Base 110 M parameters, BERT-Large 340 M"
PAPER_NOTE = ("BERT paper (Devlin et al. 2019): GLUE figures are *test-set* scores from the GLUE server, ours are "
              "dev-set scores; SQuAD figures are dev; CoNLL-2003 dev and test F1.")


def _primary(result: dict) -> tuple[float, float]:
    task = result["task"]
    if result.get("benchmark") == "glue":
        key = metrics.primary_metric_name(task)
    elif task.startswith("conll"):
        key = "f1"
    else:
        key = "f1"
    scale = 1.0 if result.get("benchmark") == "squad" else 100.0  # SQuAD metrics are already percentages
    return result["mean"][key] * scale, result["std"][key] * scale


def comparable(result: dict) -> bool:
    """Whether a task ran the paper's data protocol: the whole official dev set, after the whole train set."""
    return (result.get("eval_examples") == OFFICIAL_DEV.get(result["task"])
            and not result.get("training", {}).get("max_train_examples"))


def build(results: list[dict], *, checkpoint: str, seconds: float, seeds: list[int], config: dict,
          model: dict | None = None, note: str | None = None) -> dict:
    """The report; ``model`` says what was finetuned (``model_type``, ``parameters``), ``note`` what the run is
    (the demo says its data is a synthetic sample)."""
    glue_scores = {r["task"]: _primary(r)[0] for r in results if r.get("benchmark") == "glue"}
    average = metrics.glue_average(glue_scores) if glue_scores else None
    for result in results:
        result["comparable_with_paper"] = comparable(result)
    return {
        "checkpoint": checkpoint, "seconds": round(seconds, 1), "seeds": seeds, "model": model, "note": note,
        "protocol": {"glue": "dev sets; the epoch with the best dev score is kept per seed; mean and population "
                             f"standard deviation over {len(seeds)} seed(s); GLUE average as the BERT paper "
                             "(MNLI-m and MNLI-mm count separately, WNLI excluded) over the tasks run",
                     "squad": "official EM/F1 on the dev set", "conll": "conlleval span F1 on dev (model selection) "
                             "and test", "reference": PAPER_NOTE},
        "glue_average": average, "glue_tasks_in_average": sorted(t for t in glue_scores if t != "wnli"),
        "results": results, "paper": PAPER, "config": config,
    }


def markdown(report: dict) -> str:
    lines = ["# Finetuning report", ""] + ([f"**{report['note']}**", ""] if report.get("note") else [])
    lines += [f"Checkpoint: `{report['checkpoint']}`  "]
    if report.get("model"):
        lines += [f"Model: {report['model']['model_type']} encoder, {_millions(report['model']['parameters'])} "
                  f"parameters (the paper: {PAPER_SIZES})  "]
    lines += [f"Seeds: {', '.join(map(str, report['seeds']))}; total time {report['seconds']:.0f} s", "",
              "| task | metric | ours (mean ± std) | per seed | BERT-Base | BERT-Large | time | train / dev |",
              "|---|---|---|---|---|---|---|---|"]
    for result in report["results"]:
        task = result["task"]
        shown = result.get("comparable_with_paper", True)
        examples = f"{result.get('train_examples', 0):,} / {result.get('eval_examples', 0):,}"
        for key in result["mean"]:
            if key in ("missing", "total") or not isinstance(result["mean"][key], (int, float)):
                continue
            scale = 1.0 if result.get("benchmark") == "squad" else 100.0
            seeds = ", ".join(f"{run['metrics'][key] * scale:.1f}" for run in result["runs"])
            base, large = (_paper(size, task, key) if shown else "–" for size in ("base", "large"))
            lines.append(f"| {task} | {key} | {result['mean'][key] * scale:.2f} ± {result['std'][key] * scale:.2f} | "
                         f"{seeds} | {base} | {large} | {result['seconds']:.0f} s | {examples} |")
    lines += _not_comparable(report["results"])
    if report["glue_average"] is not None:
        averaged = [r for r in report["results"] if r["task"] in report["glue_tasks_in_average"]]
        paper = ("paper: Base 79.6, Large 82.1 over all 8 test columns"
                 if len(averaged) == 8 and all(r.get("comparable_with_paper", True) for r in averaged)
                 else "not comparable with the paper's 79.6 / 82.1, which average all 8 tasks on the official data")
        lines += ["", f"GLUE average over {', '.join(report['glue_tasks_in_average'])}: "
                      f"**{report['glue_average']:.1f}** ({paper})"]
    lines += _task_models(report["results"])
    lines += ["", "Protocol:"] + [f"* {k}: {v}" for k, v in report["protocol"].items()]
    return "\n".join(lines) + "\n"


def _millions(count: int) -> str:
    return f"{count / 1e6:.1f} M" if count >= 1e5 else f"{count:,}"


def _not_comparable(results: list[dict]) -> list[str]:
    """Why the paper's columns are left out where they are."""
    lines = []
    for result in results:
        if result.get("comparable_with_paper", True):
            continue
        official, used = OFFICIAL_DEV.get(result["task"]), result.get("eval_examples")
        why = [] if used == official else [f"dev on {used:,} examples" + (f", not the official {official:,}"
                                                                          if official else "")]
        if result.get("training", {}).get("max_train_examples"):
            why.append(f"trained on the first {result['train_examples']:,} examples only")
        lines.append(f"* {result['task']}: {'; '.join(why)}")
    if not lines:
        return []
    return ["", "The BERT paper's columns are left out where the protocol differs from the paper's (these scores "
                "say what this run measured, not how the model compares with BERT):"] + lines


def _task_models(results: list[dict]) -> list[str]:
    """The saved task models (``--save-models``), one line per directory (MNLI's and CoNLL's serve two rows)."""
    saved = {}
    for result in results:
        entry = result.get("saved_model")
        if entry is not None:
            saved.setdefault(entry.get("path") or f"{result['task']} (not saved)", (result["task"], entry))
    if not saved:
        return []
    lines = ["", "Task models (transformers directories, relative to this report; load with AutoModelFor… and "
                 "transformers.pipeline, see docs/finetuning.md):", "",
             "| task | directory | seed | epoch | dev score | chosen as |", "|---|---|---|---|---|---|"]
    for path, (task, entry) in saved.items():
        where = f"`{path}`" if "error" not in entry else f"not saved: {entry['error']}"
        lines.append(f"| {task} | {where} | {entry['seed']} | {entry['epoch']} | {entry['metric']} "
                     f"{entry['score']:.4f} | {entry['selected_by']} |")
    return lines


def _paper(size: str, task: str, key: str) -> str:
    value = PAPER[size].get(task)
    if isinstance(value, dict):
        value = value.get(key)
    elif value is not None and task not in ("conll_dev", "conll_test") and key != metrics.primary_metric_name(task):
        value = None
    elif value is not None and task.startswith("conll") and key != "f1":
        value = None
    return "–" if value is None else f"{value:.1f}"


def write(report: dict, out: Path) -> None:
    from finetune.suite import write_json

    write_json(out / "report.json", report)
    temporary = out / "report.md.tmp"
    temporary.write_text(markdown(report))
    temporary.replace(out / "report.md")
