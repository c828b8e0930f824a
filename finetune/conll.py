"""CoNLL-2003 NER: reading the column files, IOB1 <-> IOB2 tags, and word <-> sub-token alignment.

Two releases are in use and differ only in their tag scheme:
  * the original ``eng.train/testa/testb`` use IOB1: an entity starts with I-X, and B-X appears only
    where an entity directly follows another of the same type;
  * the widely redistributed ``train/valid/test.txt`` use IOB2: every entity starts with B-X.
The model is always trained on IOB2 tags (``LABELS``), because there "B" means "starts an entity"
everywhere, which is easier to learn than IOB1's rare, context-dependent B. Predictions are converted
back to the input's scheme so the evaluation compares like with like.

The label goes on the first sub-token of each word only (as in the BERT paper); the other sub-tokens
and the special tokens get -100, the index PyTorch's cross-entropy ignores.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TypeVar

from finetune.errors import DataError

LABELS: list[str] = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
IGNORE_INDEX = -100  # torch.nn.CrossEntropyLoss's default ignore_index
_KNOWN_TAGS = frozenset(LABELS)
_DOCUMENT_START = "-DOCSTART-"
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # how errors="surrogateescape" reads a byte that is not UTF-8
_FORMAT = "CoNLL-2003 columns 'word POS chunk NER' separated by spaces, a blank line after each sentence"

T = TypeVar("T")


@dataclass(frozen=True)
class Sentence:
    """One sentence: its words and their NER tags (in the file's scheme), of equal length."""

    words: tuple[str, ...]
    tags: tuple[str, ...]


def read_conll(path: str | Path) -> list[Sentence]:
    """Reads a CoNLL-2003 file: the first column is the word, the last the NER tag.

    ``-DOCSTART-`` lines are document markers, not words, and end any open sentence; blank lines
    separate sentences; a last sentence without a blank line after it is kept.

    Raises:
        DataError: The file is missing, a line has fewer than two columns, or a tag is not one of
            ``LABELS`` (the CoNLL-2003 types PER, ORG, LOC, MISC in IOB1 or IOB2).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} not found: expected a {_FORMAT} (e.g. conll2003/iob2/train.txt or "
                        "conll2003/original_iob1/eng.train); set the CoNLL file paths in the finetune config")
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []

    def close_sentence() -> None:
        if words:
            sentences.append(Sentence(words=tuple(words), tags=tuple(tags)))
            words.clear()
            tags.clear()

    # Bytes that are not UTF-8 are read as surrogates (never produced by valid UTF-8), to name their line.
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        for line_number, line in enumerate(handle, start=1):
            if _NOT_UTF8.search(line):
                raise DataError(f"{path}, line {line_number}: not UTF-8 text; the file must be {_FORMAT}, in UTF-8: "
                                "re-save it as UTF-8")
            columns = line.split()
            if not columns or columns[0] == _DOCUMENT_START:
                close_sentence()
                continue
            if len(columns) < 2:
                raise DataError(f"{path}, line {line_number}: expected a word and its NER tag, found {line.strip()!r}; "
                                f"the file must be {_FORMAT}")
            tag = columns[-1]
            if tag not in _KNOWN_TAGS:
                raise DataError(f"{path}, line {line_number}: NER tag {tag!r} is not one of {', '.join(LABELS)}; "
                                f"the last column must be the CoNLL-2003 NER tag in IOB1 or IOB2")
            words.append(columns[0])
            tags.append(tag)
    close_sentence()
    return sentences


def _entity_type(tag: str) -> str | None:
    return None if tag == "O" else tag[2:]


def detect_scheme(sentences: Sequence[Sentence]) -> str:
    """Returns "IOB1" if some entity starts with I-X, else "IOB2".

    An I-X starts an entity when it opens the sentence or follows O or a tag of another type. IOB2
    never does that, so a single occurrence decides; data without any (for example no entities at
    all) reads the same either way, and "IOB2" is returned.
    """
    for sentence in sentences:
        previous_type = None
        for tag in sentence.tags:
            if tag.startswith("I-") and _entity_type(tag) != previous_type:
                return "IOB1"
            previous_type = _entity_type(tag)
    return "IOB2"


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """Marks the first tag of every entity B-: an I-X not continuing an X entity becomes B-X."""
    converted = []
    previous_type = None
    for tag in tags:
        entity_type = _entity_type(tag)
        if tag.startswith("I-") and entity_type != previous_type:
            tag = "B-" + entity_type
        converted.append(tag)
        previous_type = entity_type
    return converted


def iob2_to_iob1(tags: Sequence[str]) -> list[str]:
    """Keeps B-X only where it directly follows an X tag (two adjacent X entities); other B-X become I-X.

    Ill-formed IOB2 from a model (an I-X after O) stays I-X, which IOB1 also reads as an entity start.
    """
    converted = []
    previous_type = None
    for tag in tags:
        entity_type = _entity_type(tag)
        if tag.startswith("B-") and entity_type != previous_type:
            tag = "I-" + entity_type
        converted.append(tag)
        previous_type = entity_type
    return converted


def encode_sentence(words: Sequence[str], tokenizer, max_seq_length: int) -> dict[str, list[int]]:
    """Encodes a sentence as ``[CLS] sub-tokens of each word [SEP]``, at most ``max_seq_length`` ids.

    Each word is encoded on its own, so every sub-token belongs to exactly one word; a word the
    tokenizer turns into nothing (a control character, say) becomes [UNK] so it still has a position
    to carry its label. Words that do not fit are cut off from the end.

    Args:
        words: The sentence's words.
        tokenizer: Has ``encode(text) -> list[int]`` and ``cls_id``, ``sep_id``, ``unk_id``
            (``common.tokenizer.load_tokenizer``).
        max_seq_length: Longest result, special tokens included (at least 2).

    Returns:
        ``input_ids``, ``token_type_ids`` (all 0: one segment), and ``word_starts``: per word, the
        position of its first sub-token in ``input_ids``, or -1 if the word was truncated away.
    """
    if max_seq_length < 2:
        raise ValueError(f"max_seq_length must leave room for [CLS] and [SEP], got {max_seq_length}")
    room = max_seq_length - 2
    body: list[int] = []
    word_starts: list[int] = []
    for word in words:
        if len(body) >= room:
            word_starts.append(-1)
            continue
        pieces = tokenizer.encode(word) or [tokenizer.unk_id]
        word_starts.append(1 + len(body))  # +1 for [CLS]
        body.extend(pieces[: room - len(body)])
    input_ids = [tokenizer.cls_id, *body, tokenizer.sep_id]
    return {"input_ids": input_ids, "token_type_ids": [0] * len(input_ids), "word_starts": word_starts}


def label_ids(word_labels: Sequence[int], word_starts: Sequence[int], length: int) -> list[int]:
    """Per-position training targets: each word's label at its first sub-token, -100 everywhere else.

    Args:
        word_labels: One label index per word (into ``LABELS``).
        word_starts: From ``encode_sentence``; words at -1 (truncated) get no target.
        length: ``len(input_ids)``.
    """
    if len(word_labels) != len(word_starts):
        raise ValueError(f"{len(word_labels)} labels for {len(word_starts)} words")
    targets = [IGNORE_INDEX] * length
    for label, start in zip(word_labels, word_starts):
        if start >= 0:
            targets[start] = label
    return targets


def words_from_token_predictions(token_predictions: Sequence[T], word_starts: Sequence[int],
                                 outside: T = "O") -> list[T]:
    """One prediction per word, read at its first sub-token; a truncated word gets ``outside``.

    ``token_predictions`` are per position of ``input_ids`` (tag strings, or label indices with
    ``outside=0``), so this inverts ``label_ids`` on the words that were kept.
    """
    return [token_predictions[start] if start >= 0 else outside for start in word_starts]
