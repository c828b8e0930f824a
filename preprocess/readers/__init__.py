"""Every input format's reader, behind one small interface, so that the stages name no format.

An input file travels through a run as ``(key, uri, size)``: ``key`` says which source it belongs to, and so which
reader reads it (``reader_of``): ``"wiki"`` and ``"book"`` for the built-in ``--wikipedia`` and ``--books`` sources,
``"{format}:{name}"`` for a source of the config's ``inputs:`` section (its ``InputSourceConfig``: ``spec_of``). The
built-in sources' documents have ids ``wiki:…`` and ``book:…``, an ``inputs:`` source's ``{name}:…``
(``source_of``). A reader

* lists a source's files (``files``), says whether a file can be cut (``splittable``) and into which pieces
  (``pieces``: byte ranges of a .bz2 dump, row groups of a Parquet file, ...), each with its share of the work;
* reads a file or one of its pieces (``read``) as ``RawDocument`` and ``Rejected`` records whose ids do not depend
  on the pieces (the pieces of a file together give each record exactly once);
* cleans the text of its documents (``clean``, chosen by ``RawDocument.kind``: ``preprocess.text.to_document``);
* says what a stored byte costs: its memory class (``preprocess.executors.part_budget``'s slopes) and its relative
  cleaning work (``preprocess.executors.local``'s balance).

Adding a format is one module here that defines such a reader, one entry in ``FORMATS``, its name in
``common.preprocess_config.INPUT_FORMATS`` (which the config checks; a test holds the two lists equal) and one test
file.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Protocol, Sequence

from common.errors import InputError
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers import books, hf_datasets, jsonl, parquet, plaintext, wikipedia
from preprocess.readers.fields import LANGUAGE_MARK
from preprocess.readers.inputs import source_name
from preprocess.records import RawDocument, Rejected

Piece = tuple  # a reader's own description of a part of a file, e.g. ("bytes", lo, hi); None: the whole file


class Reader(Protocol):
    kind: str  # RawDocument.kind of its documents: which ``clean`` their text gets

    def clean(self, text: str) -> str:
        """A raw document's text as paragraphs separated by "\\n" (pure)."""

    def files(self, paths: Sequence[str]) -> list[str]:
        """The files of a source given as files, directories, globs or URIs."""

    def label(self, uri: str) -> str:
        """The file's name in document ids, dead letters and the manifest (unique within a source)."""

    def splittable(self, uri: str, spec) -> bool:
        """Whether ``pieces`` may cut this file (without opening it)."""

    def pieces(self, uri: str, size: int, count: int, spec, exact: bool = False) -> list[tuple[float, Piece]]:
        """About ``count`` pieces of the file and each one's share of its work; [] when it is read whole.
        ``exact``: the reader may read a little of the file to put the cuts where the work is."""

    def read(self, uri: str, piece: Piece | None, spec, cfg: SourceConfig,
             cache: dict) -> Iterator[RawDocument | Rejected]:
        """The records of the file, or of one of its pieces. ``spec``: the source's ``InputSourceConfig`` (None for
        the built-in sources); ``cache``: kept by the caller across the pieces it reads (e.g. a dump's header)."""

    def memory_class(self, uri: str) -> str:
        """The key of ``part_budget.PEAK_BYTES_PER_INPUT_BYTE`` that this file's stored bytes count as."""

    def cost_per_byte(self, uri: str) -> float:
        """Relative cleaning work per stored byte (a plain-text byte is 1)."""


FORMATS: dict[str, Reader] = {"wikipedia": wikipedia.READER, "books": books.READER, "jsonl": jsonl.READER,
                              "parquet": parquet.READER, "text": plaintext.READER, "datasets": hf_datasets.READER}
BUILTIN_KEYS = {"wiki": "wikipedia", "book": "books"}  # key (and document-id prefix) -> the built-in source's name


def builtin_files(paths: dict[str, Sequence[str]]) -> list[tuple[str, str]]:
    """(key, uri) of every file of the built-in sources, given their paths by source name (``--wikipedia`` and
    ``--books``: {"wikipedia": [...], "books": [...]})."""
    return [(key, uri) for key, name in BUILTIN_KEYS.items() for uri in FORMATS[name].files(paths.get(name, ()))]


def key_of(spec: InputSourceConfig) -> str:
    return f"{spec.format}:{spec.name}"


