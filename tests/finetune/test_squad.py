"""SQuAD reading, sliding-window features and answer post-processing (finetune/squad.py).

The real-data tests run on the official SQuAD v1.1 dev set with the bert-base-uncased vocabulary;
the small synthetic ones use a word-level vocabulary written here, so each word is one token and
the expected positions can be read off the text.
"""
import collections
import json
import re
import string
import time

import numpy as np
import pytest

from common.tokenizer import load_tokenizer
from finetune.errors import DataError
from finetune.squad import (
    Feature,
    SquadExample,
    load_squad_json,
    make_features,
    max_context_windows,
    postprocess,
    read_squad,
    stack_features,
    window_spans,
    write_predictions,
)

# Gold answers whose text starts or ends inside a token ("gold" in "golden", "20,980" after "£")
# cannot be cut exactly from whole tokens. 32 of the 10,570 dev answers are like that with bert-base-uncased.
MAX_UNMAPPABLE_ANSWERS = 40


# --------------------------------------------------------------------------- the official SQuAD metric, in small


def normalize(text: str) -> str:
    """The official normalization: lowercase, no punctuation, no articles, single spaces."""
    text = "".join(char for char in text.lower() if char not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize(prediction).split(), normalize(gold).split()
    common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_scores(examples, predictions) -> tuple[float, float]:
    """Exact match and F1 in percent, each the best over an example's gold answers."""
    exact = [max(normalize(predictions[e.qid]) == normalize(text) for text, _ in e.answers) for e in examples]
    overlap = [max(f1(predictions[e.qid], text) for text, _ in e.answers) for e in examples]
    return 100 * float(np.mean(exact)), 100 * float(np.mean(overlap))


# --------------------------------------------------------------------------- the real dev set


@pytest.fixture(scope="module")
def dev(shared_data, bert_vocab):
    """Dev examples, raw data, and training-mode features (built once: they back several tests)."""
    examples, data = load_squad_json(str(shared_data / "squad" / "dev-v1.1.json"))
    tokenizer = load_tokenizer(str(bert_vocab))
    began = time.perf_counter()
    features = make_features(examples, tokenizer, max_seq_length=384, doc_stride=128, training=True)
    seconds = time.perf_counter() - began
    print(f"\nfeatures for {len(examples)} dev questions: {len(features)} windows in {seconds:.1f} s")
    return examples, data, features, seconds


def answer_windows(features) -> dict[int, Feature]:
    """Per example index, the first window that holds its gold answer."""
    found = {}
    for feature in features:
        if feature.start_position > 0:
            found.setdefault(feature.example_index, feature)
    return found


def test_dev_set_counts(dev):
    examples, data, _, _ = dev
    assert len(examples) == 10_570
    assert len({example.context for example in examples}) == 2_067
    assert len(data) == 48 and len({example.title for example in examples}) == 48
    assert all(len(example.answers) >= 1 and not example.is_impossible for example in examples)


def test_dev_features_are_well_formed(dev):  # (their speed is printed, not asserted: see bench/)
    examples, _, features, _ = dev
    assert [f.example_index for f in features] == sorted(f.example_index for f in features)
    owners = collections.Counter()
    for feature in features:
        length = len(feature.input_ids)
        assert length <= 384
        assert len(feature.token_type_ids) == len(feature.offsets) == len(feature.token_is_max_context) == length
        context_positions = [i for i, span in enumerate(feature.offsets) if span is not None]
        assert feature.token_type_ids[context_positions[0]:] == (1,) * (length - context_positions[0])
        for position in context_positions:
            if feature.token_is_max_context[position]:
                owners[feature.example_index, feature.window_start + position - context_positions[0]] += 1
    # Every context token of every example is "max context" in exactly one of its windows.
    assert set(owners.values()) == {1}


def test_gold_answers_map_to_tokens(dev):
    examples, _, features, _ = dev
    found = answer_windows(features)
    assert sorted(found) == list(range(len(examples))), "every gold answer lies whole in some window"
    mismatches = []
    for example_index, feature in sorted(found.items()):
        example = examples[example_index]
        mapped = example.context[feature.offsets[feature.start_position][0]:feature.offsets[feature.end_position][1]]
        if normalize(mapped) != normalize(example.answers[0][0]):
            mismatches.append((example.qid, example.answers[0][0], mapped))
    print(f"\n{len(mismatches)} of {len(examples)} gold answers do not fall on token boundaries (gold -> mapped):")
    for qid, gold, mapped in mismatches:
        print(f"  {qid}: {gold!r} -> {mapped!r}")
    assert len(mismatches) < MAX_UNMAPPABLE_ANSWERS


def test_oracle_logits_score_near_perfect(dev):
    examples, _, features, _ = dev
    # One oracle window per example: among those holding the whole answer, the one where its first
    # token has max context (postprocess only starts answers there), else the first of them.
    oracle = {}
    for feature_index, feature in enumerate(features):
        if feature.start_position > 0:
            owns_start = feature.token_is_max_context[feature.start_position]
            if feature.example_index not in oracle or (owns_start and not oracle[feature.example_index][1]):
                oracle[feature.example_index] = (feature_index, owns_start)
    start_logits = [np.zeros(len(f.input_ids)) for f in features]
    end_logits = [np.zeros(len(f.input_ids)) for f in features]
    for feature_index, _ in oracle.values():
        start_logits[feature_index][features[feature_index].start_position] = 10.0
        end_logits[feature_index][features[feature_index].end_position] = 10.0
    predictions, nbest = postprocess(examples, features, start_logits, end_logits)
    exact, overlap = squad_scores(examples, predictions)
    print(f"\noracle: EM {exact:.2f} F1 {overlap:.2f}")
    assert exact >= 97 and overlap >= 99
    assert all(len(candidates) <= 20 for candidates in nbest.values())


# --------------------------------------------------------------------------- small synthetic cases

WORDS = ["the", "cat", "sat", "on", "mat", "and", "dog", "ran", "far", "away", "who", "what", "where", "did",
         "le", "cafe", "est", "ouvert", "paris", "in", "1990", "##s", "was", "is", ".", ",", "?"]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    return load_tokenizer(str(path))


def example(context, question="who sat ?", answer=None, qid="q", is_impossible=False) -> SquadExample:
    answers = () if answer is None else ((answer, context.index(answer)),)
    return SquadExample(qid, "t", context, question, answers, is_impossible)


def test_window_spans_overlap_and_reach_the_end():
    assert window_spans(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert window_spans(11, 4, 3) == [(0, 4), (3, 4), (6, 4), (9, 2)]
    assert window_spans(4, 4, 3) == [(0, 4)]
    assert window_spans(0, 4, 3) == [(0, 0)]
    with pytest.raises(ValueError, match="max_seq_length"):
        window_spans(10, 0, 3)


def test_max_context_prefers_the_most_centred_window():
    spans = window_spans(10, 4, 2)  # (0,4) (2,4) (4,4) (6,4)
    best = max_context_windows(spans, 10)
    # Brute force the original definition: min(left, right) + 0.01 * length, first window on ties.
    for token in range(10):
        scores = [min(token - s, s + n - 1 - token) + 0.01 * n if s <= token < s + n else -1 for s, n in spans]
        assert best[token] == int(np.argmax(scores))


def test_long_context_gets_windows_covering_every_token(word_tokenizer):
    context = " ".join(["the cat sat on the mat and the dog ran far away ."] * 4)  # 52 tokens
    features = make_features([example(context, answer="dog ran")], word_tokenizer, max_seq_length=20,
                             doc_stride=7, max_query_length=2, training=True)
    window = 20 - 2 - 3
    assert len(features) > 1
    covered = collections.Counter()
    owners = collections.Counter()
    for feature in features:
        assert len(feature.input_ids) <= 20
        assert feature.input_ids[:4] == (word_tokenizer.cls_id, word_tokenizer.token_to_id("who"),
                                         word_tokenizer.token_to_id("sat"), word_tokenizer.sep_id)
        assert feature.input_ids[-1] == word_tokenizer.sep_id
        context_count = sum(span is not None for span in feature.offsets)
        assert context_count <= window
        for position in range(context_count):
            covered[feature.window_start + position] += 1
            owners[feature.window_start + position] += feature.token_is_max_context[4 + position]
    assert sorted(covered) == list(range(52))
    assert set(owners.values()) == {1}
    # The first "dog ran" (tokens 8-9) lies in the first window; windows without it point at [CLS].
    first = features[0]
    assert (first.start_position, first.end_position) == (4 + 8, 4 + 9)
    assert all(f.start_position == f.end_position == 0 for f in features if f.window_start > 8)
    arrays = stack_features(features, 20, word_tokenizer.pad_id)
    assert arrays["input_ids"].shape == (len(features), 20)
    assert arrays["attention_mask"].sum(axis=1).tolist() == [len(f.input_ids) for f in features]


def test_question_is_cut_to_max_query_length(word_tokenizer):
    features = make_features([example("the cat sat .", question="who did sat on the mat ?")], word_tokenizer,
                             max_query_length=3)
    assert features[0].input_ids[:5] == (word_tokenizer.cls_id, *word_tokenizer.encode("who did sat"),
                                         word_tokenizer.sep_id)


def logits_for(feature, scores: dict[int, tuple[float, float]]):
    """Start and end logit rows for one feature: 0 everywhere but the given {position: (start, end)}."""
    start, end = np.zeros(len(feature.input_ids)), np.zeros(len(feature.input_ids))
    for position, (start_score, end_score) in scores.items():
        start[position], end[position] = start_score, end_score
    return start, end


def test_answers_longer_than_max_answer_length_are_skipped(word_tokenizer):
    examples = [example("the cat sat on the mat and the dog ran far away .")]
    (feature,) = make_features(examples, word_tokenizer)
    offset = 5  # [CLS] who sat ? [SEP]
    # Best start at "cat" (1), best end at "away" (11); a weaker end at "sat" (2).
    start, end = logits_for(feature, {offset + 1: (5.0, 0.0), offset + 11: (0.0, 5.0), offset + 2: (0.0, 2.0)})
    long_answer, _ = postprocess(examples, [feature], [start], [end], max_answer_length=30)
    assert long_answer == {"q": "cat sat on the mat and the dog ran far away"}
    short_answer, nbest = postprocess(examples, [feature], [start], [end], max_answer_length=3)
    assert short_answer == {"q": "cat sat"}
    assert all(len(c["text"].split()) <= 3 for c in nbest["q"])
    assert nbest["q"][0]["probability"] == max(c["probability"] for c in nbest["q"])


def test_version_2_predicts_no_answer_when_the_null_score_wins(word_tokenizer, tmp_path):
    examples = [example("the cat sat on the mat .", qid="a"), example("the dog ran far away .", qid="b",
                                                                    is_impossible=True)]
    features = make_features(examples, word_tokenizer, training=True)
    assert [(f.start_position, f.end_position) for f in features] == [(0, 0), (0, 0)]
    offset = 5
    rows = [logits_for(features[0], {0: (1.0, 1.0), offset + 1: (3.0, 3.0)}),  # answer 6 beats null 2
            logits_for(features[1], {0: (4.0, 4.0), offset + 1: (3.0, 3.0)})]  # null 8 beats answer 6
    starts, ends = [r[0] for r in rows], [r[1] for r in rows]
    predictions, nbest = postprocess(examples, features, starts, ends, version_2=True)
    assert predictions == {"a": "cat", "b": ""}
    assert "" in [c["text"] for c in nbest["b"]]
    lenient, _ = postprocess(examples, features, starts, ends, version_2=True, null_score_diff_threshold=5.0)
    assert lenient == {"a": "cat", "b": "dog"}
    v1, _ = postprocess(examples, features, starts, ends)
    assert v1 == {"a": "cat", "b": "dog"}
    write_predictions(predictions, str(tmp_path / "out" / "predictions.json"))
    assert json.loads((tmp_path / "out" / "predictions.json").read_text(encoding="utf-8")) == predictions


def test_predictions_file_reads_the_same_in_any_locale_encoding(tmp_path):
    predictions = {"q1": "Zürich", "q2": "東京", "q3": "naïve café — “quoted”"}
    path = tmp_path / "predictions.json"
    write_predictions(predictions, str(path))
    raw = path.read_bytes()
    assert raw.isascii()
    for encoding in ("ascii", "latin-1", "cp1252", "utf-8"):  # what open() uses under C, POSIX, Windows, UTF-8 locales
        with open(path, encoding=encoding) as handle:
            assert json.load(handle) == predictions


def test_accented_answers_come_back_as_the_original_text(word_tokenizer):
    context = "Le Café est ouvert in Paris."
    examples = [example(context, question="where is le cafe ?", answer="Café")]
    (feature,) = make_features(examples, word_tokenizer, training=True)
    # "Café" is one token, "cafe" after lowercasing and accent stripping, spanning the original "Café".
    assert feature.input_ids[feature.start_position] == word_tokenizer.token_to_id("cafe")
    assert feature.start_position == feature.end_position
    assert context[slice(*feature.offsets[feature.start_position])] == "Café"
    start, end = logits_for(feature, {feature.start_position: (9.0, 9.0)})
    predictions, _ = postprocess(examples, [feature], [start], [end])
    assert predictions == {"q": "Café"}


def test_answer_inside_a_word_piece_maps_to_the_whole_piece(word_tokenizer):
    context = "the cat was in paris in 1990s ."
    (feature,) = make_features([example(context, answer="1990")], word_tokenizer, training=True)
    span = context[feature.offsets[feature.start_position][0]:feature.offsets[feature.end_position][1]]
    assert span == "1990"  # "1990" + "##s": the answer ends exactly where the first piece does
    inside = SquadExample("q", "t", context, "who", (("990s", context.index("990s")),))
    (feature,) = make_features([inside], word_tokenizer, training=True)
    span = context[feature.offsets[feature.start_position][0]:feature.offsets[feature.end_position][1]]
    assert span == "1990s"  # starts inside the "1990" piece: the whole piece is taken


# --------------------------------------------------------------------------- bad files


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"missing\.json: no such file; expected a SQuAD JSON"):
        read_squad(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid UTF-8 JSON"),
    ('[1, 2]', 'found a JSON list, not an object with a "data" list'),
    ('{"version": "1.1", "rows": []}', "found keys \\['rows', 'version'\\]"),
    ('{"data": [{"title": "x"}]}', r'data\[0\] needs "paragraphs"'),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "1", "question": "q", '
     '"answers": [{"text": "c", "answer_start": "0"}]}]}]}]}', r'qas\[0\]\.answers\[0\] \(question id 1\) needs "answer_start"'),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "1", "question": "q", '
     '"answers": [], "is_impossible": true}]}]}]}', "version_2=True"),
])
def test_non_squad_json_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message) as raised:
        read_squad(str(path))
    assert str(path) in str(raised.value)


