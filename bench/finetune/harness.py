"""What ``bench.finetune.against_transformers`` runs for both implementations: task data, the two models, and step timing.

Both implementations get the same feature rows, the same ``finetune.trainer.finetune`` loop (batches,
order, AdamW, schedule, clipping) and the same evaluation code; only the model differs:

* ours: ``finetune.heads.SequenceClassifier`` / ``TokenClassifier`` / ``SpanExtractor`` on our encoder;
* theirs: ``transformers``' ``BertForSequenceClassification`` / ``BertForTokenClassification`` /
  ``BertForQuestionAnswering`` (SDPA attention), behind ``TransformersAdapter``, which gives it our heads'
  ``forward(input_ids, token_type_ids, attention_mask, labels | start_positions, end_positions)``.

Both load the same checkpoint directory, and the freshly initialised task head starts from the same
N(0, initializer_range) draw, made from the run's seed, so one seed compares the implementations rather
than two head draws.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from finetune import conll, glue, metrics, squad
from finetune.config import ConllConfig, SquadConfig, TrainingConfig
from finetune.heads import SequenceClassifier, SpanExtractor, TokenClassifier, load_encoder
from finetune.suite import pair_features
from finetune.trainer import predict

GLUE_TASKS = ("mrpc", "rte", "cola", "stsb", "sst2")
TASKS = (*GLUE_TASKS, "conll", "squad")
CPU = torch.device("cpu")


@dataclass
class TaskData:
    """One task, ready to train: the rows the trainer batches and the scorer of a trained model."""

    name: str
    head: str                                   # "sequence", "token" or "span"
    num_labels: int
    training: TrainingConfig
    train_rows: list[dict]
    evaluate: Callable[[nn.Module], tuple[dict, float]]
    metric_names: tuple[str, ...]               # the figures reported, in points (percent x 100 scale)
    evaluated_on: str
    counts: dict = field(default_factory=dict)


def predict_by_length(model: nn.Module, rows: list[dict], batch_size: int, pad_id: int) -> list:
    """``finetune.trainer.predict`` on the rows sorted by length (far less padding), outputs in the rows' order."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    outputs = predict(model, [rows[i] for i in order], batch_size, pad_id, CPU, None)
    in_order = [None] * len(rows)
    for position, index in enumerate(order):
        in_order[index] = outputs[position]
    return in_order


def _points(found: dict, names: tuple[str, ...], scale: float) -> dict:
    return {name: round(float(found[name]) * scale, 4) for name in names}


# ---------------------------------------------------------------------------------------------------- tasks

def glue_task(task: str, data_dir: Path, tokenizer, training: TrainingConfig, *, subsample: int = 0,
              subsample_seed: int = 0) -> TaskData:
    """A GLUE task scored on its dev set; ``subsample``: a seeded random subset of the training set (file order
    kept), else the whole training set. ``training.max_train_examples`` / ``max_eval_examples`` cut both (--quick)."""
    train = glue.read_split(data_dir / "glue", task, "train")
    full_train = len(train)
    if subsample and subsample < len(train):
        keep = np.sort(np.random.default_rng(subsample_seed).choice(len(train), subsample, replace=False))
        train = [train[i] for i in keep]
    if training.max_train_examples:
        train = train[:training.max_train_examples]
    dev = glue.read_split(data_dir / "glue", task, "dev")
    dev = dev[:training.max_eval_examples] if training.max_eval_examples else dev
    spec = glue.task_spec(task)

    def rows(examples):
        return [{**pair_features(tokenizer, e.text_a, e.text_b, training.max_seq_length), "labels": e.label}
                for e in examples]

    train_rows, dev_rows = rows(train), rows(dev)
    labels = np.asarray([r["labels"] for r in dev_rows])
    names = metrics.GLUE_TASKS[task][0]

    def evaluate(model):
        outputs = np.stack(predict_by_length(model, dev_rows, training.eval_batch_size, tokenizer.pad_id))
        found = metrics.glue_metrics(task, labels, outputs[:, 0] if spec.regression else outputs.argmax(-1))
        return _points(found, names, 100.0), 100.0 * metrics.primary_score(task, found)

    counts = {"train_file_examples": full_train, "train_examples": len(train_rows), "eval_examples": len(dev_rows)}
    if subsample:
        counts["subsample"] = f"{len(train_rows)} of {full_train} training examples, numpy default_rng({subsample_seed})"
    return TaskData(task, "sequence", spec.num_labels, training, train_rows, evaluate, names, "dev", counts)


