"""How much of each group of documents the rows hold, as pure functions: one mechanism for a weighted mixture of
sources (``mixture:`` in the config; RoBERTa's, MosaicBERT's and ModernBERT's mixes of books, Wikipedia and web text)
and for the multilingual job's smoothed mix of languages (``preprocess.languages``).

Each group (a source, or a language) has a share p of the corpus (of its tokens, or sentences) and a requested share
q of the rows: a weight, a smoothed share, or p times an epoch count. Its *rate* q / p is the expected number of
copies of each of its documents per ``dupe_factor``; a document is used ``dupe_factor · rate`` times, rounded down
or up with the probability of the fraction by a draw keyed by (seed, document id) alone, so no choice depends on
workers, parts or order, and the corpus's total is kept in expectation wherever the requested shares sum to 1.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from common.errors import InputError
from common.hashing import stable_hash64
from common.preprocess_config import MixtureConfig
from preprocess.readers import BUILTIN_KEYS

# The draw's key: the name the first mix (the languages') gave it, kept so that multilingual shards stay byte-identical.
COPIES_KEY = "language-copies"


def mix_entries(counts: dict[str, dict], requested: dict[str, float], basis: str,
                requested_name: str = "requested_share") -> dict[str, dict]:
    """Each group's counts with its share p (of ``basis``), its requested share q and its rate q / p, by name.

    Args:
        counts: {group: {documents, sentences, tokens, ...}}; groups of size 0 get rate 0.
        requested: {group: q}, the shares asked for (summing to 1, or not: repeat counts).
    """
    sizes = {name: counts[name][basis] for name in sorted(counts)}
    total = sum(sizes.values())
    out = {}
    for name, size in sizes.items():
        p = size / total if total else 0.0
        q = requested.get(name, 0.0)
        out[name] = {**counts[name], "share": round(p, 9), requested_name: round(q, 9),
                     "rate": round(q / p, 9) if p else 0.0}
    return out


def check_sources(keys: list[str], cfg: MixtureConfig) -> None:
    """Before a run: with ``weights``, every source the run reads (by its files' keys: ``wiki``, ``book``,
    ``{format}:{name}``) needs a weight; ``InputError`` naming the first that has none."""
    if not cfg.weights:
        return
    names = sorted({BUILTIN_KEYS.get(key, key.split(":", 1)[-1]) for key in keys})
    missing = [name for name in names if name not in cfg.weights]
    if missing:
        raise InputError(f"mixture.weights has no weight for {', '.join(missing)}, which this run reads: add "
                         f"mixture.weights.{missing[0]} (a share of the tokens), or leave its inputs out")


def source_mix(counts: dict[str, dict], cfg: MixtureConfig) -> dict[str, dict]:
    """The sources' mix (``mix_entries`` of tokens) for ``cfg``: weights normalised to shares, or repeat counts as
    rates with the shares they give (a source not named is read once). ``InputError`` for a weighted source without
    documents (one read without a weight was refused before the run: ``check_sources``).

    Args:
        counts: {source: {documents, sentences, tokens, ...}} (``docstore``'s per-source counts), sources without
            documents (only dead letters) included or not.
    """
    counts = {name: entry for name, entry in counts.items() if entry.get("documents", 0) > 0}
    if cfg.weights:
        empty = sorted(set(cfg.weights) - set(counts))
        if empty:
            raise InputError(f"mixture.weights.{empty[0]}: the inputs hold no documents of source {empty[0]!r}, so "
                             "its share cannot be made: check its paths (and the dead letters), or remove the weight")
        total = sum(cfg.weights.values())
        requested = {name: weight / total for name, weight in cfg.weights.items()}
    else:
        tokens = {name: entry["tokens"] * cfg.repeat.get(name, 1.0) for name, entry in counts.items()}
        total = sum(tokens.values())
        requested = {name: value / total if total else 0.0 for name, value in tokens.items()}
        # Epochs are rates as they stand: the rows grow (or shrink) with them, where weights keep the corpus's total.
        return {name: {**entry, "rate": float(cfg.repeat.get(name, 1.0))}
                for name, entry in mix_entries(counts, requested, "tokens").items()}
    return mix_entries(counts, requested, "tokens")


def document_copies(seed: int, doc_ids: list[str], group_of: Callable[[str], str], rates: dict[str, float],
                    dupe_factor: int) -> np.ndarray:
    """How many times each document is used: ``dupe_factor · rate`` of its group, rounded down or up with the
    probability of the fraction by a uniform draw keyed by (seed, document id)."""
    copies = np.zeros(len(doc_ids), np.int64)
    for i, doc_id in enumerate(doc_ids):
        expected = dupe_factor * rates[group_of(doc_id)]
        whole = math.floor(expected)
        draw = stable_hash64(seed, COPIES_KEY, doc_id) / 2.0 ** 64
        copies[i] = whole + (draw < expected - whole)
    return copies


def group_rows(doc_ids: list[str], docs: np.ndarray, group_of: Callable[[str], str],
               tokens: np.ndarray | None = None) -> dict[str, dict]:
    """{group: {"rows": n[, "tokens": n]}} of rows whose first document is ``doc_ids[docs[i]]`` (and whose
    ``tokens[i]`` tokens are that group's), for the manifest."""
    names = sorted({group_of(doc_id) for doc_id in doc_ids})
    if not names:
        return {}
    of_doc = np.asarray([names.index(group_of(d)) for d in doc_ids], np.int64)
    docs = np.asarray(docs, np.int64)
    rows = np.bincount(of_doc[docs], minlength=len(names))
    counted = np.bincount(of_doc[docs], weights=tokens, minlength=len(names)) if tokens is not None else None
    return {name: {"rows": int(rows[i]), **({"tokens": int(counted[i])} if counted is not None else {})}
            for i, name in enumerate(names) if rows[i]}


def realised(mix: dict[str, dict], made: dict[str, dict]) -> dict[str, dict]:
    """The manifest's mix: each group's entry with the rows it starts and the tokens of its own they hold
    (``group_rows`` summed over the run), and its realised share of those tokens."""
    total = sum(entry.get("tokens", 0) for entry in made.values())
    out = {}
    for name, entry in mix.items():
        rows = made.get(name, {})
        out[name] = {**entry, "rows": rows.get("rows", 0), "instance_tokens": rows.get("tokens", 0),
                     "realised_share": round(rows.get("tokens", 0) / total, 6) if total else 0.0}
    return out


__all__ = ["COPIES_KEY", "check_sources", "document_copies", "group_rows", "mix_entries", "realised", "source_mix"]
