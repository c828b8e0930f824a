"""The preprocessing job's interface: its typed configuration (one YAML per run under configs/preprocess/) and
its command-line arguments. ``preprocess`` runs the job; ``cluster`` renders it for Slurm and Kubernetes from the
same definitions, without importing the stage."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from common import configlib, sizes
from common.objectives import ObjectiveEntry, check_combination


@dataclass(frozen=True)
class SourceConfig:
    """How raw Wikipedia pages and books become documents."""

    min_document_chars: int = 200        # cleaned text shorter than this is skipped ("too_short")
    min_document_sentences: int = 2      # fewer sentences than this is skipped ("too_short")
    max_document_chars: int = 4_000_000  # raw text longer than this is a dead letter ("too_large")
    book_document_max_chars: int = 100_000  # books are cut at chapter headings and at this size
    book_encoding_fallback: str | None = "latin-1"  # non-UTF-8 books: decode with this, or dead-letter when null
    strip_gutenberg_boilerplate: bool = True

    def __post_init__(self):
        if self.min_document_chars < 0 or self.min_document_sentences < 1:
            raise ValueError("min_document_chars must be >= 0 and min_document_sentences >= 1")
        if self.book_document_max_chars < 1000:
            raise ValueError("book_document_max_chars must be at least 1000")
        if self.max_document_chars < self.book_document_max_chars:
            raise ValueError("max_document_chars must be >= book_document_max_chars")


@dataclass(frozen=True)
class InstanceConfig:
    """The instance recipe: BERT's (google-research/bert create_pretraining_data.py) by default, or one of its
    successors' (``common.manifest.ObjectiveEntry`` explains the choices; docs/objectives.md the papers)."""

    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    mask_token_fraction: float = 0.8     # a masked position shows [MASK] with this probability,
    random_token_fraction: float = 0.1   # a random token with this one, else the token itself (BERT: 80/10/10)
    mask_unit: str = "token"             # token | whole_word | span (SpanBERT) | ngram (ALBERT)
    masking: str = "static"              # static: masks in the shards | dynamic: unmasked rows, masked per epoch
    kind: str = "pairs"                  # pairs | full_sentences (packed across documents) | doc_sentences
    sentence_objective: str = "nsp"      # nsp | sop (pairs only) | none (packed kinds)
    dupe_factor: int = 5
    random_next_prob: float = 0.5

    def __post_init__(self):
        ObjectiveEntry(kind=self.kind, sentence_objective=self.sentence_objective, masking=self.masking,
                       mask_unit=self.mask_unit, mask_token_fraction=self.mask_token_fraction,
                       random_token_fraction=self.random_token_fraction)
        check_combination(self.kind, self.sentence_objective)
        if not 8 <= self.max_seq_length <= 65535:
            raise ValueError(f"max_seq_length must be in [8, 65535], got {self.max_seq_length}")
        for name in ("short_seq_prob", "masked_lm_prob", "random_next_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.max_predictions_per_seq < 1 or self.dupe_factor < 1:
            raise ValueError("max_predictions_per_seq and dupe_factor must be >= 1")


@dataclass(frozen=True)
class OutputConfig:
    num_shards: int = 0                  # 0: one shard per target_rows_per_shard rows (at least 1)
    target_rows_per_shard: int = 131072
    provenance: bool = False             # add doc_a / doc_b string columns for audits

    def __post_init__(self):
        if self.num_shards < 0 or self.target_rows_per_shard < 1:
            raise ValueError("num_shards must be >= 0 and target_rows_per_shard >= 1")


@dataclass(frozen=True)
class TokenizerConfig:
    path: str | None = None              # tokenizer dir, SentencePiece .model, or WordPiece vocab.txt
    lowercase: bool = True               # only for a WordPiece vocab.txt (bert-*-uncased: true)


@dataclass(frozen=True)
class MultilingualConfig:
    """Several languages in one dataset (multilingual BERT; XLM's masked-LM data): each document's language, and the
    exponentially smoothed mix of languages in the rows and in the vocabulary's training sample."""

    enabled: bool = False                # false: one language, as before (nothing below is used)
    alpha: float = 0.7                   # q_i ∝ p_i^alpha: 0.7 as mBERT, 0.5 as XLM; 1 keeps the corpus's own mix
    basis: str = "tokens"                # p_i: each language's share of tokens (mBERT) or of sentences (XLM)
    # Input file-name pattern (fnmatch, e.g. "bgwiki-*") -> language, first match wins; a Wikipedia dump that
    # matches none takes its language from its siteinfo's dbname (bgwiki -> bg). Books need a pattern.
    languages: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1] (0.7 as mBERT, 0.5 as XLM), got {self.alpha}")
        if self.basis not in ("tokens", "sentences"):
            raise ValueError(f"basis must be tokens or sentences, got {self.basis!r}")
        for pattern, language in self.languages.items():
            if not isinstance(pattern, str) or not isinstance(language, str) or not language.strip():
                raise ValueError(f"languages maps file-name patterns to language codes, got {pattern!r}: {language!r}")


