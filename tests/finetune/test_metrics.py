"""finetune/metrics.py against independent implementations.

GLUE: scikit-learn and SciPy on random and degenerate inputs. CoNLL: seqeval's default (conlleval-compatible)
mode and a token-by-token transcription of conlleval.pl's own counting, on random IOB1, IOB2 and free-form tag
sequences. SQuAD: hand-worked normalisation and F1 cases, and the real v1.1 dev set.
"""
import collections
import json
import math
import random
import warnings

import numpy as np
import pytest
from scipy import stats
from seqeval import metrics as seqeval
from sklearn import metrics as sklearn

from finetune import metrics


def quietly(function, *args, **kwargs):
    """The references warn on the degenerate inputs these tests feed them on purpose."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


# --------------------------------------------------------------------------------------------------- GLUE metrics


def binary_cases() -> list[tuple[np.ndarray, np.ndarray]]:
    handpicked = [([1], [1]), ([0], [1]), ([1, 1, 1], [1, 1, 1]), ([0, 0, 0], [0, 0, 0]), ([0, 0, 0], [1, 1, 1]),
                  ([0, 0, 1, 1], [1, 1, 0, 0]), ([0, 1, 0, 1], [0, 0, 0, 0]), ([0, 1, 0, 1], [1, 1, 1, 1])]
    cases = [(np.array(labels), np.array(predictions)) for labels, predictions in handpicked]
    rng = np.random.default_rng(0)
    for size in (2, 3, 7, 50, 500):
        for positive_rate in (0.05, 0.5, 0.95):
            labels = (rng.random(size) < positive_rate).astype(np.int64)
            cases.append((labels, np.where(rng.random(size) < 0.25, 1 - labels, labels)))  # a decent classifier
            cases.append((labels, (rng.random(size) < positive_rate).astype(np.int64)))    # chance
    return cases


def test_classification_metrics_match_scikit_learn():
    for labels, predictions in binary_cases():
        case = f"labels={labels.tolist()[:8]} predictions={predictions.tolist()[:8]} (n={len(labels)})"
        assert metrics.accuracy(labels, predictions) == pytest.approx(
            sklearn.accuracy_score(labels, predictions), abs=1e-12), case
        for positive in (1, 0):
            assert metrics.f1_binary(labels, predictions, positive=positive) == pytest.approx(
                quietly(sklearn.f1_score, labels, predictions, pos_label=positive), abs=1e-12), case
        assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(
            quietly(sklearn.matthews_corrcoef, labels, predictions), abs=1e-12), case


def test_matthews_is_zero_where_undefined_and_exact_on_a_worked_case():
    assert metrics.matthews_corrcoef([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0   # one gold class only
    assert metrics.matthews_corrcoef([1, 0, 1, 0], [0, 0, 0, 0]) == 0.0   # one predicted class only
    # TP=2, TN=1, FP=1, FN=0: (2*1 - 1*0) / sqrt(3 * 2 * 2 * 1)
    assert metrics.matthews_corrcoef([1, 1, 0, 0], [1, 1, 1, 0]) == pytest.approx(2 / math.sqrt(12))


def test_matthews_on_many_classes_and_a_large_set_matches_scikit_learn():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=300)
    predictions = np.where(rng.random(300) < 0.4, rng.integers(0, 3, size=300), labels)
    assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(
        sklearn.matthews_corrcoef(labels, predictions), abs=1e-12)
    # QQP-sized: n**2 * (per-class sums) would overflow int64 arithmetic
    labels = rng.integers(0, 2, size=400_000)
    predictions = np.where(rng.random(400_000) < 0.2, 1 - labels, labels)
    assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(
        sklearn.matthews_corrcoef(labels, predictions), abs=1e-12)


def correlation_cases() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(2)
    cases = [(np.array([1.0, 2.0]), np.array([2.0, 1.0])), (np.array([1, 2, 3]), np.array([1, 2, 2]))]
    for size in (3, 10, 100, 1500):
        x = rng.normal(size=size)
        cases.append((x, 0.7 * x + rng.normal(size=size)))
        cases.append((x.astype(np.float32), rng.normal(size=size).astype(np.float32)))
        # ties on both sides: integer grades, and STS-B's fifths of a point against predictions rounded to 0.5
        cases.append((rng.integers(0, 4, size=size), rng.integers(0, 4, size=size)))
        gold = np.round(rng.uniform(0, 5, size=size) * 5) / 5
        cases.append((gold, np.round((gold + rng.normal(scale=1.0, size=size)) * 2) / 2))
    return cases


def test_correlations_match_scipy_including_ties():
    for x, y in correlation_cases():
        case = f"x={x[:5]} y={y[:5]} (n={len(x)})"
        # metrics works in float64 whatever comes in; SciPy keeps float32 (model outputs) in float32
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x64, y64).statistic, abs=1e-10), case
        assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x64, y64).statistic, abs=1e-10), case


def test_correlation_with_a_constant_side_is_zero_where_scipy_says_nan():
    for constant in ([0.3] * 7, [2] * 7):
        other = [0.1, 0.5, 0.2, 0.9, 0.4, 0.4, 0.0]
        assert math.isnan(quietly(stats.pearsonr, constant, other).statistic)
        assert metrics.pearson(constant, other) == 0.0 and metrics.pearson(other, constant) == 0.0
        assert metrics.spearman(constant, other) == 0.0


@pytest.mark.parametrize("function", [metrics.accuracy, metrics.f1_binary, metrics.matthews_corrcoef,
                                      metrics.pearson, metrics.spearman])
def test_metrics_refuse_mismatched_or_empty_inputs(function):
    with pytest.raises(ValueError, match="equal length"):
        function([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="no examples"):
        function([], [])


def test_correlations_refuse_nan():
    with pytest.raises(ValueError, match="NaN"):
        metrics.pearson([1.0, float("nan"), 2.0], [1.0, 2.0, 3.0])


# Written out here rather than read from metrics.GLUE_TASKS, so a change to the table has to change the test too.
EXPECTED_KEYS = {"cola": {"mcc"}, "sst2": {"accuracy"}, "mrpc": {"accuracy", "f1"}, "stsb": {"pearson", "spearman"},
                 "qqp": {"accuracy", "f1"}, "mnli_matched": {"accuracy"}, "mnli_mismatched": {"accuracy"},
                 "qnli": {"accuracy"}, "rte": {"accuracy"}, "wnli": {"accuracy"}}
EXPECTED_PRIMARY = {"cola": "mcc", "mrpc": "f1", "qqp": "f1", "stsb": "spearman"}  # the rest: accuracy


@pytest.mark.parametrize("task", sorted(EXPECTED_KEYS))
def test_glue_metrics_give_each_task_its_official_set(task):
    rng = np.random.default_rng(3)
    if task == "stsb":
        labels = rng.uniform(0, 5, size=40)
        predictions = labels + rng.normal(size=40)
    else:
        labels = rng.integers(0, 2, size=40)
        predictions = np.where(rng.random(40) < 0.3, 1 - labels, labels)
    found = metrics.glue_metrics(task, labels, predictions)
    assert set(found) == EXPECTED_KEYS[task]
    direct = {"accuracy": metrics.accuracy, "f1": metrics.f1_binary, "mcc": metrics.matthews_corrcoef,
              "pearson": metrics.pearson, "spearman": metrics.spearman}
    assert all(found[key] == direct[key](labels, predictions) for key in found)
    name = EXPECTED_PRIMARY.get(task, "accuracy")
    assert metrics.primary_metric_name(task) == name
    assert metrics.primary_score(task, found) == found[name]


@pytest.mark.parametrize("task", ["mnli", "SST-2", "sts-b", "squad"])
def test_unknown_glue_task_names_are_refused(task):
    with pytest.raises(ValueError, match="unknown GLUE task"):
        metrics.glue_metrics(task, [1], [1])
    with pytest.raises(ValueError, match="unknown GLUE task"):
        metrics.glue_average({task: 50.0})


# BERT paper (arXiv:1810.04805v2) Table 1, test-set figures, with the Average it prints next to them.
PAPER_BASE = {"mnli_matched": 84.6, "mnli_mismatched": 83.4, "qqp": 71.2, "qnli": 90.5, "sst2": 93.5, "cola": 52.1,
              "stsb": 85.8, "mrpc": 88.9, "rte": 66.4}
PAPER_LARGE = {"mnli_matched": 86.7, "mnli_mismatched": 85.9, "qqp": 72.1, "qnli": 92.7, "sst2": 94.9, "cola": 60.5,
               "stsb": 86.5, "mrpc": 89.3, "rte": 70.1}


def test_glue_average_reproduces_the_bert_paper():
    assert round(metrics.glue_average(PAPER_BASE), 1) == 79.6
    assert round(metrics.glue_average(PAPER_LARGE), 1) == 82.1
    assert metrics.glue_average({**PAPER_BASE, "wnli": 65.1}) == metrics.glue_average(PAPER_BASE)  # WNLI left out
    assert metrics.glue_average({"cola": 50.0, "wnli": 10.0, "rte": 70.0}) == 60.0                 # tasks present
    assert math.isnan(metrics.glue_average({"wnli": 56.3}))


# ---------------------------------------------------------------------------------------------------------- SQuAD


@pytest.mark.parametrize("text, normalized", [
    ("The  Cat!", "cat"),
    ("a an the", ""),
    ("U.S.", "us"),                        # punctuation inside a word goes, and the letters join
    ("the-end", "theend"),                 # punctuation goes before articles are looked for
    ("An Apple a Day", "apple day"),
    ("Theatre anthem", "theatre anthem"),  # articles only as whole words
    ("  tabs\tand\nnewlines ", "tabs and newlines"),
    ("Café, naïve.", "café naïve"),
    ("Arab–Israeli “war”", "arab–israeli “war”"),  # only ASCII punctuation is removed: dashes and curly quotes stay
])
def test_normalize_answer_as_the_official_script(text, normalized):
    assert metrics.normalize_answer(text) == normalized


@pytest.mark.parametrize("prediction, gold, expected", [
    ("The  Cat!", "cat", 1.0),
    ("the big red cat", "red cat sat", 2 / 3),         # tokens big red cat / red cat sat: 2 shared of 3 and 3
    ("x x y", "x y y z", 4 / 7),                        # bag of words: x once and y once shared; P 2/3, R 2/4
    ("Denver Broncos", "the broncos", 2 / 3),           # P 1/2, R 1
    ("cat", "dog", 0.0),
    ("", "", 0.0),                                      # v1.1: no shared token, no credit
    ("the", "a", 0.0),
])
def test_token_f1_hand_worked(prediction, gold, expected):
    assert metrics.f1_score(prediction, gold) == pytest.approx(expected)


def test_exact_match_compares_normalized_text():
    assert metrics.exact_match("The  Cat!", "cat") == 1.0
    assert metrics.exact_match("the cats", "cat") == 0.0
    assert metrics.exact_match("", "the") == 1.0  # both normalise to nothing


def squad_data(*questions: tuple[str, list[str]]) -> list[dict]:
    qas = [{"id": qid, "question": "?", "answers": [{"text": text, "answer_start": 0} for text in golds]}
           for qid, golds in questions]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas[:2]}, {"context": "c", "qas": qas[2:]}]}]


def test_squad_takes_the_best_gold_answer_and_counts_missing_predictions():
    data = squad_data(("q1", ["Denver Broncos", "Broncos", "the Broncos"]), ("q2", ["Santa Clara, California"]),
                      ("q3", ["gold"]), ("q4", ["1,000"]))
    predictions = {"q1": "broncos", "q2": "Santa Clara", "q3": "golden", "unknown id": "ignored"}
    found = metrics.squad_evaluate(data, predictions)
    # q1 exact (second gold); q2 F1 2/3 (P 1, R 2/3 -> 0.8); q3 0; q4 missing counts 0
    assert found == {"exact_match": pytest.approx(25.0), "f1": pytest.approx(100 * (1 + 0.8) / 4),
                     "total": 4, "missing": 1}


def test_squad_v1_refuses_v2_data_and_the_whole_json_object():
    with pytest.raises(ValueError, match="squad_v2_evaluate"):
        metrics.squad_evaluate(squad_data(("q1", [])), {"q1": ""})
    with pytest.raises(TypeError, match="'data' list"):
        metrics.squad_evaluate({"version": "1.1", "data": squad_data(("q1", ["a"]))}, {"q1": "a"})


def test_squad_v2_scores_no_answer_as_the_empty_string():
    data = squad_data(("has1", ["Broncos"]), ("has2", ["red cat sat"]), ("no1", []), ("no2", []), ("dot", ["."]))
    predictions = {"has1": "Broncos", "has2": "the big red cat", "no1": "", "no2": "something", "dot": ""}
    found = metrics.squad_v2_evaluate(data, predictions)
    # has1 1/1; has2 0/(2/3); dot is answerable but its only gold normalises to nothing, so "" is right: 1/1;
    # no1 1/1; no2 0/0.
    assert found["HasAns_total"] == 3 and found["NoAns_total"] == 2 and found["total"] == 5 and found["missing"] == 0
    assert found["HasAns_exact"] == pytest.approx(200 / 3) and found["HasAns_f1"] == pytest.approx(100 * (2 + 2 / 3) / 3)
    assert found["NoAns_exact"] == found["NoAns_f1"] == pytest.approx(50.0)
    assert found["exact"] == pytest.approx(60.0) and found["f1"] == pytest.approx(100 * (3 + 2 / 3) / 5)


def test_squad_v2_counts_missing_predictions_and_omits_an_empty_group():
    found = metrics.squad_v2_evaluate(squad_data(("has1", ["Broncos"]), ("has2", ["cat"])), {"has1": "broncos"})
    assert found == {"exact": 50.0, "f1": 50.0, "total": 2, "HasAns_exact": 50.0, "HasAns_f1": 50.0,
                     "HasAns_total": 2, "missing": 1}


@pytest.fixture(scope="module")
def squad_dev(shared_data) -> list[dict]:
    return json.loads((shared_data / "squad" / "dev-v1.1.json").read_text())["data"]


def test_squad_dev_set_scores_the_first_gold_answer_perfectly(squad_dev):
    first_gold = {qa["id"]: qa["answers"][0]["text"]
                  for article in squad_dev for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    found = metrics.squad_evaluate(squad_dev, first_gold)
    assert found == {"exact_match": 100.0, "f1": 100.0, "total": 10570, "missing": 0}
    as_v2 = metrics.squad_v2_evaluate(squad_dev, first_gold)
    assert as_v2["exact"] == as_v2["f1"] == 100.0 and as_v2["HasAns_total"] == 10570 and "NoAns_total" not in as_v2


def test_squad_dev_set_scores_empty_and_missing_answers_as_nothing(squad_dev):
    questions = [qa["id"] for article in squad_dev for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    empty = metrics.squad_evaluate(squad_dev, dict.fromkeys(questions, ""))
    # Not quite 0 exact match: three dev questions list "." among their gold answers, which normalises to "" and so
    # equals an empty prediction under the official v1.1 script (F1 stays 0: no shared token).
    assert empty["exact_match"] == pytest.approx(100 * 3 / 10570) and empty["f1"] == 0.0
    # v2.0 drops golds that normalise to nothing, so there the empty answer is plainly wrong
    empty_v2 = metrics.squad_v2_evaluate(squad_dev, dict.fromkeys(questions, ""))
    assert empty_v2["exact"] == 0.0 and empty_v2["f1"] == 0.0
    assert metrics.squad_evaluate(squad_dev, {}) == {"exact_match": 0.0, "f1": 0.0, "total": 10570, "missing": 10570}


# ------------------------------------------------------------------------------------------------ CoNLL (conlleval)

TYPES = ("PER", "LOC", "ORG", "MISC")


@pytest.mark.parametrize("tags, spans", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    (["I-PER", "I-PER", "O", "I-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),          # IOB1: I- starts after O
    (["I-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),               # B- parts same-type neighbours
    (["B-PER", "B-PER"], [("PER", 0, 0), ("PER", 1, 1)]),
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),              # a type change starts a chunk
    (["O", "O", "O"], []),
    ([], []),
    (["B-MISC-X", "I-MISC-X"], [("MISC-X", 0, 1)]),                              # types may contain hyphens
])
def test_get_entities_hand_worked(tags, spans):
    assert metrics.get_entities(tags, "IOB1") == metrics.get_entities(tags, "IOB2") == spans


@pytest.mark.parametrize("tag", ["E-PER", "S-PER", "PER", "B-", "B", "o", "I_PER"])
def test_get_entities_refuses_tags_conlleval_would_misread(tag):
    with pytest.raises(ValueError, match="is not O, B-<type> or I-<type>"):
        metrics.get_entities(["O", tag], "IOB2")


def test_unsupported_scheme_is_refused():
    with pytest.raises(ValueError, match="unsupported tagging scheme"):
        metrics.get_entities(["B-PER"], "IOBES")


def random_spans(rng: random.Random, length: int) -> list[tuple[str, int, int]]:
    """Non-overlapping spans, often back to back and of one type, the case where IOB1 needs a B- tag."""
    spans, position = [], 0
    while position < length:
        if rng.random() < 0.45:
            end = min(length - 1, position + rng.randint(0, 2))
            kind = spans[-1][0] if spans and spans[-1][2] == position - 1 and rng.random() < 0.5 else rng.choice(TYPES)
            spans.append((kind, position, end))
            position = end + 1
        else:
            position += 1
    return spans


def encode(spans, length: int, scheme: str) -> list[str]:
    tags = ["O"] * length
    previous_end, previous_kind = None, None
    for kind, start, end in spans:
        for position in range(start, end + 1):
            tags[position] = f"I-{kind}"
        # IOB2 marks every first token; IOB1 only one that directly follows a chunk of its own type
        if scheme == "IOB2" or (previous_end == start - 1 and previous_kind == kind):
            tags[start] = f"B-{kind}"
        previous_end, previous_kind = end, kind
    return tags


def random_tag(rng: random.Random) -> str:
    return "O" if rng.random() < 0.4 else f"{rng.choice('BI')}-{rng.choice(TYPES)}"


def corrupt(rng: random.Random, tags: list[str], rate: float) -> list[str]:
    """A plausible tagger: mostly right, and wrong in every way a tagger can be (I- after O, B- after I- ...)."""
    return [random_tag(rng) if rng.random() < rate else tag for tag in tags]


def random_corpus(seed: int, kind: str) -> tuple[list[list[str]], list[list[str]]]:
    rng = random.Random(seed)
    gold, guessed = [], []
    for _ in range(rng.randint(1, 12)):
        length = rng.randint(1, 14)
        if kind == "free":
            gold.append([random_tag(rng) for _ in range(length)])
            guessed.append([random_tag(rng) for _ in range(length)])
        else:
            gold.append(encode(random_spans(rng, length), length, kind))
            guessed.append(corrupt(rng, gold[-1], rate=rng.choice([0.0, 0.1, 0.3])))
    if seed % 10 == 0:  # now and then a corpus of O only, or a tagger that finds nothing
        guessed = [["O"] * len(sentence) for sentence in guessed]
        if seed % 20 == 0:
            gold = [["O"] * len(sentence) for sentence in gold]
    return gold, guessed


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2"])
def test_iob1_and_iob2_encodings_decode_to_their_spans(scheme):
    rng = random.Random(4)
    for _ in range(300):
        length = rng.randint(0, 20)
        spans = random_spans(rng, length)
        assert metrics.get_entities(encode(spans, length, scheme), scheme) == spans


@pytest.mark.parametrize("kind", ["IOB1", "IOB2", "free"])
def test_conll_evaluate_matches_seqeval(kind):
    scheme = "IOB2" if kind == "free" else kind
    for seed in range(150):
        gold, guessed = random_corpus(seed, kind)
        found = metrics.conll_evaluate(gold, guessed, scheme=scheme)
        case = f"seed {seed}: gold={gold[:2]} guessed={guessed[:2]}"
        assert found["precision"] == pytest.approx(seqeval.precision_score(gold, guessed, zero_division=0)), case
        assert found["recall"] == pytest.approx(seqeval.recall_score(gold, guessed, zero_division=0)), case
        assert found["f1"] == pytest.approx(seqeval.f1_score(gold, guessed, zero_division=0)), case
        assert found["accuracy"] == pytest.approx(seqeval.accuracy_score(gold, guessed)), case
        report = quietly(seqeval.classification_report, gold, guessed, output_dict=True, zero_division=0)
        per_type = {name: row for name, row in report.items() if not name.endswith(" avg")}
        assert set(found["per_type"]) == set(per_type), case
        for name, row in per_type.items():
            ours = found["per_type"][name]
            assert (ours["precision"], ours["recall"], ours["f1"], ours["support"]) == (
                pytest.approx(row["precision"]), pytest.approx(row["recall"]), pytest.approx(row["f1-score"]),
                row["support"]), f"{case} type {name}"


def _conlleval_split(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else tuple(tag.split("-", 1))


def _conlleval_ends(previous, current) -> bool:
    (previous_tag, previous_type), (tag, kind) = previous, current
    return (previous_tag in ("B", "I") and tag in ("B", "O")) or (previous_tag != "O" and previous_type != kind)


def _conlleval_starts(previous, current) -> bool:
    (previous_tag, previous_type), (tag, kind) = previous, current
    return tag == "B" or (previous_tag == "O" and tag == "I") or (tag != "O" and previous_type != kind)


def conlleval_counts(gold_sentences, guessed_sentences):
    """conlleval.pl's own bookkeeping, token by token, with no span sets: a sentence break reads as an O token;
    a chunk is correct when gold and guess open it on one token with one type and both close it on one token."""
    found_gold, found_guessed, correct = collections.Counter(), collections.Counter(), collections.Counter()
    tokens = correct_tags = 0
    stream = []
    for gold, guessed in zip(gold_sentences, guessed_sentences):
        stream += [(g, p, True) for g, p in zip(gold, guessed)] + [("O", "O", False)]  # False: the sentence break
    in_correct, last_gold, last_guessed = False, ("O", ""), ("O", "")
    for gold_tag, guessed_tag, is_token in stream:
        gold, guessed = _conlleval_split(gold_tag), _conlleval_split(guessed_tag)
        gold_ended, guessed_ended = _conlleval_ends(last_gold, gold), _conlleval_ends(last_guessed, guessed)
        if in_correct:
            if gold_ended and guessed_ended and last_gold[1] == last_guessed[1]:
                in_correct = False
                correct[last_gold[1]] += 1
            elif gold_ended != guessed_ended or gold[1] != guessed[1]:
                in_correct = False
        gold_started, guessed_started = _conlleval_starts(last_gold, gold), _conlleval_starts(last_guessed, guessed)
        in_correct = in_correct or (gold_started and guessed_started and gold[1] == guessed[1])
        found_gold[gold[1]] += gold_started
        found_guessed[guessed[1]] += guessed_started
        if is_token:
            tokens += 1
            correct_tags += gold_tag == guessed_tag
        last_gold, last_guessed = gold, guessed
    return found_gold, found_guessed, correct, tokens, correct_tags


@pytest.mark.parametrize("kind", ["IOB1", "IOB2", "free"])
def test_conll_evaluate_matches_conlleval_bookkeeping(kind):
    for seed in range(150):
        gold, guessed = random_corpus(1000 + seed, kind)
        found_gold, found_guessed, correct, tokens, correct_tags = conlleval_counts(gold, guessed)
        found = metrics.conll_evaluate(gold, guessed, scheme="IOB2" if kind == "free" else kind)
        total_guessed, total_gold, total_correct = (sum(c.values()) for c in (found_guessed, found_gold, correct))
        assert found["precision"] == pytest.approx(total_correct / total_guessed if total_guessed else 0.0)
        assert found["recall"] == pytest.approx(total_correct / total_gold if total_gold else 0.0)
        assert found["accuracy"] == pytest.approx(correct_tags / tokens)
        types = {t for t, n in found_gold.items() if n} | {t for t, n in found_guessed.items() if n}
        assert set(found["per_type"]) == types
        for name in types:
            row = found["per_type"][name]
            assert row["support"] == found_gold[name]
            assert row["precision"] == pytest.approx(correct[name] / found_guessed[name] if found_guessed[name] else 0)


def test_spans_do_not_cross_sentences():
    gold = [["O", "B-PER"], ["I-PER", "O"]]
    found = metrics.conll_evaluate(gold, [["O", "B-PER"], ["O", "O"]])
    assert found["per_type"]["PER"]["support"] == 2          # the I-PER opens a second chunk
    assert (found["precision"], found["recall"]) == (1.0, 0.5)
    assert found["f1"] == pytest.approx(seqeval.f1_score(gold, [["O", "B-PER"], ["O", "O"]]))


def test_conll_evaluate_on_o_only_and_exact_predictions():
    only_o = [["O", "O"], ["O"]]
    assert metrics.conll_evaluate(only_o, only_o) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0,
                                                      "per_type": {}}
    gold = [["B-PER", "I-PER", "O", "I-LOC"], ["B-ORG"]]
    perfect = metrics.conll_evaluate(gold, gold, scheme="IOB1")
    assert (perfect["precision"], perfect["recall"], perfect["f1"], perfect["accuracy"]) == (1.0, 1.0, 1.0, 1.0)
    assert perfect["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}


def test_conll_evaluate_refuses_misaligned_input():
    with pytest.raises(ValueError, match="gold sentences"):
        metrics.conll_evaluate([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="sentence 1"):
        metrics.conll_evaluate([["O"], ["O", "B-PER"]], [["O"], ["O"]])
