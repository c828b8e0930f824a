"""GLUE: one table row per task, and a reader that turns a task's TSV split into ``Example``s.

The files are expected exactly as ``download_glue_data.py`` lays them out: ``<data_dir>/<Dir>/<file>``.
Columns are found by header name where the file has a header, because one task's files do not agree on
positions (MNLI train has 12 columns, its dev files 16, yet both name the gold label ``gold_label``);
CoLA has no header, so its columns are given by index.

Reading follows the quirks of the real release:
  * ``csv.QUOTE_NONE``: quotes are part of the text (an RTE premise starts with ``"That film``); with
    default quoting, csv would swallow that quote and glue lines together up to the next one.
  * ``utf-8-sig``: MRPC starts with a byte-order mark that would otherwise become part of the first
    header name. A U+FEFF *inside* text (QNLI has three) is left alone: it is text, and the tokenizer's
    normalizer drops it as a format character.
  * Rows whose column count differs from the header's are skipped and counted (the real QQP train file
    has a few such lines); ``load_split`` reports them and ``read_split`` logs them. Any other surprise,
    such as a label outside the task's label list, is a ``DataError`` naming the file and line.
"""
from __future__ import annotations

import csv
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import DataError

logger = logging.getLogger(__name__)

_BINARY = ("0", "1")
_ENTAILMENT = ("entailment", "not_entailment")
_LAYOUT_HINT = "download_glue_data.py layout"
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # how errors="surrogateescape" reads a byte that is not UTF-8


@dataclass(frozen=True)
class TaskSpec:
    """Where one GLUE task's files are and how to read them.

    Attributes:
        directory: The task's directory under the GLUE root ("CoLA", "SST-2", ...).
        train_file: File name of the training split.
        eval_files: Evaluation name -> file name; "dev" for every task except MNLI, which has two.
        has_header: Whether the first line names the columns.
        text_a: Header name (or, without a header, column index) of the first text.
        text_b: Same for the second text; None for single-sentence tasks.
        label: Same for the label column.
        labels: The label strings in class-index order; None for a regression task (STS-B).
        num_columns: Without a header, how many columns a well-formed row has.
    """

    directory: str
    train_file: str
    eval_files: dict[str, str]
    has_header: bool
    text_a: str | int
    text_b: str | int | None
    label: str | int
    labels: tuple[str, ...] | None
    num_columns: int | None = None

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Width of the model's output: one score for regression, else one logit per class."""
        return 1 if self.labels is None else len(self.labels)

    def file_for(self, split: str) -> str:
        return self.train_file if split == "train" else self.eval_files[split]


def _single_dev(directory, text_a, text_b, label, labels, num_columns=None) -> TaskSpec:
    """A task with train.tsv and dev.tsv; a header unless ``num_columns`` is given."""
    return TaskSpec(directory=directory, train_file="train.tsv", eval_files={"dev": "dev.tsv"},
                    has_header=num_columns is None, text_a=text_a, text_b=text_b, label=label, labels=labels,
                    num_columns=num_columns)


TASKS: dict[str, TaskSpec] = {
    # CoLA rows: source code, label, the author's original mark ("*" or blank), sentence.
    "cola": _single_dev("CoLA", 3, None, 1, _BINARY, num_columns=4),
    "sst2": _single_dev("SST-2", "sentence", None, "label", _BINARY),
    "mrpc": _single_dev("MRPC", "#1 String", "#2 String", "Quality", _BINARY),
    "stsb": _single_dev("STS-B", "sentence1", "sentence2", "score", None),
    "qqp": _single_dev("QQP", "question1", "question2", "is_duplicate", _BINARY),
    "mnli": TaskSpec(directory="MNLI", train_file="train.tsv",
                     eval_files={"mnli_matched": "dev_matched.tsv", "mnli_mismatched": "dev_mismatched.tsv"},
                     has_header=True, text_a="sentence1", text_b="sentence2", label="gold_label",
                     labels=("contradiction", "entailment", "neutral")),
    "qnli": _single_dev("QNLI", "question", "sentence", "label", _ENTAILMENT),
    "rte": _single_dev("RTE", "sentence1", "sentence2", "label", _ENTAILMENT),
    "wnli": _single_dev("WNLI", "sentence1", "sentence2", "label", _BINARY),
}

GLUE_TASKS: list[str] = list(TASKS)


@dataclass(frozen=True)
class Example:
    """One labelled GLUE example.

    Attributes:
        guid: "<split>-<line number in the file>", so a bad prediction can be traced back to its line.
        text_a: The first (or only) text.
        text_b: The second text of a pair task, else None.
        label: Class index into ``TaskSpec.labels``, or the float score for STS-B.
    """

    guid: str
    text_a: str
    text_b: str | None
    label: int | float


@dataclass(frozen=True)
class SplitReport:
    """What ``load_split`` read from one file.

    Attributes:
        path: The file read.
        examples: The well-formed rows, in file order.
        skipped_lines: 1-based line numbers of rows skipped for having the wrong number of columns.
    """

    path: Path
    examples: list[Example]
    skipped_lines: tuple[int, ...]


def task_spec(task: str) -> TaskSpec:
    """Returns the table row of ``task``, or a DataError listing the known task names."""
    if task not in TASKS:
        raise DataError(f"unknown GLUE task {task!r}; known tasks: {', '.join(GLUE_TASKS)}")
    return TASKS[task]