@dataclass(frozen=True)
class HeldoutSourceConfig:
    """How many documents of one input source (``--wikipedia``, ``--books`` or an ``inputs:`` source) are held out:
    a count (the documents with the smallest seeded keys) or a share (those whose key falls below it); at most one of
    the two."""

    documents: int = 0
    share: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.documents > 0 or self.share > 0.0


@dataclass(frozen=True)
class HeldoutConfig:
    """The held-out (evaluation) split: documents set aside by a seeded stable key of their id, built by the same
    recipe into evaluation shards (masked once, also for ``masking: dynamic``), and kept out of the training rows
    together with every document of the same text (``preprocess.heldout``; docs/preprocessing.md)."""

    wikipedia: HeldoutSourceConfig = field(default_factory=HeldoutSourceConfig)
    books: HeldoutSourceConfig = field(default_factory=HeldoutSourceConfig)
    # The config's ``inputs:`` sources, by name: e.g. {web: {share: 0.001}}.
    inputs: dict[str, HeldoutSourceConfig] = field(default_factory=dict)
    seed: int | None = None              # the selection's seed; null: the run's seed

    def __post_init__(self):
        for name, source in self.by_source().items():
            key = self.key_of(name)
            if source.documents < 0 or source.share < 0.0:
                raise ValueError(f"{key}.documents and {key}.share must be >= 0")
            if source.documents and source.share:
                raise ValueError(f"{key} sets both documents ({source.documents}) and share ({source.share}): "
                                 "choose a count or a share, not both")
            if source.share >= 1.0:
                raise ValueError(f"{key}.share is {source.share}: that holds out every {name} document and leaves "
                                 f"no training documents; set {key}.share below 1 (e.g. 0.01), or "
                                 f"{key}.documents to a count")

    def by_source(self) -> dict[str, HeldoutSourceConfig]:
        """Every source's selection by the source's name (``readers.source_of``): the built-in two, then the
        ``inputs:`` sources named here."""
        return {"wikipedia": self.wikipedia, "books": self.books, **self.inputs}

    def key_of(self, source: str) -> str:
        """The config key of ``source``'s selection: heldout.wikipedia, or heldout.inputs.web."""
        return f"heldout.{source}" if source in HELDOUT_SOURCES else f"heldout.inputs.{source}"

    @property
    def enabled(self) -> bool:
        return any(source.enabled for source in self.by_source().values())


HELDOUT_SOURCES = ("wikipedia", "books")  # the config's names of the input kinds ("wiki", "book" in document ids)


INPUT_FORMATS = ("jsonl", "parquet", "text", "datasets")  # the formats of ``inputs:`` sources (preprocess.readers)
BUILTIN_SOURCES = ("wikipedia", "books", "wiki", "book")  # --wikipedia and --books, and their document-id prefixes
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # a document id's first field: no ":", nor "@" (before a language)


