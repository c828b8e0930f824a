"""A dataset's ``manifest.json``, typed: what every reader of a dataset relies on, checked when it is read.

The preprocessing run writes the manifest as JSON (with statistics and provenance besides); readers take a
``Manifest`` instead of indexing a dict by string keys, so a missing or mistyped field is refused here, naming
the file, rather than surfacing later as a KeyError. ``Manifest.document`` keeps the whole JSON for reports.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import DatasetFormatError
from common.objectives import ObjectiveEntry
from common.schema import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, READABLE_FORMAT_VERSIONS


@dataclass(frozen=True)
class ShardEntry:
    name: str                 # relative to the dataset directory (checked by ``inside``)
    rows: int
    bytes: int | None = None
    sha256: str | None = None
    tokens: int | None = None


@dataclass(frozen=True)
class TokenizerEntry:
    dir: str                  # the copy of the tokenizer inside the dataset directory
    kind: str
    vocab_size: int
    lowercase: bool
    special_ids: dict[str, int]
    vocab_sha256: str


@dataclass(frozen=True)
class LanguageEntry:
    """One language of a multilingual dataset (``Manifest.languages``): its corpus, its share p of the corpus (of
    tokens or sentences, as the run's ``multilingual.basis`` says), its smoothed share q = p^α / Σ p^α, the rate
    q / p its documents were sampled at (per ``dupe_factor``), and the rows that start with its text."""

    documents: int
    sentences: int
    tokens: int
    share: float
    sampled_share: float
    rate: float
    rows: int


@dataclass(frozen=True)
class EvaluationEntry:
    """A dataset's held-out split (``Manifest.evaluation``; absent: none): its documents, set aside by preprocessing
    before any training row was built, and its rows, built by the same recipe and masked once (``masking`` is
    always ``static``), in shards of their own named from the dataset directory (``eval/shard-…``)."""

    rows: int
    tokens: int
    documents: int
    masking: str
    shards: tuple[ShardEntry, ...]


@dataclass(frozen=True)
class ModelRequirements:
    """What a model requires of a dataset (``Manifest.check_fits``)."""

    vocab_size: int
    max_seq_length: int
    special_ids: dict | None = None
    vocab_sha256: str | None = None


@dataclass(frozen=True)
class Manifest:
    path: Path                # the manifest file, named in every message
    rows: int
    max_seq_length: int
    tokenizer: TokenizerEntry
    shards: tuple[ShardEntry, ...]
    objective: ObjectiveEntry
    document: dict[str, Any]  # the whole JSON: statistics, summary, parameters, inputs
    languages: dict[str, LanguageEntry] | None = None  # multilingual datasets only (absent: one language)
    evaluation: EvaluationEntry | None = None  # the held-out split (absent: a dataset without one)

    @property
    def directory(self) -> Path:
        return self.path.parent

    @classmethod
    def read(cls, directory: str | Path) -> Manifest:
        """The manifest of the dataset in ``directory``; ``DatasetFormatError`` naming the file if it is missing,
        unreadable, of another format or version, or lacks a field."""
        path = Path(directory) / MANIFEST_NAME
        if not path.is_file():
            raise DatasetFormatError(f"{directory}: no {MANIFEST_NAME}; the preprocessing run did not finish (or this "
                                     "is not a dataset directory)")
        try:
            document = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:  # Recursion: [[[[...
            raise DatasetFormatError(f"{path}: not readable JSON ({error}); copy it again, or re-run "
                                     "preprocessing") from None
        return cls.parse(document, path)

    @classmethod
    def parse(cls, document: dict, path: str | Path) -> Manifest:
        path = Path(path)
        if not isinstance(document, dict):
            raise DatasetFormatError(f"{path}: a JSON {type(document).__name__}, not the manifest's object; the "
                                     "manifest was altered or written by another tool: re-run preprocessing")
        check_format(document, str(path.parent))
        try:
            tok = document["tokenizer"]
            tokenizer = TokenizerEntry(dir=str(tok["dir"]), kind=str(tok.get("kind", "")),
                                       vocab_size=int(tok["vocab_size"]), lowercase=bool(tok["lowercase"]),
                                       special_ids={str(k): int(v) for k, v in tok["special_ids"].items()},
                                       vocab_sha256=str(tok["vocab_sha256"]))
            return cls(path=path, rows=int(document["rows"]), max_seq_length=int(document["max_seq_length"]),
                       tokenizer=tokenizer, shards=_shards(document["shards"]),
                       objective=ObjectiveEntry.from_document(document), document=document,
                       languages=_languages(document.get("languages")),
                       evaluation=_evaluation(document.get("evaluation")))
        except KeyError as missing:
            raise DatasetFormatError(f"{path}: no {missing.args[0]!r} field; the manifest was altered or written by "
                                     "another tool: re-run preprocessing") from None
        except (TypeError, ValueError, AttributeError, OverflowError) as error:  # Overflow: int(Infinity)
            raise DatasetFormatError(f"{path}: a field has the wrong type ({error}); the manifest was altered: "
                                     "re-run preprocessing") from None

    def evaluation_split(self) -> Manifest | None:
        """The held-out split as a manifest of its own (its rows and shards; the objective's masking ``static``, as
        its masks are stored), which every reader and check of a dataset takes as it is; None without one."""
        if self.evaluation is None:
            return None
        objective = dataclasses.replace(self.objective, masking=self.evaluation.masking)
        return dataclasses.replace(self, rows=self.evaluation.rows, shards=self.evaluation.shards,
                                   objective=objective, evaluation=None)

    def shard_path(self, entry: ShardEntry) -> Path:
        return inside(self.directory, entry.name, "shard name")

    def tokenizer_path(self) -> Path:
        return inside(self.directory, self.tokenizer.dir, "tokenizer.dir")

    def check_totals(self) -> None:
        """The shards' rows add up to the manifest's total (a manifest that lists only some shards is refused)."""
        listed = sum(entry.rows for entry in self.shards)
        if listed != self.rows:
            raise DatasetFormatError(f"{self.path}: its shards hold {listed} rows but it lists {self.rows} in all; the "
                                     "manifest was altered or some shards are missing from it: copy the dataset again, "
                                     "or re-run preprocessing")

    def check_fits(self, model: ModelRequirements) -> None:
        """Refuse a dataset whose tokenizer or sequence length does not match the model."""
        tok, problems = self.tokenizer, []
        if tok.vocab_size > model.vocab_size:
            problems.append(f"its vocabulary has {tok.vocab_size} ids but the model's embedding has {model.vocab_size}")
        if self.max_seq_length > model.max_seq_length:
            problems.append(f"its sequences are up to {self.max_seq_length} tokens but the model's position "
                            f"embeddings stop at {model.max_seq_length}")
        if model.special_ids is not None and tok.special_ids != model.special_ids:
            problems.append(f"special token ids {tok.special_ids} differ from the model's {model.special_ids}")
        if model.vocab_sha256 is not None and tok.vocab_sha256 != model.vocab_sha256:
            problems.append(f"vocabulary hash {tok.vocab_sha256[:12]}… differs from the model's "
                            f"{model.vocab_sha256[:12]}… (made with another tokenizer)")
        if problems:
            raise DatasetFormatError(f"{self.directory} does not match the model: " + "; ".join(problems) +
                                     ". Preprocess with the model's tokenizer, or point data.path at a matching dataset")


def check_format(document: dict, where: str) -> None:
    """Refuse a manifest of another format or version with a message naming the directory."""
    if document.get("format") != FORMAT_NAME:
        raise DatasetFormatError(f"{where}: not a {FORMAT_NAME} dataset (manifest format {document.get('format')!r})")
    if document.get("format_version") not in READABLE_FORMAT_VERSIONS:
        raise DatasetFormatError(
            f"{where}: dataset format version {document.get('format_version')} but this code reads versions "
            f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))} (it writes {FORMAT_VERSION}); re-run preprocessing "
            "with this version of the code")


def inside(directory: Path, name: str, what: str) -> Path:
    """``directory / name``, refusing a ``name`` from the manifest that could point outside ``directory``: by its
    text, or by a symbolic link on the way that resolves outside (a link that stays inside is allowed)."""
    relative = Path(str(name))
    if not str(name) or "\x00" in str(name) or relative.is_absolute() or ".." in relative.parts:
        raise DatasetFormatError(f"{Path(directory) / MANIFEST_NAME}: {what} {name!r} is not a relative path inside "
                                 "the dataset directory; the manifest was altered: re-run preprocessing")
    path = Path(directory) / relative
    # The text is not enough: every later check (is_file, stat, the memory map) follows links, so a link would
    # train on, or verify, a file this dataset's manifest never described.
    try:
        resolved, root = path.resolve(), Path(directory).resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a loop of links
        raise DatasetFormatError(f"{path}: {what} cannot be resolved ({error}); replace the link with the file "
                                 "itself, or re-run preprocessing") from None
    if not resolved.is_relative_to(root):
        raise DatasetFormatError(f"{path}: {what} is a link to {resolved}, outside the dataset directory {root}; "
                                 "copy the file itself into the directory (cp -L), or re-run preprocessing")
    return path


def _languages(value) -> dict[str, LanguageEntry] | None:
    if value is None:
        return None
    return {str(name): LanguageEntry(documents=int(e["documents"]), sentences=int(e["sentences"]),
                                     tokens=int(e["tokens"]), share=float(e["share"]),
                                     sampled_share=float(e["sampled_share"]), rate=float(e["rate"]),
                                     rows=int(e["rows"]))
            for name, e in value.items()}


def _shards(entries) -> tuple[ShardEntry, ...]:
    return tuple(ShardEntry(name=str(e["name"]), rows=int(e["rows"]), bytes=_optional_int(e.get("bytes")),
                            sha256=e.get("sha256"), tokens=_optional_int(e.get("tokens"))) for e in entries)


def _evaluation(value) -> EvaluationEntry | None:
    if value is None:
        return None
    return EvaluationEntry(rows=int(value["rows"]), tokens=int(value["tokens"]), documents=int(value["documents"]),
                           masking=str(value.get("masking", "static")), shards=_shards(value["shards"]))


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


__all__ = ["EvaluationEntry", "LanguageEntry", "Manifest", "ModelRequirements", "ObjectiveEntry", "ShardEntry",
           "TokenizerEntry", "check_format", "inside"]
