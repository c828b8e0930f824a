"""SQuAD v1.1 / v2.0: reading the JSON, sliding-window features, and answer post-processing.

Everything here is a pure function of its inputs (no torch, no model): the model only supplies one
start and one end logit per input position. Answer text is always cut from the original context by
character offsets, never rebuilt from word pieces, so casing, accents and spacing of the prediction
match what the official evaluation compares against.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from finetune.errors import DataError

_EXPECTED_LAYOUT = ('SQuAD JSON: {"version": ..., "data": [{"title": ..., "paragraphs": [{"context": ..., '
                    '"qas": [{"id": ..., "question": ..., "answers": [{"text": ..., "answer_start": ...}]}]}]}]}')


@dataclass(frozen=True)
class SquadExample:
    """One question about one paragraph.

    Attributes:
        qid: The question id the official evaluation keys predictions by.
        title: The article title.
        context: The paragraph text, exactly as in the file (answer offsets index into it).
        question: The question text.
        answers: ``(text, answer_start)`` pairs; empty for unanswerable (v2) or unlabelled questions.
        is_impossible: SQuAD v2 only: the paragraph does not answer the question.
    """

    qid: str
    title: str
    context: str
    question: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False


@dataclass(frozen=True)
class Feature:
    """One model input: ``[CLS] question [SEP] context window [SEP]`` (unpadded).

    Attributes:
        example_index: Index of the example in the list given to ``make_features``.
        window_start: Index (among the context's tokens) of the window's first context token.
        input_ids: Token ids, at most ``max_seq_length`` of them.
        token_type_ids: 0 for ``[CLS]``, the question and its ``[SEP]``; 1 for the window and its ``[SEP]``.
        offsets: Per position, the ``(start, end)`` character span in the context of a window token;
            None for special and question tokens (which can never be part of an answer).
        token_is_max_context: Per position, whether this window gives that context token more
            surrounding context than any other window (answers may only start at such tokens, so each
            token is judged in one window only).
        start_position, end_position: Training targets: the answer's first and last token positions
            when the whole answer lies in the window; 0 (``[CLS]``) otherwise and outside training.
    """

    example_index: int
    window_start: int
    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int] | None, ...]
    token_is_max_context: tuple[bool, ...]
    start_position: int = 0
    end_position: int = 0


# ---------------------------------------------------------------------------------------------- reading


def load_squad_json(path: str, version_2: bool = False) -> tuple[list[SquadExample], list]:
    """Reads a SQuAD file into examples, and returns its raw ``data`` list for the official evaluation.

    Args:
        path: A SQuAD v1.1 or v2.0 JSON file.
        version_2: Read ``is_impossible`` flags (SQuAD v2.0). Without it a file that has unanswerable
            questions is refused, since a v1.1 model would be trained and scored wrongly on it.

    Raises:
        DataError: The file is missing, not JSON, or not laid out as SQuAD.
    """
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file; expected a {_EXPECTED_LAYOUT}")
    try:
        with open(path, encoding="utf-8") as handle:
            root = json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:  # Recursion: thousands of nested [
        raise DataError(f"{path}: not valid UTF-8 JSON ({error}); expected a {_EXPECTED_LAYOUT}") from None
    if not isinstance(root, dict) or not isinstance(root.get("data"), list):
        found = f"keys {sorted(root)[:5]}" if isinstance(root, dict) else f"a JSON {type(root).__name__}"
        raise DataError(f'{path}: found {found}, not an object with a "data" list; expected a {_EXPECTED_LAYOUT}')
    examples = []
    for article_index, article in enumerate(root["data"]):
        where = f"data[{article_index}]"
        paragraphs = _field(article, "paragraphs", list, path, where)
        title = article.get("title", "")
        for paragraph_index, paragraph in enumerate(paragraphs):
            where = f"data[{article_index}].paragraphs[{paragraph_index}]"
            context = _field(paragraph, "context", str, path, where)
            for qa_index, qa in enumerate(_field(paragraph, "qas", list, path, where)):
                examples.append(_read_question(qa, title, context, version_2, path, f"{where}.qas[{qa_index}]"))
    return examples, root["data"]


def read_squad(path: str, version_2: bool = False) -> list[SquadExample]:
    """The examples of a SQuAD file (see ``load_squad_json``)."""
    return load_squad_json(path, version_2)[0]


def _read_question(qa, title: str, context: str, version_2: bool, path: str, where: str) -> SquadExample:
    qid = _field(qa, "id", str, path, where)
    question = _field(qa, "question", str, path, where)
    is_impossible = bool(qa.get("is_impossible", False))
    if is_impossible and not version_2:
        raise DataError(f"{path}: {where} (id {qid}) is marked is_impossible, which only SQuAD v2.0 has; "
                        f"read this file with version_2=True")
    # Without "answers" a question is unlabelled (a test set); with it, it must be a list of answers.
    listed = _field(qa, "answers", list, path, f"{where} (id {qid})") if "answers" in qa else []
    answers = []
    for answer_index, answer in enumerate(listed):
        at = f"{where}.answers[{answer_index}] (question id {qid})"
        text = _field(answer, "text", str, path, at)
        start = _field(answer, "answer_start", int, path, at)
        if not 0 <= start <= len(context):
            raise DataError(f"{path}: {at} starts at character {start}, outside its {len(context)}-character "
                            "context")
        answers.append((text, start))
    return SquadExample(qid, title, context, question, tuple(answers), is_impossible)


def _field(record, name: str, kind: type, path: str, where: str):
    """``record[name]``, checked to be a ``kind``; a DataError that says where otherwise."""
    if not isinstance(record, dict) or not isinstance(record.get(name), kind) or (
            kind is int and isinstance(record.get(name), bool)):
        found = "not an object" if not isinstance(record, dict) else f"{name}={record.get(name)!r:.60}"
        raise DataError(f'{path}: {where} needs "{name}" ({kind.__name__}), found {found}; '
                        f"expected a {_EXPECTED_LAYOUT}")
    if kind is str:  # JSON may escape a lone UTF-16 surrogate ("\\ud800"): a str no tokenizer takes
        try:
            record[name].encode("utf-8")
        except UnicodeEncodeError as error:
            escape = f"\\u{ord(error.object[error.start]):04x}"
            raise DataError(f'{path}: {where} "{name}" holds a lone surrogate escape ({escape} at character '
                            f"{error.start}), which is not text; fix or drop it in the file") from None
    return record[name]


# ---------------------------------------------------------------------------------------------- features


def window_spans(num_tokens: int, max_window: int, stride: int) -> list[tuple[int, int]]:
    """``(start, length)`` of the sliding windows over ``num_tokens`` context tokens.

    Windows start every ``stride`` tokens, hold at most ``max_window`` tokens, and the last one reaches
    the end. An empty context still gets one (empty) window, so every question gets a prediction.
    """
    if max_window < 1 or stride < 1:
        raise ValueError(f"windows need room for a context token and a positive stride; got {max_window} "
                         f"context tokens per window and stride {stride} (raise max_seq_length or lower "
                         f"max_query_length)")
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, max_window)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, stride)


def max_context_windows(spans: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """Per context token, the index of the window where it has the most context on both sides.

    A token's score in a window is min(tokens left, tokens right) + 0.01 * window length (as in the
    original BERT ``run_squad``); the first window wins a tie.
    """
    best_score = np.full(num_tokens, -np.inf)
    best_window = np.zeros(num_tokens, dtype=np.int64)
    for window, (start, length) in enumerate(spans):
        inside = np.arange(length)
        score = np.minimum(inside, length - 1 - inside) + 0.01 * length
        better = score > best_score[start:start + length]
        best_score[start:start + length][better] = score[better]
        best_window[start:start + length][better] = window
    return best_window


def answer_token_span(starts: np.ndarray, ends: np.ndarray, answer_start: int,
                      answer_end: int) -> tuple[int, int] | None:
    """The first and last context token of the character span ``[answer_start, answer_end)``.

    First token: the first whose span ends after ``answer_start``; last token: the last whose span
    starts before ``answer_end``. None when no token overlaps (an answer of only whitespace).
    Token spans are in text order, so both are binary searches.
    """
    first = int(np.searchsorted(ends, answer_start, side="right"))
    last = int(np.searchsorted(starts, answer_end, side="left")) - 1
    return (first, last) if first <= last else None


def make_features(examples: Sequence[SquadExample], tokenizer, max_seq_length: int = 384, doc_stride: int = 128,
                  max_query_length: int = 64, training: bool = False) -> list[Feature]:
    """Cuts every example into ``[CLS] question [SEP] window [SEP]`` features, in example order.

    Each context is tokenized once (many questions share one), with character offsets for mapping
    answers both ways. Training features locate the first answer; a window that does not contain
    it whole points at ``[CLS]`` (position 0), as BERT does, and is kept.

    Args:
        examples: From ``read_squad``.
        tokenizer: From ``common.tokenizer.load_tokenizer``.
        max_seq_length: Most tokens per feature, special tokens included.
        doc_stride: Context tokens between the starts of consecutive windows.
        max_query_length: Questions are cut to this many tokens.
        training: Fill ``start_position``/``end_position``.
    """
    context_tokens = {}  # context text -> (ids, span starts, span ends, spans as tuples)
    questions = tokenizer.encode_batch([example.question for example in examples])
    features = []
    for example_index, (example, question_ids) in enumerate(zip(examples, questions)):
        if example.context not in context_tokens:
            ids, spans = tokenizer.encode_with_offsets(example.context)
            spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
            context_tokens[example.context] = (list(ids), spans[:, 0], spans[:, 1], [tuple(s) for s in spans.tolist()])
        ids, starts, ends, offsets = context_tokens[example.context]
        question_ids = list(question_ids[:max_query_length])
        windows = window_spans(len(ids), max_seq_length - len(question_ids) - 3, doc_stride)
        owner = max_context_windows(windows, len(ids))
        answer = None
        if training and example.answers and not example.is_impossible:
            text, answer_start = example.answers[0]
            answer = answer_token_span(starts, ends, answer_start, answer_start + len(text))
        prefix = [tokenizer.cls_id, *question_ids, tokenizer.sep_id]
        for window, (start, length) in enumerate(windows):
            stop = start + length
            start_position = end_position = 0
            if answer is not None and start <= answer[0] and answer[1] < stop:
                start_position = answer[0] - start + len(prefix)
                end_position = answer[1] - start + len(prefix)
            features.append(Feature(
                example_index=example_index,
                window_start=start,
                input_ids=(*prefix, *ids[start:stop], tokenizer.sep_id),
                token_type_ids=(0,) * len(prefix) + (1,) * (length + 1),
                offsets=(None,) * len(prefix) + tuple(offsets[start:stop]) + (None,),
                token_is_max_context=(False,) * len(prefix) + tuple((owner[start:stop] == window).tolist()) + (False,),
                start_position=start_position,
                end_position=end_position,
            ))
    return features


def stack_features(features: Sequence[Feature], max_seq_length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Pads features into ``[num_features, max_seq_length]`` int64 arrays for the model.

    Returns ``input_ids``, ``token_type_ids``, ``attention_mask``, ``start_positions``, ``end_positions``.
    """
    count = len(features)
    input_ids = np.full((count, max_seq_length), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((count, max_seq_length), dtype=np.int64)
    attention_mask = np.zeros((count, max_seq_length), dtype=np.int64)
    for row, feature in enumerate(features):
        length = len(feature.input_ids)
        input_ids[row, :length] = feature.input_ids
        token_type_ids[row, :length] = feature.token_type_ids
        attention_mask[row, :length] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
            "start_positions": np.array([f.start_position for f in features], dtype=np.int64),
            "end_positions": np.array([f.end_position for f in features], dtype=np.int64)}