@dataclass(frozen=True)
class InputSourceConfig:
    """One source of documents of the config's ``inputs:`` list, besides ``--wikipedia`` and ``--books``.

    Its documents have ids ``{name}:{id}`` (with ``id_field``) or ``{name}:{file}:{position}`` (a line's byte offset,
    a Parquet file's ``rowgroup/row``, a datasets file's row), ``{name}@{language}:...`` with ``language_field`` (the
    language a multilingual run gives the document: ``preprocess.languages``), are cleaned as plain text (whitespace normalised) and
    filtered by ``min_chars`` / ``min_sentences`` (null: ``sources.min_document_chars`` / ``min_document_sentences``).
    """

    name: str = ""                       # the source's name: the first field of its document ids
    format: str = ""                     # jsonl (.jsonl/.json, plain or .gz/.bz2/.xz/.zst) | parquet | text | datasets
    paths: list[str] = field(default_factory=list)  # files, directories or globs, local or URIs
    text_field: str = "text"             # jsonl, parquet, datasets: the field (column) that holds the text
    id_field: str | None = None          # a field with each record's id (unique within the source)
    title_field: str | None = None       # a field whose value becomes the document's first paragraph
    language_field: str | None = None    # a field with each record's language code (en, pt-BR, zh_Hans, ...)
    document: str = "line"               # text: one document per line, or per file
    min_chars: int | None = None
    min_sentences: int | None = None

    def __post_init__(self):
        if not self.name:
            raise ValueError("name is missing: give the source a name, e.g. name: web (its document ids start with it)")
        if not _SOURCE_NAME.match(self.name):
            raise ValueError(f"name {self.name!r} may hold only letters, digits, '_', '.' and '-' (document ids are "
                             "'name:...'); choose another name")
        if self.name in BUILTIN_SOURCES:
            raise ValueError(f"name {self.name!r} is a built-in source's (--wikipedia and --books are 'wikipedia' and "
                             "'books'); choose another name")
        if self.format not in INPUT_FORMATS:
            raise ValueError(f"format {self.format!r} is not an input format; use one of {', '.join(INPUT_FORMATS)}")
        if not self.paths:
            raise ValueError(f"paths is empty: list the files, directories or globs of source {self.name!r}")
        if self.document not in ("line", "file"):
            raise ValueError(f"document must be line or file, got {self.document!r}")
        if self.document != "line" and self.format != "text":
            raise ValueError(f"document applies to format text only; remove it from source {self.name!r}")
        if not self.text_field:
            raise ValueError("text_field is empty: name the field that holds the text, e.g. text_field: text")
        if self.language_field is not None and not self.language_field:
            raise ValueError("language_field is empty: name the field that holds each record's language, or remove it")
        if self.min_chars is not None and self.min_chars < 0:
            raise ValueError(f"min_chars must be >= 0, got {self.min_chars}")
        if self.min_sentences is not None and self.min_sentences < 1:
            raise ValueError(f"min_sentences must be >= 1, got {self.min_sentences}")


@dataclass(frozen=True)
class MixtureConfig:
    """How much of each source the rows hold (RoBERTa's, MosaicBERT's and ModernBERT's weighted mixtures), by source
    name (``wikipedia``, ``books``, or an ``inputs:`` source's ``name``): ``weights``, each source's share of the
    rows' tokens (normalised to sum 1; every source with documents needs one), or ``repeat``, epochs over a source
    (copies of each document per ``dupe_factor``; 0.5 uses half of it, 3 three times; an unnamed source 1). One of the
    two. Each document's number of copies is ``dupe_factor`` times its source's rate, rounded by a draw keyed by
    (seed, document id) (``preprocess.mixture``), as the multilingual mix does per language."""

    weights: dict[str, float] = field(default_factory=dict)
    repeat: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.weights and self.repeat:
            raise ValueError("mixture sets both weights and repeat: give each source's share of the tokens (weights) "
                             "or its epochs (repeat), not both")
        for key, values in (("weights", self.weights), ("repeat", self.repeat)):
            for name, value in values.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                    raise ValueError(f"mixture.{key}.{name} is {value!r}: it must be a number above 0 (leave a "
                                     "source out of the config to use none of it)")

    @property
    def enabled(self) -> bool:
        return bool(self.weights or self.repeat)


@dataclass(frozen=True)
class DedupConfig:
    """Duplicates removed before any row is built (``preprocess.dedup``)."""

    # Documents whose text (as cleaned, split and tokenized) repeats an earlier one's, across and within sources,
    # are dropped; of each text the first by stable key (its id's hash, then its id) is kept.
    exact: bool = False
    # Near copies too (null: not): documents whose word shingles' MinHash estimate of Jaccard similarity with an
    # earlier one's is at least this (e.g. 0.8), found by LSH (preprocess.neardup, through datasketch).
    near_threshold: float | None = None
    num_perm: int = 128                  # MinHash values per document
    shingle_words: int = 5               # words per shingle

    def __post_init__(self):
        if self.near_threshold is not None and not 0.0 < self.near_threshold <= 1.0:
            raise ValueError(f"dedup.near_threshold must be in (0, 1] (e.g. 0.8), got {self.near_threshold}")
        if not 16 <= self.num_perm <= 1024:
            raise ValueError(f"dedup.num_perm must be in [16, 1024] (128 is usual), got {self.num_perm}")
        if self.shingle_words < 1:
            raise ValueError(f"dedup.shingle_words must be >= 1 (5 is usual), got {self.shingle_words}")

    @property
    def enabled(self) -> bool:
        return self.exact or self.near_threshold is not None