def conll_task(data_dir: Path, tokenizer, cc: ConllConfig, *, train_sentences: int = 0) -> TaskData:
    """CoNLL-2003: trained on the training file (its first ``train_sentences`` when set), scored on the test file."""
    training = cc.training
    sentences = {name: conll.read_conll(data_dir / path) for name, path in (("train", cc.train_file),
                                                                             ("test", cc.test_file))}
    scheme = conll.detect_scheme(sentences["train"])
    full_train = len(sentences["train"])
    limit = min(x for x in (train_sentences, training.max_train_examples, full_train) if x)
    sentences["train"] = sentences["train"][:limit]
    if training.max_eval_examples:
        sentences["test"] = sentences["test"][:training.max_eval_examples]
    label_index = {label: i for i, label in enumerate(conll.LABELS)}

    def encode(sentence):
        tags = sentence.tags if scheme == "IOB2" else conll.iob1_to_iob2(sentence.tags)
        features = conll.encode_sentence(sentence.words, tokenizer, training.max_seq_length)
        targets = conll.label_ids([label_index[t] for t in tags], features["word_starts"], len(features["input_ids"]))
        return {"input_ids": features["input_ids"], "token_type_ids": features["token_type_ids"], "labels": targets,
                "word_starts": features["word_starts"]}

    train_rows = [{k: v for k, v in encode(s).items() if k != "word_starts"} for s in sentences["train"]]
    test_rows = [encode(s) for s in sentences["test"]]
    gold = [list(s.tags) for s in sentences["test"]]
    names = ("f1", "precision", "recall")

    def evaluate(model):
        logits = predict_by_length(model, test_rows, training.eval_batch_size, tokenizer.pad_id)
        predicted = []
        for row, row_logits in zip(test_rows, logits):
            tags = conll.words_from_token_predictions([conll.LABELS[i] for i in row_logits.argmax(-1)],
                                                      row["word_starts"])
            predicted.append(tags if scheme == "IOB2" else conll.iob2_to_iob1(tags))
        found = metrics.conll_evaluate(gold, predicted, scheme=scheme)
        return {**_points(found, names, 100.0), "per_type_f1": {k: round(100 * v["f1"], 2)
                                                                 for k, v in found["per_type"].items()}}, 100 * found["f1"]

    counts = {"scheme": scheme, "train_file_sentences": full_train, "train_examples": len(train_rows),
              "eval_examples": len(test_rows), "train_file": cc.train_file, "test_file": cc.test_file}
    return TaskData("conll", "token", len(conll.LABELS), training, train_rows, evaluate, names, "test", counts)


def split_squad(dev_file: Path, train_articles: int, heldout_articles: int, out_dir: Path) -> tuple[Path, Path, dict]:
    """The SQuAD v1.1 dev set split by article, in file order: the first ``train_articles`` are the training part,
    the last ``heldout_articles`` the held-out part (any articles between are unused). Both written as SQuAD files."""
    raw = json.loads(dev_file.read_text(encoding="utf-8"))
    articles = raw["data"]
    if train_articles < 1 or heldout_articles < 1 or train_articles + heldout_articles > len(articles):
        raise ValueError(f"squad split: {train_articles} training + {heldout_articles} held-out articles do not fit "
                         f"the {len(articles)} articles of {dev_file}")
    parts = {"train": articles[:train_articles], "heldout": articles[len(articles) - heldout_articles:]}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, info = {}, {"source": str(dev_file), "articles_in_file": len(articles),
                       "rule": f"articles in file order: the first {train_articles} train, the last {heldout_articles} "
                               "are held out, the ones between are unused"}
    for name, part in parts.items():
        path = out_dir / f"squad-dev-{name}-part.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"version": raw.get("version", "1.1"), "data": part}))
        temporary.replace(path)
        paths[name] = path
        info[name] = {"articles": len(part), "titles": [a["title"] for a in part],
                      "paragraphs": sum(len(a["paragraphs"]) for a in part),
                      "questions": sum(len(p["qas"]) for a in part for p in a["paragraphs"])}
    return paths["train"], paths["heldout"], info


