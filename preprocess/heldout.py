"""The held-out (evaluation) split: which documents are set aside, and the store they are built from.

A document's *held-out key* is a BLAKE2b of (selection seed, its id) (``common.hashing``, never ``hash()``), so it
does not depend on the workers, parts or runner that read it. Per input source (``heldout.wikipedia``,
``heldout.books``, and ``heldout.inputs.{name}`` for the config's ``inputs:`` sources) a share holds out the
documents whose key is below ``share * 2**64``; a count holds out the
``documents`` smallest keys: every bucket of the documents stage keeps its source's smallest keys, each part its
merged smallest (``trim_counts``), and the index stage takes the smallest of all parts, a top-N combine that never
sorts the corpus. Then, in the index stage (a barrier):

1. ``split_bucket``: each bucket's held-out documents are copied into the evaluation store (``layout.EVAL_DIR``),
   and their text hashes (a BLAKE2b of the document's tokens: its text as cleaned, split and tokenized) returned;
2. ``write_split``: the held-out text hashes -> ``layout.HELDOUT_NAME``, the evaluation store's counts;
3. ``count_training``: each bucket is counted without every document whose text hash is held out (the held-out
   documents themselves and any exact duplicate of their text, under another id or in another file); the index
   lists those ids, and every later load of the bucket leaves them out.

The evaluation store is then run through the index, instance and shard stages of its own (``Plan.evaluation``).
"""
from __future__ import annotations

import numpy as np

from common import storage
from common.errors import InputError
from common.hashing import document_hash, stable_hash64
from common.preprocess_config import HeldoutConfig, InstanceConfig
from preprocess import dedup, docstore
from preprocess.docstore import text_hash
from preprocess.readers import source_of
from preprocess.layout import EVAL_DIR, HELDOUT_NAME, HELDOUT_SELECTION_NAME

KEY_SPACE = 1 << 64


def selection_seed(cfg: HeldoutConfig, seed: int) -> int:
    return seed if cfg.seed is None else cfg.seed


def heldout_key(seed: int, doc_id: str) -> int:
    """The key that decides whether ``doc_id`` is held out (``seed``: ``selection_seed``)."""
    return stable_hash64(seed, "heldout", doc_id)


def bucket_counts(cfg: HeldoutConfig, seed: int, doc_ids: list[str]) -> dict:
    """What the documents stage records of a bucket for the selection: documents per source, and for each source
    held out by a count its smallest keys (at most the count)."""
    keys: dict[str, list[int]] = {}
    sources: dict[str, int] = {}
    by_source = cfg.by_source()
    for doc_id in doc_ids:
        source = source_of(doc_id)
        sources[source] = sources.get(source, 0) + 1
        if source in by_source and by_source[source].documents:
            keys.setdefault(source, []).append(heldout_key(selection_seed(cfg, seed), doc_id))
    return trim_counts({"heldout_sources": sources, "heldout_keys": keys}, cfg)


def trim_counts(counts: dict, cfg: HeldoutConfig) -> dict:
    """``counts`` with each source's keys cut to its count's smallest distinct ones (merging concatenates them)."""
    if "heldout_keys" not in counts:
        return counts
    by_source = cfg.by_source()
    keys = {source: sorted(set(values))[:by_source[source].documents]
            for source, values in counts["heldout_keys"].items()}
    return {**counts, "heldout_keys": keys}


def thresholds(cfg: HeldoutConfig, counts: dict) -> dict[str, int]:
    """Per source, the key below which a document is held out, from every part's counts (``docstore.add_counts``
    of them); refuses a count that holds out every document of its source."""
    out = {}
    for source, wanted in cfg.by_source().items():
        key = cfg.key_of(source)
        if wanted.share:
            out[source] = int(wanted.share * KEY_SPACE)
        elif wanted.documents:
            available = counts.get("heldout_sources", {}).get(source, 0)
            if available and wanted.documents >= available:
                raise InputError(f"{key}.documents is {wanted.documents} but the {source} inputs hold "
                                 f"{available} documents: that leaves no training documents; lower "
                                 f"{key}.documents (or use {key}.share)")
            keys = sorted(set(counts.get("heldout_keys", {}).get(source, [])))[:wanted.documents]
            out[source] = keys[-1] + 1 if keys else 0
        else:
            out[source] = 0
    return out


def is_heldout(limits: dict[str, int], seed: int, doc_ids: list[str]) -> np.ndarray:
    """Which of ``doc_ids`` are held out, given ``thresholds``' limits and the selection seed (a source without a
    limit holds none out)."""
    return np.fromiter((heldout_key(seed, d) < limits.get(source_of(d), 0) for d in doc_ids), bool, len(doc_ids))


