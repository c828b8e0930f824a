"""The suite's tasks (GLUE, SQuAD, CoNLL-2003) as runs over seeds: features, the model head, dev evaluation
with the official metric.

Each ``run_*`` returns a list of task results (dicts) that the report turns into tables.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from finetune import conll, glue, metrics, squad
from finetune.config import FinetuneConfig, TrainingConfig, task_training
from finetune.errors import DataError
from finetune.heads import SequenceClassifier, SpanExtractor, TokenClassifier
from finetune.pretrained import load_encoder
from finetune.task_models import TaskModels
from finetune.trainer import device_and_dtype, finetune, predict, training_record


def _limit(items: list, count: int) -> list:
    return items[:count] if count else items


def pair_features(tokenizer, text_a: str, text_b: str | None, max_seq_length: int) -> dict:
    """[CLS] a [SEP] (b [SEP]), truncating the longer side first, as BERT's run_classifier does."""
    a = tokenizer.encode(text_a)
    b = tokenizer.encode(text_b) if text_b is not None else []
    budget = max_seq_length - (3 if text_b is not None else 2)
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()  # a tie shortens b, as run_classifier.py and transformers do
    ids = [tokenizer.cls_id, *a, tokenizer.sep_id]
    types = [0] * len(ids)
    if text_b is not None:
        ids += [*b, tokenizer.sep_id]
        types += [1] * (len(b) + 1)
    return {"input_ids": ids, "token_type_ids": types}


def seeded(seed: int, build):
    """``build()`` with torch's generator seeded first: a task head's initial weights come from the run's seed.
    (torch seeds itself at random in each process, so a head built before seeding differed between runs.)"""
    torch.manual_seed(seed)
    return build()


def _summary(task: str, runs: list, extra: dict | None = None) -> dict:
    # Scalars get a mean and spread; nested results (CoNLL's per-type scores) stay in the per-seed runs.
    keys = [k for k, v in runs[0].metrics.items() if isinstance(v, (int, float))]
    mean = {k: statistics.fmean(r.metrics[k] for r in runs) for k in keys}
    std = {k: statistics.pstdev(r.metrics[k] for r in runs) if len(runs) > 1 else 0.0 for k in keys}
    return {"task": task, "seeds": [r.seed for r in runs], "mean": mean, "std": std,
            "runs": [{"seed": r.seed, "best_epoch": r.best_epoch, "metrics": r.metrics, "steps": r.steps,
                      "train_seconds": round(r.train_seconds, 1), "history": r.history} for r in runs],
            "seconds": round(sum(r.train_seconds for r in runs), 1), **(extra or {})}


def run_glue(tasks: list[str], data_dir: Path, model_dir: Path, tokenizer, cfg: FinetuneConfig, out: Path) -> list[dict]:
    results = []
    saved = TaskModels.for_run(cfg, out, model_dir, tokenizer)
    for task in tasks:
        training = task_training(cfg.glue, task)
        spec = glue.TASKS[task]
        train = _limit(glue.read_split(data_dir / "glue", task, "train"), training.max_train_examples)
        dev_sets = {name: _limit(glue.read_split(data_dir / "glue", task, name), training.max_eval_examples)
                    for name in glue.eval_splits(task)}
        regression = spec.regression
        num_labels = 1 if regression else len(spec.labels)

        def rows(examples):
            return [{**pair_features(tokenizer, e.text_a, e.text_b, training.max_seq_length), "labels": e.label}
                    for e in examples]

        train_rows = rows(train)
        dev_rows = {name: rows(examples) for name, examples in dev_sets.items()}
        device, dtype = device_and_dtype(training.precision)
        first_dev = next(iter(dev_rows))

        def evaluate(model, name=first_dev):
            logits = np.stack(predict(model, dev_rows[name], training.eval_batch_size, tokenizer.pad_id, device, dtype))
            labels = np.asarray([r["labels"] for r in dev_rows[name]])
            predictions = logits[:, 0] if regression else logits.argmax(-1)
            found = metrics.glue_metrics(name if task == "mnli" else task, labels, predictions)
            return found, metrics.primary_score(name if task == "mnli" else task, found)

        per_split = {name: [] for name in dev_rows}
        for seed in cfg.seeds:
            model = seeded(seed, lambda: SequenceClassifier(load_encoder(model_dir, training.dropout), num_labels,
                                                            training.dropout))
            run = finetune(model, train_rows, evaluate, training, seed=seed, pad_id=tokenizer.pad_id,
                           log_dir=out / "logs", name=task)
            per_split[first_dev].append(run)
            saved.keep(task, seed, model, run, max_length=training.max_seq_length, labels=spec.labels or (),
                       regression=regression)
            for name in list(dev_rows)[1:]:  # MNLI mismatched: the model selected on matched, scored once
                found, primary = evaluate(model, name)
                per_split[name].append(type(run)(seed=seed, best_epoch=run.best_epoch, metrics=found, primary=primary,
                                                 train_seconds=0.0, steps=run.steps))
        model_entry = saved.publish(task, metrics.primary_metric_name(task))  # MNLI: selected on matched
        for name, runs in per_split.items():
            results.append(_summary(name if task == "mnli" else task, runs,
                                    {"benchmark": "glue", "train_examples": len(train_rows),
                                     "eval_examples": len(dev_rows[name]), "training": training_record(training),
                                     **_saved(model_entry)}))
    return results


