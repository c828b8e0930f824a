"""Near duplicates (``dedup.near_threshold``): MinHash signatures of each document's word shingles, through
``datasketch``, and locality-sensitive hashing by bands, as pure functions over arrays; ``preprocess.dedup`` runs
them over the document store's buckets.

A document's words are its tokens grouped at word starts (a token that does not continue a word, by the
tokenizer's own flags: WordPiece's ``##``, SentencePiece's ``▁``), so the text compared is the cleaned, normalised
text the rows are built from. Its shingles are runs of ``shingle_words`` words, each as a 32-bit hash; its signature
holds ``num_perm`` MinHash values (datasketch's permutations, seeded by the run's seed). LSH cuts the signature into
``b`` bands of ``r`` values (datasketch's choice for the threshold: ``MinHashLSH(threshold, num_perm).b``/``.r``);
two documents whose bands agree anywhere are candidates, and a candidate is a near copy of the first document of
its band (by stable key) when their signatures agree on at least ``threshold`` of the values (datasketch's
Jaccard estimate).
"""
from __future__ import annotations

import functools

import numpy as np

SCHEME = "affine32"  # datasketch 2's default, named: it refuses shared permutations without it
_MASK32 = np.uint64(0xFFFFFFFF)
_WORD_BASE = np.uint64(0x100000001B3)      # FNV-1a's 64-bit prime: mixes a word's token ids in order
_SHINGLE_BASE = np.uint64(0x9E3779B97F4A7C15)


@functools.lru_cache(maxsize=8)
def lsh_shape(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) datasketch chooses for ``threshold`` (equal weights of false positives and negatives)."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return lsh.b, lsh.r


@functools.lru_cache(maxsize=8)
def _permutations(num_perm: int, seed: int):
    from datasketch import MinHash

    return MinHash(num_perm=num_perm, seed=seed).permutations


def shingles(tokens: np.ndarray, continuation: np.ndarray, words: int) -> np.ndarray:
    """The distinct 32-bit hashes of a document's runs of ``words`` words (one run if it has fewer words)."""
    if not len(tokens):
        return np.zeros(0, np.uint64)
    ids = np.asarray(tokens, np.uint64) + np.uint64(1)
    starts = np.flatnonzero(~continuation[np.asarray(tokens, np.int64)])
    if not len(starts) or starts[0] != 0:
        starts = np.concatenate([[0], starts])
    marks = np.zeros(len(ids), np.int64)
    marks[starts] = 1
    word_of = np.cumsum(marks) - 1
    position = np.arange(len(ids)) - starts[word_of]
    with np.errstate(over="ignore"):  # wrapping arithmetic is the hash
        mixed = ids * _WORD_BASE ** np.minimum(position, 63).astype(np.uint64)
        word_hashes = np.add.reduceat(mixed, starts)
        width = min(words, len(word_hashes))
        windows = np.lib.stride_tricks.sliding_window_view(word_hashes, width)
        hashes = (windows * (_SHINGLE_BASE ** np.arange(width, dtype=np.uint64))).sum(axis=1, dtype=np.uint64)
    return np.unique((hashes ^ (hashes >> np.uint64(32))) & _MASK32)


def signature(shingle_hashes: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """The MinHash signature (``num_perm`` values) of a document's shingles, by datasketch."""
    from datasketch import MinHash

    minhash = MinHash(num_perm=num_perm, seed=seed, hashfunc=int, permutations=_permutations(num_perm, seed),
                      scheme=SCHEME)
    minhash.update_batch(shingle_hashes.tolist())
    return np.asarray(minhash.hashvalues, np.uint64)


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, bands) 63-bit hashes of each band of each signature (documents, num_perm)."""
    out = np.zeros((len(signatures), bands), np.uint64)
    with np.errstate(over="ignore"):
        for band in range(bands):
            part = signatures[:, band * rows:(band + 1) * rows]
            h = np.full(len(signatures), np.uint64(band + 1), np.uint64)
            for column in range(part.shape[1]):
                h = (h ^ part[:, column]) * _WORD_BASE
            out[:, band] = h >> np.uint64(1)
    return out


def similar(a: np.ndarray, b: np.ndarray) -> float:
    """datasketch's Jaccard estimate of two signatures: the share of values they agree on."""
    return float(np.count_nonzero(a == b)) / len(a)


__all__ = ["band_hashes", "lsh_shape", "shingles", "signature", "similar"]