def input_files(paths: dict[str, Sequence[str]], inputs: Sequence[InputSourceConfig] = ()) -> list[tuple[str, str]]:
    """(key, uri) of every input file: the built-in sources' (``builtin_files``), then each ``inputs:`` source's;
    refuses files that would give two documents one id (file names shared by the built-in sources, or within a
    source)."""
    files = builtin_files(paths)
    names = [source_name(uri) for _, uri in files]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"input files share a name ({', '.join(dup)}): document ids come from file names, "
                         "so rename one of them")
    for spec in inputs:
        reader = FORMATS[spec.format]
        uris = reader.files(spec.paths)
        labels = [reader.label(uri) for uri in uris]
        if len(set(labels)) != len(labels):
            dup = sorted({n for n in labels if labels.count(n) > 1})
            raise InputError(f"inputs {spec.name!r}: files share a name ({', '.join(dup)}): its document ids come "
                             "from file names, so rename one of them or list them as two sources")
        files += [(key_of(spec), uri) for uri in uris]
    return files


def spec_of(key: str, inputs: Sequence[InputSourceConfig]) -> InputSourceConfig | None:
    """The ``inputs:`` source of ``key`` (None for the built-in sources)."""
    if key in BUILTIN_KEYS:
        return None
    name = key.split(":", 1)[1]
    return next(spec for spec in inputs if spec.name == name)


def source_config(spec: InputSourceConfig | None, cfg: SourceConfig) -> SourceConfig:
    """The cleaning limits of a source's documents: ``cfg`` with the source's own ``min_chars`` / ``min_sentences``."""
    if spec is None or (spec.min_chars is None and spec.min_sentences is None):
        return cfg
    return dataclasses.replace(
        cfg, min_document_chars=cfg.min_document_chars if spec.min_chars is None else spec.min_chars,
        min_document_sentences=cfg.min_document_sentences if spec.min_sentences is None else spec.min_sentences)


def limits_by_source(inputs: Sequence[InputSourceConfig], cfg: SourceConfig) -> dict[str, SourceConfig]:
    """{source name: its cleaning limits} of the sources with their own (``source_config``); look documents up by
    ``source_of(doc_id)``, the others take ``cfg``."""
    return {spec.name: source_config(spec, cfg) for spec in inputs
            if spec.min_chars is not None or spec.min_sentences is not None}


def guess_builtin(uri: str) -> str:
    """The built-in source an unlabelled input (``tokenizer train --input``) belongs to: a name with ".xml" is a
    Wikipedia dump, anything else a book."""
    return "wikipedia" if ".xml" in uri else "books"


def reader_of(key: str) -> Reader:
    """The reader of the files whose tuples carry ``key`` ("wiki", "book" or "{format}:{name}")."""
    return FORMATS[BUILTIN_KEYS.get(key) or key.split(":", 1)[0]]


def cleaner(kind: str) -> Callable[[str], str]:
    """The cleaning of a ``RawDocument`` of this kind."""
    for reader in FORMATS.values():
        if reader.kind == kind:
            return reader.clean
    raise ValueError(f"unknown document kind {kind!r}")


def source_of(doc_id: str) -> str:
    """The name of the source a document came from, by its id's first field: ``wiki:…`` -> ``wikipedia``,
    ``book:…`` -> ``books``, ``{name}:…`` and ``{name}@{language}:…`` -> ``name`` (a source of the config's
    ``inputs:``)."""
    prefix = doc_id.split(":", 1)[0].split(LANGUAGE_MARK, 1)[0]
    return BUILTIN_KEYS.get(prefix, prefix)


def id_language(doc_id: str) -> str | None:
    """The language a document's id names, where its source puts one there (a Wikipedia dump's dbname, an
    ``inputs:`` source's ``language_field``: ``web@de:…``); else None."""
    prefix = doc_id.split(":", 1)[0]
    if LANGUAGE_MARK in prefix:
        return prefix.split(LANGUAGE_MARK, 1)[1]
    reader = FORMATS.get(BUILTIN_KEYS.get(prefix, ""))
    language_of = getattr(reader, "id_language", None)
    return language_of(doc_id) if language_of is not None else None


def names_own_language(key: str, inputs: Sequence[InputSourceConfig] = ()) -> bool:
    """Whether the files of ``key`` may name their documents' language themselves (a multilingual run then needs no
    ``multilingual.languages`` pattern for them): dumps, and ``inputs:`` sources with a ``language_field``."""
    if key not in BUILTIN_KEYS:
        return spec_of(key, inputs).language_field is not None
    return hasattr(reader_of(key), "id_language")


__all__ = ["BUILTIN_KEYS", "FORMATS", "Piece", "Reader", "builtin_files", "cleaner", "guess_builtin", "id_language",
           "input_files", "key_of", "limits_by_source", "names_own_language", "reader_of", "source_config",
           "source_of", "spec_of"]
