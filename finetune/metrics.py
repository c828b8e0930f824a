"""The official scores of the three finetuning benchmarks, as pure functions of gold labels and predictions.

* GLUE: accuracy, binary F1, Matthews correlation, Pearson and Spearman correlation; the metric set each task
  reports, the one figure the BERT paper shows per task, and the paper's GLUE average.
* SQuAD: the v1.1 and v2.0 evaluation scripts' answer normalisation, exact match and token F1.
* CoNLL-2003: conlleval's chunk decoding and its span precision, recall and F1.

Only numpy and the standard library are imported here. scikit-learn, SciPy and seqeval are the reference
implementations that tests/finetune/test_metrics.py checks these against; they are test dependencies only.

Scales: GLUE and CoNLL scores are fractions (accuracy and F1 in [0, 1], correlations in [-1, 1]) that the report
multiplies by 100; SQuAD scores are percentages, because that is what the official scripts return.
"""
from __future__ import annotations

import collections
import math
import re
import string
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

__all__ = [
    "accuracy", "f1_binary", "matthews_corrcoef", "pearson", "spearman",
    "GLUE_TASKS", "glue_metrics", "primary_metric_name", "primary_score", "glue_average",
    "normalize_answer", "exact_match", "f1_score", "squad_evaluate", "squad_v2_evaluate",
    "get_entities", "conll_evaluate",
]


# --------------------------------------------------------------------------------------------------- GLUE metrics


def _paired(x, y, metric: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 1 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"{metric}: expected two 1-D sequences of equal length, got shapes {x.shape} and {y.shape}")
    if len(x) == 0:
        raise ValueError(f"{metric}: there are no examples to score")
    return x, y


def accuracy(labels, predictions) -> float:
    """The fraction of examples whose prediction equals the label."""
    labels, predictions = _paired(labels, predictions, "accuracy")
    return float(np.mean(labels == predictions))


def f1_binary(labels, predictions, positive=1) -> float:
    """F1 of the ``positive`` class (MRPC: paraphrase, QQP: duplicate)."""
    labels, predictions = _paired(labels, predictions, "f1")
    gold, guessed = labels == positive, predictions == positive
    true_positives = int(np.sum(gold & guessed))
    # 2TP / (2TP + FP + FN) = 2TP / (#gold positives + #predicted positives): F1 without forming precision and recall,
    # which may be 0/0 on their own. With no positive on either side it is undefined; 0.0, as scikit-learn returns.
    positives = int(gold.sum() + guessed.sum())
    return 2 * true_positives / positives if positives else 0.0


def matthews_corrcoef(labels, predictions) -> float:
    """Matthews correlation (CoLA's metric); 0.0 where undefined (one class only on either side), as scikit-learn.

    Written for CoLA's two classes, but computed with the K-class form (Gorodkin 2004, the one scikit-learn uses),
    which equals (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) for two classes and needs no positive label.
    """
    labels, predictions = _paired(labels, predictions, "matthews_corrcoef")
    _, codes = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    gold, guessed = codes[:len(labels)], codes[len(labels):]
    classes = int(codes.max()) + 1
    confusion = np.zeros((classes, classes), dtype=np.float64)  # float: the products below pass 2**63 on big sets
    np.add.at(confusion, (gold, guessed), 1.0)
    count = float(len(labels))
    gold_per_class, guessed_per_class = confusion.sum(axis=1), confusion.sum(axis=0)
    covariance = np.trace(confusion) * count - gold_per_class @ guessed_per_class
    gold_spread = count * count - gold_per_class @ gold_per_class
    guessed_spread = count * count - guessed_per_class @ guessed_per_class
    if gold_spread * guessed_spread == 0:
        return 0.0
    return float(covariance / math.sqrt(gold_spread * guessed_spread))