def run_squad(data_dir: Path, model_dir: Path, tokenizer, cfg: FinetuneConfig, out: Path) -> list[dict]:
    sc = cfg.squad
    training = sc.training
    train_examples, _ = squad.load_squad_json(data_dir / sc.train_file, version_2=sc.version_2)
    dev_examples, dev_data = squad.load_squad_json(data_dir / sc.dev_file, version_2=sc.version_2)
    train_examples = _limit(train_examples, training.max_train_examples)
    if training.max_eval_examples:
        dev_examples = dev_examples[:training.max_eval_examples]
        keep = {e.qid for e in dev_examples}
        dev_data = _filter_squad(dev_data, keep)
    options = dict(max_seq_length=training.max_seq_length, doc_stride=sc.doc_stride, max_query_length=sc.max_query_length)
    train_features = squad.make_features(train_examples, tokenizer, training=True, **options)
    dev_features = squad.make_features(dev_examples, tokenizer, training=False, **options)
    train_rows = [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids,
                   "start_positions": f.start_position, "end_positions": f.end_position} for f in train_features]
    dev_rows = [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids} for f in dev_features]
    device, dtype = device_and_dtype(training.precision)
    evaluate_with = squad_evaluator(dev_examples, dev_features, dev_rows, dev_data, sc, tokenizer, device, dtype)
    runs = []
    task = "squad_v2" if sc.version_2 else "squad"
    saved = TaskModels.for_run(cfg, out, model_dir, tokenizer)
    for seed in cfg.seeds:
        model = seeded(seed, lambda: SpanExtractor(load_encoder(model_dir, training.dropout)))
        evaluate_with.calls.clear()
        run = finetune(model, train_rows, evaluate_with, training, seed=seed, pad_id=tokenizer.pad_id,
                       log_dir=out / "logs", name="squad")
        # The kept epoch's predictions (the last epoch's may be another's), as the report's scores are.
        squad.write_predictions(evaluate_with.calls[run.best_epoch], out / f"squad-predictions-seed{seed}.json")
        saved.keep(task, seed, model, run, max_length=training.max_seq_length)
        runs.append(run)
    return [_summary(task, runs, {"benchmark": "squad", "train_examples": len(train_examples),
                                  "train_features": len(train_rows), "eval_examples": len(dev_examples),
                                  "training": training_record(training), **_saved(saved.publish(task, "f1"))})]


def squad_evaluator(examples, features, rows, data, sc, tokenizer, device, dtype):
    def evaluate(model):
        outputs = predict(model, rows, sc.training.eval_batch_size, tokenizer.pad_id, device, dtype)
        starts = [o[0] for o in outputs]
        ends = [o[1] for o in outputs]
        predictions, _ = squad.postprocess(examples, features, starts, ends, n_best_size=sc.n_best_size,
                                           max_answer_length=sc.max_answer_length, version_2=sc.version_2,
                                           null_score_diff_threshold=sc.null_score_diff_threshold)
        evaluate.last_predictions = predictions
        evaluate.calls.append(predictions)  # one per epoch of the current seed (run_squad clears it per seed)
        if sc.version_2:
            found = metrics.squad_v2_evaluate(data, predictions)
            return found, found["f1"]
        found = metrics.squad_evaluate(data, predictions)
        return found, found["f1"]

    evaluate.last_predictions = {}
    evaluate.calls = []
    return evaluate


def _filter_squad(data: list, keep: set) -> list:
    out = []
    for article in data:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = [qa for qa in paragraph["qas"] if qa["id"] in keep]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
        if paragraphs:
            out.append({**article, "paragraphs": paragraphs})
    return out