def squad_task(data_dir: Path, tokenizer, sc: SquadConfig, *, train_articles: int, heldout_articles: int,
               work: Path) -> TaskData:
    """SQuAD v1.1: trained on the training part of the dev-set split, scored (official EM/F1) on the held-out part."""
    training = sc.training
    train_path, heldout_path, split = split_squad(data_dir / sc.dev_file, train_articles, heldout_articles, work)
    train_examples, _ = squad.load_squad_json(str(train_path))
    eval_examples, eval_data = squad.load_squad_json(str(heldout_path))
    if training.max_train_examples:
        train_examples = train_examples[:training.max_train_examples]
    if training.max_eval_examples:
        eval_examples = eval_examples[:training.max_eval_examples]
        keep = {e.qid for e in eval_examples}
        eval_data = [{**a, "paragraphs": [{**p, "qas": [q for q in p["qas"] if q["id"] in keep]}
                                          for p in a["paragraphs"]]} for a in eval_data]
    options = dict(max_seq_length=training.max_seq_length, doc_stride=sc.doc_stride, max_query_length=sc.max_query_length)
    train_features = squad.make_features(train_examples, tokenizer, training=True, **options)
    eval_features = squad.make_features(eval_examples, tokenizer, training=False, **options)
    train_rows = [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids, "start_positions": f.start_position,
                   "end_positions": f.end_position} for f in train_features]
    eval_rows = [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids} for f in eval_features]
    names = ("exact_match", "f1")

    def evaluate(model):
        outputs = predict_by_length(model, eval_rows, training.eval_batch_size, tokenizer.pad_id)
        predictions, _ = squad.postprocess(eval_examples, eval_features, [o[0] for o in outputs], [o[1] for o in outputs],
                                           n_best_size=sc.n_best_size, max_answer_length=sc.max_answer_length)
        found = metrics.squad_evaluate(eval_data, predictions)
        return _points(found, names, 1.0), found["f1"]  # already percentages

    counts = {"split": split, "train_examples": len(train_examples), "train_features": len(train_rows),
              "eval_examples": len(eval_examples), "eval_features": len(eval_rows)}
    return TaskData("squad", "span", 2, training, train_rows, evaluate, names, "held-out articles", counts)


# --------------------------------------------------------------------------------------------------- models

def initial_head(seed: int, out_features: int, hidden: int, std: float) -> dict[str, torch.Tensor]:
    """The task head's first weights, N(0, std) from a generator seeded with the run seed, zero bias."""
    generator = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(out_features, hidden, generator=generator) * std, "bias": torch.zeros(out_features)}


def build_ours(task: TaskData, model_dir: Path, seed: int) -> nn.Module:
    dropout = task.training.dropout
    encoder = load_encoder(model_dir, dropout)
    if task.head == "sequence":
        model = SequenceClassifier(encoder, task.num_labels, dropout)
    elif task.head == "token":
        model = TokenClassifier(encoder, task.num_labels, dropout)
    else:
        model = SpanExtractor(encoder)
    head = model.qa_outputs if task.head == "span" else model.classifier
    head.load_state_dict(initial_head(seed, head.out_features, head.in_features, encoder.config.initializer_range))
    return model


class TransformersAdapter(nn.Module):
    """A ``transformers`` task model behind our heads' forward signature and return values."""

    def __init__(self, model: nn.Module, head: str):
        super().__init__()
        self.model, self.head = model, head

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None, start_positions=None, end_positions=None):
        out = self.model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                         **({"labels": labels} if labels is not None else {}),
                         **({"start_positions": start_positions, "end_positions": end_positions}
                            if start_positions is not None else {}))
        logits = (out.start_logits, out.end_logits) if self.head == "span" else out.logits
        return logits if out.loss is None else (out.loss, logits)


def build_theirs(task: TaskData, model_dir: Path, seed: int) -> nn.Module:
    import transformers

    kind = {"sequence": transformers.BertForSequenceClassification, "token": transformers.BertForTokenClassification,
            "span": transformers.BertForQuestionAnswering}[task.head]
    dropout = task.training.dropout
    model = kind.from_pretrained(str(model_dir), num_labels=task.num_labels, local_files_only=True,
                                 attn_implementation="sdpa", hidden_dropout_prob=dropout,
                                 attention_probs_dropout_prob=dropout)
    head = model.qa_outputs if task.head == "span" else model.classifier
    head.load_state_dict(initial_head(seed, head.out_features, head.in_features, model.config.initializer_range))
    return TransformersAdapter(model.train(), task.head)


BUILDERS = {"ours": build_ours, "theirs": build_theirs}


# --------------------------------------------------------------------------------------------------- timing