@dataclass(frozen=True)
class PreprocessConfig:
    seed: int = 12345
    parts: int = 1                       # process the corpus in this many parts to bound memory
    max_memory: str | int | None = None  # e.g. 8G: choose parts so that a one-machine run's peak stays under it
    sources: SourceConfig = field(default_factory=SourceConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    instances: InstanceConfig = field(default_factory=InstanceConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    multilingual: MultilingualConfig = field(default_factory=MultilingualConfig)
    # Left out of the resolved config while off, so that datasets and rendered jobs without a split stay as they were.
    heldout: HeldoutConfig = field(default_factory=HeldoutConfig, metadata={"omit_when_default": True})
    # Sources of documents besides --wikipedia and --books (preprocess.readers); left out while empty, likewise.
    inputs: list[InputSourceConfig] = field(default_factory=list, metadata={"omit_when_default": True})
    # Each source's share of the rows (preprocess.mixture); left out while empty, likewise.
    mixture: MixtureConfig = field(default_factory=MixtureConfig, metadata={"omit_when_default": True})
    dedup: DedupConfig = field(default_factory=DedupConfig, metadata={"omit_when_default": True})

    def __post_init__(self):
        if self.parts < 1:
            raise ValueError(f"parts must be >= 1, got {self.parts}")
        names = [source.name for source in self.inputs]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"inputs[{index}].name {name!r} is the name of inputs[{names.index(name)}] too; "
                                 "give each source a name of its own")
        if self.max_memory is not None:
            sizes.parse_size(self.max_memory)
        for name in self.heldout.inputs:
            if name not in names:
                raise ValueError(f"heldout.inputs names {name!r}, which is no source of inputs: "
                                 f"({', '.join(names) or 'none'}); the built-in ones are heldout.wikipedia and "
                                 "heldout.books")
        known = ("wikipedia", "books", *names)
        for key in ("weights", "repeat"):
            for name in getattr(self.mixture, key):
                if name not in known:
                    raise ValueError(f"mixture.{key} names {name!r}, which is no source: use wikipedia, books or a "
                                     f"name of inputs: ({', '.join(known)})")
        if self.mixture.enabled and self.multilingual.enabled:
            raise ValueError("mixture and multilingual.enabled are both set: a multilingual run mixes its languages "
                             "by multilingual.alpha; remove the mixture section, or turn multilingual off")


def load(path, overrides=()) -> PreprocessConfig:
    return configlib.load(PreprocessConfig, path, overrides)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``python -m preprocess run``; unrecognised --options go to Apache Beam."""
    p.add_argument("--config", required=True, help="YAML file, e.g. configs/preprocess/phase1_seq128.yaml")
    p.add_argument("--wikipedia", nargs="*", default=[], metavar="URI", help="pages-articles XML dumps (.xml, .bz2)")
    p.add_argument("--books", nargs="*", default=[], metavar="URI", help="plain-text books: files, dirs or globs")
    p.add_argument("--tokenizer", help="tokenizer dir, SentencePiece .model or WordPiece vocab.txt "
                                       "(default: tokenizer.path in the config)")
    p.add_argument("--output", required=True, metavar="DIR", help="local directory or object-store URI")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set instances.dupe_factor=10 (repeatable)")
    p.add_argument("--parts", type=int, help="process the corpus in N parts to bound memory (same output)")
    p.add_argument("--max-memory", metavar="SIZE", type=_memory_size,
                   help="memory budget of a one-machine run, e.g. 8G: chooses --parts so that the estimated peak "
                        "stays under it, and says what it chose (max_memory in the config)")
    p.add_argument("--part", type=int, metavar="K", help="run only part K (0..N-1) of a --parts N run, e.g. as one task "
                   "of a job array: its documents, then (after every part's) its instances; part 0 also finishes")
    p.add_argument("--step", choices=("documents", "instances", "finish"),
                   help="with --part K, only this step of part K; 'finish' (no --part) writes the shards and "
                        "publishes once every part's instances are done")
    p.add_argument("--wait", type=float, metavar="SECONDS", help="how long a part waits for the other parts at a "
                   "barrier (default: a day with --part alone, 0 with --step: a missing part is an error)")
    p.add_argument("--provenance", action="store_true", help="add doc_a/doc_b columns naming the source documents")
    p.add_argument("--overwrite", action="store_true", help="replace an existing finished dataset")
    p.add_argument("--verbose", action="store_true", help="show Apache Beam's own log messages")


def _memory_size(text: str) -> str:
    try:
        sizes.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