def run_conll(data_dir: Path, model_dir: Path, tokenizer, cfg: FinetuneConfig, out: Path) -> list[dict]:
    cc = cfg.conll
    training: TrainingConfig = cc.training
    files = {name: data_dir / getattr(cc, f"{name}_file") for name in ("train", "dev", "test")}
    sentences = {name: conll.read_conll(path) for name, path in files.items()}
    scheme = conll.detect_scheme(sentences["train"])
    sentences["train"] = _limit(sentences["train"], training.max_train_examples)
    for name in ("dev", "test"):
        sentences[name] = _limit(sentences[name], training.max_eval_examples)
    label_index = {label: i for i, label in enumerate(conll.LABELS)}

    def rows(items):
        encoded = []
        for sentence in items:
            tags = sentence.tags if scheme == "IOB2" else conll.iob1_to_iob2(sentence.tags)
            features = conll.encode_sentence(sentence.words, tokenizer, training.max_seq_length)
            encoded.append({"input_ids": features["input_ids"], "token_type_ids": features["token_type_ids"],
                            "labels": conll.label_ids([label_index[t] for t in tags], features["word_starts"],
                                                      len(features["input_ids"])),
                            "word_starts": features["word_starts"]})
        return encoded

    encoded = {name: rows(items) for name, items in sentences.items()}
    train_rows = [{k: r[k] for k in ("input_ids", "token_type_ids", "labels")} for r in encoded["train"]]
    device, dtype = device_and_dtype(training.precision)

    def score(model, name):
        logits = predict(model, encoded[name], training.eval_batch_size, tokenizer.pad_id, device, dtype)
        predicted = []
        for row, row_logits in zip(encoded[name], logits):
            tags = conll.words_from_token_predictions([conll.LABELS[i] for i in row_logits.argmax(-1)],
                                                      row["word_starts"])
            predicted.append(tags if scheme == "IOB2" else conll.iob2_to_iob1(tags))
        gold = [list(s.tags) for s in sentences[name]]
        found = metrics.conll_evaluate(gold, predicted, scheme=scheme)
        return found, found["f1"]

    results = {"dev": [], "test": []}
    saved = TaskModels.for_run(cfg, out, model_dir, tokenizer)
    for seed in cfg.seeds:
        model = seeded(seed, lambda: TokenClassifier(load_encoder(model_dir, training.dropout), len(conll.LABELS),
                                                     training.dropout))
        run = finetune(model, train_rows, lambda m: score(m, "dev"), training, seed=seed, pad_id=tokenizer.pad_id,
                       log_dir=out / "logs", name="conll")
        results["dev"].append(run)
        saved.keep("conll", seed, model, run, max_length=training.max_seq_length, labels=tuple(conll.LABELS))
        test_metrics, test_primary = score(model, "test")
        results["test"].append(type(run)(seed=seed, best_epoch=run.best_epoch, metrics=test_metrics,
                                         primary=test_primary, steps=run.steps))
    extra = {"benchmark": "conll", "scheme": scheme, "train_examples": len(train_rows),
             "training": training_record(training), **_saved(saved.publish("conll", "f1"))}  # selected on dev
    return [_summary("conll_dev", results["dev"], {**extra, "eval_examples": len(encoded["dev"])}),
            _summary("conll_test", results["test"], {**extra, "eval_examples": len(encoded["test"])})]


def _saved(entry: dict | None) -> dict:
    """The task result's ``saved_model`` (what ``TaskModels.publish`` says), when models are saved."""
    return {} if entry is None else {"saved_model": entry}


def check_data(benchmarks: list[str], glue_tasks: list[str], data_dir: Path, cfg: FinetuneConfig) -> None:
    """Every input file exists, before anything trains; one message lists all that are missing."""
    missing = []
    if "glue" in benchmarks:
        missing += [str(p) for task in glue_tasks for p in glue.required_files(data_dir / "glue", task) if not p.is_file()]
    if "squad" in benchmarks:
        missing += [str(data_dir / f) for f in (cfg.squad.train_file, cfg.squad.dev_file) if not (data_dir / f).is_file()]
    if "conll" in benchmarks:
        missing += [str(data_dir / f) for f in (cfg.conll.train_file, cfg.conll.dev_file, cfg.conll.test_file)
                    if not (data_dir / f).is_file()]
    if missing:
        raise DataError("missing data file(s): " + ", ".join(missing) + f". --data {data_dir} must hold glue/<Task>/ "
                        "(the download_glue_data.py layout), squad/ and conll2003/ (or set the file paths in the config)")


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(value, indent=2, default=str) + "\n")
    temporary.replace(path)


def now() -> float:
    return time.time()