def eval_splits(task: str) -> list[str]:
    """Evaluation split names of ``task``: ["dev"], or ["mnli_matched", "mnli_mismatched"] for MNLI."""
    return list(task_spec(task).eval_files)


def split_path(data_dir: str | Path, task: str, split: str) -> Path:
    """``<data_dir>/<Dir>/<file>`` for a split ("train" or one of ``eval_splits(task)``)."""
    spec = task_spec(task)
    known = ["train", *spec.eval_files]
    if split not in known:
        raise DataError(f"GLUE task {task!r} has no split {split!r}; choose from {', '.join(known)}")
    return Path(data_dir) / spec.directory / spec.file_for(split)


def required_files(data_dir: str | Path, task: str) -> list[Path]:
    """Every file that training and evaluating ``task`` reads, to check for all of them before starting."""
    return [split_path(data_dir, task, split) for split in ["train", *eval_splits(task)]]


def read_split(data_dir: str | Path, task: str, split: str) -> list[Example]:
    """Reads one split of one task; malformed rows are skipped, and their count is logged as a warning.

    Use ``load_split`` to get the skipped line numbers as a value instead.

    Raises:
        DataError: Unknown task or split, missing file, missing header column, or a bad label.
    """
    report = load_split(data_dir, task, split)
    if report.skipped_lines:
        shown = ", ".join(map(str, report.skipped_lines[:10]))
        more = " ..." if len(report.skipped_lines) > 10 else ""
        logger.warning("%s: skipped %d row(s) with the wrong number of columns (lines %s%s)",
                       report.path, len(report.skipped_lines), shown, more)
    return report.examples


def load_split(data_dir: str | Path, task: str, split: str) -> SplitReport:
    """Reads one split of one task into examples plus the line numbers of skipped malformed rows."""
    spec = task_spec(task)
    path = split_path(data_dir, task, split)
    if not path.is_file():
        raise DataError(f"{path} not found: expected the GLUE layout {data_dir}/{spec.directory}/"
                        f"{spec.file_for(split)} ({_LAYOUT_HINT})")
    # newline="" hands line endings to csv, which is what its reader expects. Bytes that are not UTF-8 are read as
    # surrogates (which valid UTF-8 never gives), so that the row holding one is named.
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            return _read_rows(spec, split, rows, path)
        except csv.Error as error:  # e.g. a field over csv's 131,072-character limit
            raise DataError(f"{path}, line {rows.line_num}: {error}; the file is damaged or not a GLUE TSV: use the "
                            f"unmodified GLUE file ({_LAYOUT_HINT})") from None


def _read_rows(spec: TaskSpec, split: str, rows, path: Path) -> SplitReport:
    """``load_split`` of the open ``rows`` (a csv reader)."""
    examples, skipped = [], []
    if spec.has_header:
        header = next(rows, None)
        if header is None:
            raise DataError(f"{path}: the file is empty; expected a header line and rows ({_LAYOUT_HINT})")
        _check_utf8(header, path, rows.line_num)
        columns = _column_indices(spec, header, path)
        width = len(header)
    else:
        columns = (spec.text_a, spec.text_b, spec.label)
        width = spec.num_columns
    text_a, text_b, label = columns
    for row in rows:
        line = rows.line_num
        if not row:  # a blank line (e.g. a trailing one) is not a row
            continue
        _check_utf8(row, path, line)
        if len(row) != width:
            skipped.append(line)
            continue
        examples.append(Example(guid=f"{split}-{line}", text_a=row[text_a],
                                text_b=None if text_b is None else row[text_b],
                                label=_parse_label(spec, row[label], path, line)))
    return SplitReport(path=path, examples=examples, skipped_lines=tuple(skipped))


def _check_utf8(row: list[str], path: Path, line: int) -> None:
    if any(_NOT_UTF8.search(field) for field in row):
        raise DataError(f"{path}, line {line}: not UTF-8 text; re-save the file as UTF-8 ({_LAYOUT_HINT})")


def _column_indices(spec: TaskSpec, header: list[str], path: Path) -> tuple[int, int | None, int]:
    """Positions of the text and label columns, looked up by name in the header."""
    wanted = [spec.text_a, spec.text_b, spec.label]
    missing = [name for name in wanted if name is not None and name not in header]
    if missing:
        raise DataError(f"{path}: header lacks column(s) {', '.join(map(repr, missing))}; found "
                        f"{', '.join(map(repr, header))}. Use the unmodified GLUE file ({_LAYOUT_HINT})")
    text_a, text_b, label = (None if name is None else header.index(name) for name in wanted)
    return text_a, text_b, label


def _parse_label(spec: TaskSpec, value: str, path: Path, line: int) -> int | float:
    if spec.labels is None:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise DataError(f"{path}, line {line}: label {value!r} is not a number; this task is a regression "
                            f"with float scores ({_LAYOUT_HINT})")
        return score
    try:
        return spec.labels.index(value)
    except ValueError:
        raise DataError(f"{path}, line {line}: unknown label {value!r}; expected one of "
                        f"{', '.join(spec.labels)}. Check that the file belongs to this task ({_LAYOUT_HINT})") from None