# ---------------------------------------------------------------------------------------------- predictions


def postprocess(examples: Sequence[SquadExample], features: Sequence[Feature], start_logits, end_logits,
                n_best_size: int = 20, max_answer_length: int = 30, version_2: bool = False,
                null_score_diff_threshold: float = 0.0) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Turns per-position logits into answer text per question.

    For each example, over all its features: candidate starts are the ``n_best_size`` best context
    positions where the window has the token's max context, candidate ends the best context positions;
    a pair is an answer if end >= start and it spans at most ``max_answer_length`` tokens, scored by
    start + end logit. Non-answer positions are masked before taking the top ones, so a confident
    [CLS] or question token cannot crowd every valid span out of the shortlist.
    For SQuAD v2 the null score is the smallest [CLS] start + end logit over the example's features;
    the prediction is "" when null score - best answer score > ``null_score_diff_threshold``.

    Args:
        examples, features: As given to and returned by ``make_features``.
        start_logits, end_logits: One row per feature, at least as long as its ``input_ids``
            (a padded 2-D array or a list of 1-D arrays).

    Returns:
        ``predictions`` {qid: answer text} in the official format, and ``nbest`` {qid: up to
        ``n_best_size`` dicts with "text", "probability" (softmax over the listed scores), "start_logit",
        "end_logit"}, best first; for v2 the null answer "" is listed too.
    """
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise ValueError(f"need one row of start and end logits per feature: {len(features)} features, "
                         f"{len(start_logits)} start rows, {len(end_logits)} end rows")
    by_example: list[list[int]] = [[] for _ in examples]
    for feature_index, feature in enumerate(features):
        by_example[feature.example_index].append(feature_index)
    predictions, nbest = {}, {}
    for example, feature_indices in zip(examples, by_example):
        candidates = []  # (score, start logit, end logit, answer text)
        null_score, null_logits = np.inf, (0.0, 0.0)
        for feature_index in feature_indices:
            feature = features[feature_index]
            length = len(feature.input_ids)
            start_row = np.asarray(start_logits[feature_index], dtype=np.float64)[:length]
            end_row = np.asarray(end_logits[feature_index], dtype=np.float64)[:length]
            if start_row[0] + end_row[0] < null_score:
                null_score, null_logits = start_row[0] + end_row[0], (start_row[0], end_row[0])
            candidates += _feature_candidates(example.context, feature, start_row, end_row,
                                              n_best_size, max_answer_length)
        best = _best_distinct(candidates, n_best_size)
        if version_2:
            best = _best_distinct(best + [(null_score, *null_logits, "")], n_best_size)
        best_answer = next((c for c in best if c[3] != ""), None)
        if version_2 and (best_answer is None or null_score - best_answer[0] > null_score_diff_threshold):
            predictions[example.qid] = ""
        else:
            predictions[example.qid] = best_answer[3] if best_answer is not None else ""
        nbest[example.qid] = _with_probabilities(best)
    return predictions, nbest


def _feature_candidates(context: str, feature: Feature, start_row: np.ndarray, end_row: np.ndarray,
                        n_best_size: int, max_answer_length: int) -> list[tuple[float, float, float, str]]:
    """The valid spans among the top start and end positions of one feature."""
    in_context = np.array([span is not None for span in feature.offsets], dtype=bool)
    can_start = in_context & np.asarray(feature.token_is_max_context, dtype=bool)
    starts = _top_positions(np.where(can_start, start_row, -np.inf), n_best_size)
    ends = _top_positions(np.where(in_context, end_row, -np.inf), n_best_size)
    width = ends[None, :] - starts[:, None]
    valid = (width >= 0) & (width < max_answer_length)
    candidates = []
    for row, column in zip(*np.nonzero(valid)):
        start, end = int(starts[row]), int(ends[column])
        text = context[feature.offsets[start][0]:feature.offsets[end][1]]
        candidates.append((start_row[start] + end_row[end], start_row[start], end_row[end], text))
    return candidates


def _top_positions(scores: np.ndarray, count: int) -> np.ndarray:
    """Positions of the ``count`` highest finite scores, best first."""
    order = np.argsort(-scores, kind="stable")[:count]
    return order[np.isfinite(scores[order])]


def _best_distinct(candidates: list, count: int) -> list:
    """The ``count`` best candidates by score, keeping only the best of each distinct answer text
    (overlapping windows often propose the same span)."""
    seen, best = set(), []
    for candidate in sorted(candidates, key=lambda c: -c[0]):
        if candidate[3] not in seen:
            seen.add(candidate[3])
            best.append(candidate)
            if len(best) == count:
                break
    return best


def _with_probabilities(best: list) -> list[dict]:
    if not best:
        return []
    scores = np.array([c[0] for c in best])
    probabilities = np.exp(scores - scores.max())
    probabilities /= probabilities.sum()
    return [{"text": text, "probability": float(p), "start_logit": float(s), "end_logit": float(e)}
            for (_, s, e, text), p in zip(best, probabilities)]


def write_predictions(predictions: dict[str, str], path: str) -> None:
    """Writes ``{qid: answer text}`` as the official evaluation script reads it (``predictions.json``).

    ASCII with JSON escapes: the official script opens the file in the locale's encoding, which need not be
    UTF-8, and every encoding Python opens text files in reads ASCII alike.
    """
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="ascii") as handle:
        json.dump(predictions, handle, ensure_ascii=True, indent=2)
        handle.write("\n")