def write_thresholds(work: str, cfg: HeldoutConfig, seed: int) -> dict:
    """After the documents stage: the selection (seed and limits) -> ``HELDOUT_SELECTION_NAME``, which
    ``split_bucket`` reads. (A file of its own: parts that build the index at once write the same bytes to it, and
    never over the finished ``HELDOUT_NAME`` another part may be reading.)"""
    counts = docstore.add_counts([storage.read_json(uri) for uri in storage.list_files(
        storage.join(work, docstore.COUNTS_DIR)) if uri.endswith(".json")])
    selection = {"seed": selection_seed(cfg, seed), "limits": thresholds(cfg, counts)}
    storage.write_json(storage.join(work, HELDOUT_SELECTION_NAME), selection)
    return selection


def split_bucket(work: str, bucket: int, selection: dict, vocab_size: int) -> dict:
    """Bucket ``bucket``'s held-out documents -> the evaluation store's bucket; their text hashes and counts."""
    loaded = docstore.load_bucket(work, bucket, dedup.dropped(work, bucket))
    chosen = np.flatnonzero(is_heldout(selection["limits"], selection["seed"], loaded.doc_ids))
    docs, hashes, sources = [], [], {}
    for rank in chosen.tolist():
        tokens, offsets = loaded.document(rank)
        doc_id = loaded.doc_ids[rank]
        hashes.append(text_hash(tokens))
        sources[source_of(doc_id)] = sources.get(source_of(doc_id), 0) + 1
        # The store's source column only breaks ties of ids, which the split's ids (unique) never have.
        docs.append((document_hash(doc_id), doc_id, doc_id.split(":")[1], tokens.tobytes(),
                     np.diff(offsets).astype(np.uint32).tobytes()))
    if docs:
        docstore.write_table(storage.join(docstore.bucket_dir(storage.join(work, EVAL_DIR), bucket), "p0000.arrow"),
                             docstore.documents_table(docs, vocab_size))
    return {"text_hashes": hashes, "documents": len(docs), "sources": sources,
            "sentences": sum(len(d[4]) // 4 for d in docs),
            "tokens": int(sum(loaded.token_lengths[chosen])) if len(chosen) else 0}


def write_split(work: str, results: list[dict], cfg: InstanceConfig) -> None:
    """Every bucket's ``split_bucket`` result -> the held-out text hashes (``HELDOUT_NAME``) and the evaluation
    store's counts; refuses a split too small for the recipe."""
    documents = sum(r["documents"] for r in results)
    needed = 2 if cfg.sentence_objective == "nsp" else 1  # a random next segment comes from another document
    if documents < needed:
        raise InputError(f"the held-out split has {documents} document(s) but the recipe needs at least {needed}: "
                         "raise heldout.wikipedia / heldout.books / heldout.inputs.NAME (documents or share), or remove "
                         "the heldout section")
    selection = storage.read_json(storage.join(work, HELDOUT_SELECTION_NAME))
    sources: dict[str, int] = {}
    for result in results:
        for source, count in result["sources"].items():
            sources[source] = sources.get(source, 0) + count
    hashes = sorted({h for r in results for h in r["text_hashes"]})
    storage.write_json(storage.join(work, HELDOUT_NAME), {**selection, "documents": documents, "sources": sources,
                                                          "text_hashes": hashes})
    counts = {**docstore.no_counts(), "documents": documents, "sentences": sum(r["sentences"] for r in results),
              "tokens": sum(r["tokens"] for r in results)}
    storage.write_json(docstore.counts_uri(storage.join(work, EVAL_DIR), 0), counts)


def read_text_hashes(work: str) -> frozenset[int]:
    return frozenset(storage.read_json(storage.join(work, HELDOUT_NAME))["text_hashes"])


def count_training(work: str, bucket: int, held_out: frozenset[int]) -> tuple:
    """(bucket, training documents, duplicate ids, the ids left out for the split with their sentences and tokens):
    a row of the corpus index, without every document whose text is held out (nor an exact duplicate that
    ``preprocess.dedup`` dropped)."""
    loaded = docstore.load_bucket(work, bucket, dedup.dropped(work, bucket))
    dropped = [rank for rank in range(len(loaded)) if text_hash(loaded.document(rank)[0]) in held_out]
    ids = [loaded.doc_ids[rank] for rank in dropped]
    sentences = int(sum(loaded.sentence_ends[r] - loaded.sentence_starts[r] for r in dropped))
    tokens = int(sum(loaded.token_lengths[r] for r in dropped))
    return bucket, len(loaded) - len(dropped), loaded.duplicates, {"ids": ids, "sentences": sentences,
                                                                   "tokens": tokens}


__all__ = ["bucket_counts", "count_training", "heldout_key", "is_heldout", "read_text_hashes", "selection_seed",
           "split_bucket", "text_hash", "thresholds", "trim_counts", "write_split", "write_thresholds"]
