"""Several languages in one dataset (multilingual BERT, XLM's masked-LM data), as pure functions.

Each document's language is set per input file in the config (``multilingual.languages``) or read from the document
id where its source puts one there (``readers.id_language``: a Wikipedia dump's siteinfo ``dbname``, which the id
carries: ``wiki:bgwiki:558`` is Bulgarian; a record's ``language_field``: ``web@bg:17``).

The mix of languages is exponentially smoothed (one case of ``preprocess.mixture``), as mBERT and XLM sample theirs (Conneau & Lample 2019, §3.1):
with p_i a language's share of the corpus (of tokens, or of sentences as XLM counts), the rows are drawn with
q_i = p_i^α / Σ_j p_j^α. Here that is a number of copies per document, in place of ``dupe_factor``'s fixed
number: a document of language i is used ``dupe_factor · q_i / p_i`` times in expectation, rounded up or down by a
draw keyed by (seed, document id) alone, so low-resource languages are repeated and high-resource ones thinned, the
corpus's total is kept in expectation, and no choice depends on workers, parts or order.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, Sequence

import numpy as np

from common.errors import InputError
from common.preprocess_config import InputSourceConfig, MultilingualConfig
from preprocess import mixture, readers
from preprocess.readers.inputs import source_name


def document_group(doc_id: str) -> str:
    """The part of a document id that names where it came from: ``wiki:<dbname>``, ``book:<file name>``,
    ``{name}@{language}:<file>`` (``wiki:bgwiki:558`` -> ``wiki:bgwiki``). Every document of a group has one
    language."""
    return doc_id.rsplit(":", 1)[0]


def configured_language(source: str, cfg: MultilingualConfig) -> str | None:
    """The language ``multilingual.languages`` gives the input file named ``source`` (first matching pattern)."""
    for pattern, language in cfg.languages.items():
        if fnmatch.fnmatchcase(source, pattern):
            return language.strip()
    return None


def language_for(doc_id: str, source: str, cfg: MultilingualConfig) -> str:
    """A document's language: the config's for its input file, else its id's (a dump's); ``InputError`` if neither
    says."""
    language = configured_language(source, cfg)
    if language is None:
        language = readers.id_language(doc_id)
    if not language:
        raise InputError(f"{source}: no language for this input (a Wikipedia dump without <dbname> in its siteinfo, "
                         f"or a book): set one in the config, e.g. multilingual.languages: {{'{source}': en}}")
    return language


def check_inputs(files: Iterable[tuple], cfg: MultilingualConfig, inputs: Sequence[InputSourceConfig] = ()) -> None:
    """Before a run: every input that does not name its language itself (a book, ...) needs one from the config
    (dumps may name their own, as may ``inputs:`` sources with a ``language_field``)."""
    for key, uri, *_ in files:
        if not readers.names_own_language(key, inputs) and configured_language(source_name(uri), cfg) is None:
            raise InputError(f"{uri}: a {readers.reader_of(key).kind} input of a multilingual run needs a language: "
                             f"add its file name to multilingual.languages in the config, e.g. {{'{source_name(uri)}': en}}")


def language_counts(docs: list[tuple], cfg: MultilingualConfig, token_bytes: int) -> dict:
    """Per-language counts of a document-store bucket's rows (doc_hash, doc_id, source, token bytes, sentence-length
    bytes): ``{"languages": {language: {documents, sentences, tokens}}, "language_groups": {group: {language:
    documents}}}`` (``preprocess.docstore.add_counts`` adds them up over buckets and parts)."""
    languages: dict[str, dict] = {}
    groups: dict[str, dict] = {}
    for _, doc_id, source, tokens, lengths in docs:
        language = language_for(doc_id, source, cfg)
        entry = languages.setdefault(language, {"documents": 0, "sentences": 0, "tokens": 0})
        entry["documents"] += 1
        entry["sentences"] += len(lengths) // 4
        entry["tokens"] += len(tokens) // token_bytes
        group = groups.setdefault(document_group(doc_id), {})
        group[language] = group.get(language, 0) + 1
    return {"languages": languages, "language_groups": groups}


def smoothed_shares(sizes: dict[str, float], alpha: float) -> dict[str, float]:
    """q_i = p_i^alpha / sum_j p_j^alpha for p_i = sizes[i] / sum(sizes) (languages of size 0 get 0)."""
    total = sum(sizes.values())
    if total <= 0:
        return {language: 0.0 for language in sizes}
    powered = {language: (size / total) ** alpha if size > 0 else 0.0 for language, size in sizes.items()}
    norm = sum(powered.values())
    return {language: value / norm for language, value in powered.items()}


def language_mix(counts: dict[str, dict], cfg: MultilingualConfig) -> dict[str, dict]:
    """Each language's counts with its share p (of ``cfg.basis``), its smoothed share q and its sampling rate
    q / p (the expected copies of each of its documents, per ``dupe_factor``), in language order."""
    sizes = {language: counts[language][cfg.basis] for language in counts}
    return mixture.mix_entries(counts, smoothed_shares(sizes, cfg.alpha), cfg.basis, "sampled_share")


def group_languages(groups: dict[str, dict]) -> dict[str, str]:
    """{document group: its language} from ``language_counts``' summed groups; ``InputError`` for a group (one
    dump's database, or one book) given two languages."""
    out = {}
    for group, languages in sorted(groups.items()):
        if len(languages) > 1:
            raise InputError(f"{group}: the files of one dump (or one book) got different languages "
                             f"({', '.join(sorted(languages))}) from multilingual.languages: give them one language")
        out[group] = next(iter(languages))
    return out


def document_copies(seed: int, doc_ids: list[str], languages: dict[str, str], mix: dict[str, dict],
                    dupe_factor: int) -> np.ndarray:
    """How many times each document is used: ``dupe_factor · rate`` of its language (``mixture.document_copies``).

    Args:
        languages: {document group: language} (``group_languages``).
        mix: ``language_mix``' entries, each with its ``rate``.
    """
    rates = {language: entry["rate"] for language, entry in mix.items()}
    return mixture.document_copies(seed, doc_ids, lambda doc_id: languages[document_group(doc_id)], rates,
                                   dupe_factor)


def sample_quotas(sizes: dict[str, float], alpha: float, total: int) -> dict[str, int]:
    """How many of ``total`` sampled items each language gets (its smoothed share, rounded; at least one for a
    language with any text)."""
    shares = smoothed_shares(sizes, alpha)
    return {language: max(1 if sizes[language] else 0, round(share * total)) for language, share in shares.items()}


__all__ = ["check_inputs", "document_copies", "document_group", "group_languages", "language_counts",
           "language_for", "language_mix", "sample_quotas", "smoothed_shares"]