class Baton:
    """Two runs in two threads take turns, one training step each: only the holder computes.

    A run hands the baton over at the start of each of its steps and waits to get it back, so the two
    implementations alternate step by step and whatever else loads the machine hits both alike. A run
    that has finished leaves, and the other then goes on alone.
    """

    def __init__(self, first: str, second: str):
        self._turn = threading.Condition()
        self._holder, self._running = first, [first, second]

    def wait_for_turn(self, name: str) -> None:
        with self._turn:
            self._turn.wait_for(lambda: self._holder == name)

    def hand_over(self, name: str) -> None:
        with self._turn:
            others = [n for n in self._running if n != name]
            if others:
                self._holder = others[0]
                self._turn.notify_all()
                self._turn.wait_for(lambda: self._holder == name)

    def leave(self, name: str) -> None:
        with self._turn:
            self._running.remove(name)
            if self._running:
                self._holder = self._running[0]
            self._turn.notify_all()


class StepClock:
    """Times every training step of a ``finetune()`` run and counts what it processed.

    A forward pre-hook marks each training forward, the start of a step; a step ends at the next one or
    when the evaluation that follows it starts, so the sum is the training loop's time, evaluation
    excluded. With a ``Baton`` the hook also hands over between steps (not timed) and keeps this run's
    torch random state across the other run's steps, so each run draws exactly the dropout masks it
    would draw alone.
    """

    def __init__(self, model: nn.Module, name: str, baton: Baton | None = None, report_every: int = 0,
                 label: str = ""):
        self.name, self.baton, self.report_every, self.label = name, baton, report_every, label or name
        self.steps: list[tuple[float, int, int, int]] = []       # (seconds, rows, real tokens, padded tokens)
        self.eval_seconds = 0.0
        self._open: tuple[float, int, int, int] | None = None
        self._hook = model.register_forward_pre_hook(self._step_starts, with_kwargs=True)

    def _close_step(self) -> None:
        if self._open is not None:
            started, *counts = self._open
            self.steps.append((time.perf_counter() - started, *counts))
            self._open = None
            if self.report_every and len(self.steps) % self.report_every == 0:
                seconds, real = sum(s[0] for s in self.steps), sum(s[2] for s in self.steps)
                print(f"      {self.label}: {len(self.steps)} steps, {real / seconds:.0f} tok/s", flush=True)

    def _step_starts(self, module, args, kwargs) -> None:
        if not module.training:
            return
        self._close_step()
        if self.baton is not None:
            random_state = torch.get_rng_state()
            self.baton.hand_over(self.name)
            torch.set_rng_state(random_state)
        mask = kwargs["attention_mask"]
        self._open = (time.perf_counter(), int(mask.shape[0]), int(mask.sum()), int(mask.numel()))

    def timed(self, evaluate: Callable) -> Callable:
        def run(model):
            self._close_step()
            started = time.perf_counter()
            try:
                return evaluate(model)
            finally:
                self.eval_seconds += time.perf_counter() - started
        return run

    def summary(self) -> dict:
        self._hook.remove()
        self._close_step()
        seconds = [s for s, *_ in self.steps]
        total = sum(seconds)
        rows, real, padded = (sum(step[i] for step in self.steps) for i in (1, 2, 3))
        return {"steps": len(seconds), "train_loop_seconds": round(total, 2), "eval_seconds": round(self.eval_seconds, 2),
                "examples": rows, "real_tokens": real, "padded_tokens": padded,
                "examples_per_s": round(rows / total, 3) if total else None,
                "tokens_per_s": round(real / total, 1) if total else None,
                "median_step_s": round(statistics.median(seconds), 4) if seconds else None,
                "_step_seconds": seconds}


def run_in_lockstep(jobs: dict[str, Callable[[Baton], dict]], first: str) -> dict[str, dict]:
    """Runs the two jobs (name -> job(baton)) in two threads taking turns step by step, ``first`` starting."""
    names = [first, *[n for n in jobs if n != first]]
    baton = Baton(*names)
    results, errors = {}, {}

    def body(name):
        baton.wait_for_turn(name)
        try:
            results[name] = jobs[name](baton)
        except BaseException as exc:  # re-raised in the calling thread
            errors[name] = exc
        finally:
            baton.leave(name)

    threads = [threading.Thread(target=body, args=(name,), name=f"bench-{name}") for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise next(iter(errors.values()))
    return results


def paired_step_ratio(ours: list[float], theirs: list[float]) -> float | None:
    """Median over steps of theirs / ours on the same batch (both runs take the same batches in the same order)."""
    pairs = [t / o for o, t in zip(ours, theirs) if o > 0 and t > 0]
    return round(statistics.median(pairs), 3) if pairs else None