@pytest.mark.parametrize("answers, message", [
    (None, r'qas\[1\] \(id q7\) needs "answers" \(list\), found answers=None'),
    ("cat", r'qas\[1\] \(id q7\) needs "answers" \(list\), found answers=\'cat\''),
    (["cat"], r'qas\[1\]\.answers\[0\] \(question id q7\) needs "text" \(str\), found not an object'),
    ([{"answer_start": 2}], r'answers\[0\] \(question id q7\) needs "text" \(str\), found text=None'),
    ([{"text": "cat", "answer_start": "2"}], r'answers\[0\] \(question id q7\) needs "answer_start" \(int\)'),
    ([{"text": "cat", "answer_start": True}], r'answers\[0\] \(question id q7\) needs "answer_start" \(int\)'),
    ([{"text": "cat"}, {"text": "cat", "answer_start": 9}], r"answers\[0\] \(question id q7\) needs"),
])
def test_a_malformed_question_is_one_line_naming_the_file_and_the_question_id(tmp_path, answers, message):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "a cat", "qas": [
        {"id": "q1", "question": "q", "answers": [{"text": "cat", "answer_start": 2}]},
        {"id": "q7", "question": "r", "answers": answers}]}]}]}), encoding="utf-8")
    with pytest.raises(DataError, match=message) as raised:
        read_squad(str(path))
    assert str(raised.value).startswith(f"{path}: data[0].paragraphs[0].qas[1]") and "\n" not in str(raised.value)


def test_a_question_without_answers_is_read_as_unlabelled(tmp_path):
    path = tmp_path / "test.json"
    path.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "a cat", "qas": [
        {"id": "q1", "question": "q"}]}]}]}), encoding="utf-8")
    assert read_squad(str(path)) == [SquadExample("q1", "T", "a cat", "q", ())]


def test_version_2_file_reads_unanswerable_questions(tmp_path):
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "a cat", "qas": [
        {"id": "1", "question": "q", "answers": [{"text": "cat", "answer_start": 2}], "is_impossible": False},
        {"id": "2", "question": "r", "answers": [], "is_impossible": True}]}]}]}), encoding="utf-8")
    examples = read_squad(str(path), version_2=True)
    assert examples == [SquadExample("1", "T", "a cat", "q", (("cat", 2),), False),
                        SquadExample("2", "T", "a cat", "r", (), True)]