def _finite_floats(values: np.ndarray, metric: str) -> np.ndarray:
    values = values.astype(np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{metric}: the inputs hold NaN or infinite values")
    return values


def pearson(x, y) -> float:
    """Pearson's r (STS-B). 0.0 when either side is constant, where SciPy returns NaN: a constant regressor is
    no better than chance, and a NaN would lose every best-epoch comparison and poison averages."""
    x, y = _paired(x, y, "pearson")
    x, y = _finite_floats(x, "pearson"), _finite_floats(y, "pearson")
    # Test constancy on the values, not on the centred spread: the mean of identical floats can differ from them
    # by a rounding step, which would leave a spread of noise and a meaningless r.
    if np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    x_centred, y_centred = x - x.mean(), y - y.mean()
    # Scale each side to unit length before the dot product, so large values cannot overflow the product of norms.
    r = (x_centred / np.linalg.norm(x_centred)) @ (y_centred / np.linalg.norm(y_centred))
    return float(np.clip(r, -1.0, 1.0))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks where tied values share the mean of the ranks they span (SciPy's rankdata 'average')."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_group = np.concatenate([[True], ordered[1:] != ordered[:-1]])
    group_of = np.cumsum(starts_group) - 1
    first = np.flatnonzero(starts_group)                   # 0-based position where each group of ties begins
    past_last = np.append(first[1:], len(values))
    mean_rank = (first + 1 + past_last) / 2.0                # the mean of the 1-based ranks first+1 .. past_last
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = mean_rank[group_of]
    return ranks


def spearman(x, y) -> float:
    """Spearman's rho: Pearson's r of the average ranks (SciPy's spearmanr); 0.0 when either side is constant."""
    x, y = _paired(x, y, "spearman")
    x, y = _finite_floats(x, "spearman"), _finite_floats(y, "spearman")
    return pearson(_average_ranks(x), _average_ranks(y))


_METRICS: dict[str, Callable[..., float]] = {"accuracy": accuracy, "f1": f1_binary, "mcc": matthews_corrcoef,
                                             "pearson": pearson, "spearman": spearman}

# task -> (the metrics GLUE defines for it, the one the BERT paper's Table 1 shows). The paper's caption: F1 for
# QQP and MRPC, Spearman for STS-B, accuracy for the others, and CoLA's column is Matthews correlation, as GLUE
# defines it. (The GLUE leaderboard instead scores MRPC, QQP and STS-B by the mean of their two metrics.)
# MNLI is two entries, one per dev set, because the paper reports and averages them separately.
GLUE_TASKS: dict[str, tuple[tuple[str, ...], str]] = {
    "cola": (("mcc",), "mcc"),
    "sst2": (("accuracy",), "accuracy"),
    "mrpc": (("accuracy", "f1"), "f1"),
    "stsb": (("pearson", "spearman"), "spearman"),
    "qqp": (("accuracy", "f1"), "f1"),
    "mnli_matched": (("accuracy",), "accuracy"),
    "mnli_mismatched": (("accuracy",), "accuracy"),
    "qnli": (("accuracy",), "accuracy"),
    "rte": (("accuracy",), "accuracy"),
    "wnli": (("accuracy",), "accuracy"),
}

# The BERT paper's "Average" (Table 1) is the plain mean of the nine figures left of it: MNLI-m and MNLI-mm as two
# entries, then QQP, QNLI, SST-2, CoLA, STS-B, MRPC, RTE. WNLI is left out (the paper calls it problematic).
# Check on the printed rows: BERT-Base's nine figures average to 79.6 and BERT-Large's to 82.1, as printed;
# averaging MNLI-m/mm into one entry first would give 79.1 and 81.6.
_NOT_IN_AVERAGE = frozenset({"wnli"})


def _task_entry(task: str) -> tuple[tuple[str, ...], str]:
    if task not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[task]


def glue_metrics(task: str, labels, predictions) -> dict[str, float]:
    """The task's official metrics: cola {"mcc"}; mrpc, qqp {"accuracy", "f1"}; stsb {"pearson", "spearman"}
    (``predictions`` are then the regression outputs); every other task {"accuracy"}."""
    names, _ = _task_entry(task)
    return {name: _METRICS[name](labels, predictions) for name in names}


def primary_metric_name(task: str) -> str:
    """The key of the figure the BERT paper reports for ``task``: "mcc", "f1", "spearman" or "accuracy"."""
    return _task_entry(task)[1]


def primary_score(task: str, metrics: Mapping[str, float]) -> float:
    """The figure the BERT paper reports for ``task``, picked from ``glue_metrics``' result."""
    return metrics[primary_metric_name(task)]


def glue_average(scores: Mapping[str, float]) -> float:
    """The BERT paper's GLUE average over the tasks present in ``scores`` (task -> primary score, any one scale).

    WNLI is ignored; MNLI counts as its two entries. NaN when no task of the average is present, since the mean of
    nothing is undefined and a report of a WNLI-only run should still be written.
    """
    for task in scores:
        _task_entry(task)
    counted = [float(score) for task, score in scores.items() if task not in _NOT_IN_AVERAGE]
    return sum(counted) / len(counted) if counted else math.nan


# ---------------------------------------------------------------------------------------------------------- SQuAD

# Both official scripts (v1.1 and v2.0) normalise the same way, in this order: lowercase, drop every ASCII
# punctuation character, blank out the articles a/an/the as whole words, squeeze whitespace. The order shows:
# punctuation goes before articles are looked for, so "U.S." becomes "us" and "the-end" becomes "theend".
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Answer text as the official SQuAD scripts compare it."""
    lowered = text.lower()
    without_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    without_articles = _ARTICLES.sub(" ", without_punctuation)
    return " ".join(without_articles.split())


def exact_match(prediction: str, ground_truth: str) -> float:
    """1.0 when the two answers are equal after normalisation, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """v1.1's token F1: bag-of-words overlap of the normalised answers; 0.0 without a common token
    (so two empty answers score 0.0 here, unlike v2.0)."""
    predicted_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    shared = sum((collections.Counter(predicted_tokens) & collections.Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _v2_f1(prediction: str, ground_truth: str) -> float:
    # v2.0 scores "no answer" as a token list of its own: two empty answers agree (1.0), one empty one does not.
    predicted, gold = normalize_answer(prediction), normalize_answer(ground_truth)
    if not predicted or not gold:
        return float(predicted == gold)
    return f1_score(prediction, ground_truth)


def _questions(data: Sequence[Mapping]) -> Iterator[Mapping]:
    if isinstance(data, Mapping):
        raise TypeError("pass the dataset's 'data' list (json.load(f)['data']), not the whole JSON object")
    for article in data:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def squad_evaluate(data: Sequence[Mapping], predictions: Mapping[str, str]) -> dict[str, float]:
    """SQuAD v1.1's official evaluation: {"exact_match", "f1"} in percent, each question scored against its best
    gold answer and averaged over every question in ``data``; a question without a prediction scores 0 and is
    counted in "missing"; "total" is the number of questions."""
    total = missing = 0
    exact_sum = f1_sum = 0.0
    for qa in _questions(data):
        total += 1
        if qa["id"] not in predictions:
            missing += 1
            continue
        golds = [answer["text"] for answer in qa["answers"]]
        if not golds:
            raise ValueError(f"question {qa['id']} has no gold answer: SQuAD v2.0 data needs squad_v2_evaluate")
        prediction = predictions[qa["id"]]
        exact_sum += max(exact_match(prediction, gold) for gold in golds)
        f1_sum += max(f1_score(prediction, gold) for gold in golds)
    if total == 0:
        raise ValueError("the SQuAD data holds no questions")
    return {"exact_match": 100.0 * exact_sum / total, "f1": 100.0 * f1_sum / total, "total": total, "missing": missing}


def squad_v2_evaluate(data: Sequence[Mapping], predictions: Mapping[str, str]) -> dict[str, float]:
    """SQuAD v2.0's official evaluation (without a no-answer probability file), in percent.

    Keys: "exact", "f1", "total"; "HasAns_exact", "HasAns_f1", "HasAns_total" when some question has an answer;
    "NoAns_exact", "NoAns_f1", "NoAns_total" when some has none (the official script leaves out an empty group
    too); "missing". An unanswerable question's only gold answer is "", so predicting "" is right there.
    A missing prediction scores 0 and is counted, as v1.1 does; the official v2.0 script stops with a KeyError.
    """
    exact: dict[bool, list[float]] = {True: [], False: []}     # has an answer -> per-question scores
    f1: dict[bool, list[float]] = {True: [], False: []}
    missing = 0
    for qa in _questions(data):
        has_answer = bool(qa["answers"])
        # As the official script: gold texts that normalise to nothing are dropped, and with none left the
        # question is scored as unanswerable even when it counts in the HasAns group.
        golds = [answer["text"] for answer in qa["answers"] if normalize_answer(answer["text"])] or [""]
        if qa["id"] not in predictions:
            missing += 1
            exact[has_answer].append(0.0)
            f1[has_answer].append(0.0)
            continue
        prediction = predictions[qa["id"]]
        exact[has_answer].append(max(exact_match(prediction, gold) for gold in golds))
        f1[has_answer].append(max(_v2_f1(prediction, gold) for gold in golds))
    everything_exact, everything_f1 = exact[True] + exact[False], f1[True] + f1[False]
    if not everything_exact:
        raise ValueError("the SQuAD data holds no questions")
    result = _percentages("", everything_exact, everything_f1)
    for has_answer, prefix in ((True, "HasAns_"), (False, "NoAns_")):
        if exact[has_answer]:
            result.update(_percentages(prefix, exact[has_answer], f1[has_answer]))
    result["missing"] = missing
    return result


def _percentages(prefix: str, exact: list[float], f1: list[float]) -> dict[str, float]:
    return {f"{prefix}exact": 100.0 * sum(exact) / len(exact), f"{prefix}f1": 100.0 * sum(f1) / len(f1),
            f"{prefix}total": len(exact)}


# ------------------------------------------------------------------------------------------------- CoNLL (conlleval)

Span = tuple[str, int, int]  # (entity type, first token, last token), inclusive
SCHEMES = ("IOB1", "IOB2")


def _split_tag(tag: str) -> tuple[str, str]:
    """("O", "") or (prefix, type), split at the first hyphen as conlleval does, so types may contain hyphens."""
    if tag == "O":
        return "O", ""
    prefix, hyphen, kind = tag.partition("-")
    if prefix not in ("B", "I") or not hyphen or not kind:
        # conlleval would also read E-/S- tags, but by IOE rules (E-X then B-X is one chunk), not IOBES ones:
        # refusing them is safer than a silently different count.
        raise ValueError(f"tag {tag!r} is not O, B-<type> or I-<type>")
    return prefix, kind


def get_entities(tags: Sequence[str], scheme: str = "IOB2") -> list[Span]:
    """The chunks conlleval reads in one sentence's tags, in order.

    conlleval decodes IOB1 and IOB2 with the same rules, so ``scheme`` only guards against other encodings:
    a chunk starts at B-X, or at I-X after O or after a chunk of another type (IOB1's normal start, and a common
    slip in IOB2 predictions, which conlleval still counts); it continues over I-X of its own type and ends at
    anything else, including B-X of the same type (IOB1's way of parting two adjacent chunks of one type).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported tagging scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    spans: list[Span] = []
    open_type, open_start = None, 0
    for position, tag in enumerate(tags):
        prefix, kind = _split_tag(tag)
        if open_type is not None and prefix == "I" and kind == open_type:
            continue
        if open_type is not None:
            spans.append((open_type, open_start, position - 1))
            open_type = None
        if prefix != "O":
            open_type, open_start = kind, position
    if open_type is not None:
        spans.append((open_type, open_start, len(tags) - 1))
    return spans


def _precision_recall_f1(correct: int, predicted: int, gold: int) -> dict[str, float]:
    # conlleval's conventions: each ratio is 0 when its denominator is, and so is F1 when both ratios are.
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def conll_evaluate(true_sequences: Sequence[Sequence[str]], pred_sequences: Sequence[Sequence[str]],
                   scheme: str = "IOB2") -> dict:
    """conlleval over sentences: span "precision", "recall", "f1" (a predicted span counts when its type, first and
    last token all match a gold one), token "accuracy" (whole tags equal), and "per_type": {type: {"precision",
    "recall", "f1", "support" (gold spans)}} for every type seen in gold or predictions. Fractions in [0, 1].
    Spans never cross sentences: conlleval reads a sentence break as an O."""
    if len(true_sequences) != len(pred_sequences):
        raise ValueError(f"{len(true_sequences)} gold sentences but {len(pred_sequences)} predicted")
    gold_count: collections.Counter = collections.Counter()
    predicted_count: collections.Counter = collections.Counter()
    correct_count: collections.Counter = collections.Counter()
    tokens = correct_tokens = 0
    for index, (gold_tags, predicted_tags) in enumerate(zip(true_sequences, pred_sequences)):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(f"sentence {index}: {len(gold_tags)} gold tags but {len(predicted_tags)} predicted")
        gold_spans = set(get_entities(gold_tags, scheme))
        predicted_spans = set(get_entities(predicted_tags, scheme))
        gold_count.update(_types(gold_spans))
        predicted_count.update(_types(predicted_spans))
        correct_count.update(_types(gold_spans & predicted_spans))
        tokens += len(gold_tags)
        correct_tokens += sum(gold == predicted for gold, predicted in zip(gold_tags, predicted_tags))
    overall = _precision_recall_f1(sum(correct_count.values()), sum(predicted_count.values()),
                                   sum(gold_count.values()))
    per_type = {kind: {**_precision_recall_f1(correct_count[kind], predicted_count[kind], gold_count[kind]),
                       "support": gold_count[kind]}
                for kind in sorted(gold_count.keys() | predicted_count.keys())}
    return {**overall, "accuracy": correct_tokens / tokens if tokens else 0.0, "per_type": per_type}


def _types(spans: Iterable[Span]) -> Iterator[str]:
    return (kind for kind, _, _ in spans)
