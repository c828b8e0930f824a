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


def build(results: list[dict], *, checkpoint: str, seconds: float, seeds: list[int], config: dict) -> dict:
    glue_scores = {r["task"]: _primary(r)[0] for r in results if r.get("benchmark") == "glue"}
    average = metrics.glue_average(glue_scores) if glue_scores else None
    return {
        "checkpoint": checkpoint, "seconds": round(seconds, 1), "seeds": seeds,
        "protocol": {"glue": "dev sets; the epoch with the best dev score is kept per seed; mean and population "
                             f"standard deviation over {len(seeds)} seed(s); GLUE average as the BERT paper "
                             "(MNLI-m and MNLI-mm count separately, WNLI excluded) over the tasks run",
                     "squad": "official EM/F1 on the dev set", "conll": "conlleval span F1 on dev (model selection) "
                             "and test", "reference": PAPER_NOTE},
        "glue_average": average, "glue_tasks_in_average": sorted(t for t in glue_scores if t != "wnli"),
        "results": results, "paper": PAPER, "config": config,
    }


def markdown(report: dict) -> str:
    lines = [f"# Finetuning report", "", f"Checkpoint: `{report['checkpoint']}`  ",
             f"Seeds: {', '.join(map(str, report['seeds']))}; total time {report['seconds']:.0f} s", "",
             "| task | metric | ours (mean ± std) | per seed | BERT-Base | BERT-Large | time |",
             "|---|---|---|---|---|---|---|"]
    for result in report["results"]:
        task = result["task"]
        for key in result["mean"]:
            if key in ("missing", "total") or not isinstance(result["mean"][key], (int, float)):
                continue
            scale = 1.0 if result.get("benchmark") == "squad" else 100.0
            seeds = ", ".join(f"{run['metrics'][key] * scale:.1f}" for run in result["runs"])
            base, large = (_paper(size, task, key) for size in ("base", "large"))
            lines.append(f"| {task} | {key} | {result['mean'][key] * scale:.2f} ± {result['std'][key] * scale:.2f} | "
                         f"{seeds} | {base} | {large} | {result['seconds']:.0f} s |")
    if report["glue_average"] is not None:
        lines += ["", f"GLUE average (BERT-paper columns present: {', '.join(report['glue_tasks_in_average'])}): "
                      f"**{report['glue_average']:.1f}** (paper: Base 79.6, Large 82.1 over all 8 test columns)"]
    lines += ["", "Protocol:"] + [f"* {k}: {v}" for k, v in report["protocol"].items()]
    return "\n".join(lines) + "\n"


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
