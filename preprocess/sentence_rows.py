"""Packed rows (RoBERTa's FULL-SENTENCES and DOC-SENTENCES, Liu et al. 2019) as pure functions.

A packed row is ``[CLS] d1 [SEP] d2 [SEP] …``: contiguous text of one or more documents, each document's piece
followed by [SEP], all of token type 0. Its ``doc_starts`` say where each document's block starts (the first at 0,
its [CLS]; the next ones just after a [SEP]), so a loader can keep attention inside a block.

* ``doc_sentences``: each document alone, cut into rows of ``max_seq_length - 2`` tokens; a row never crosses a
  document, so each document has one shorter row.
* ``full_sentences``: the documents of a *packing stream* one after the other, in a seeded order; a row that
  reaches a document's end goes on with the next document. Every row is full but the stream's last.

Rows are cut at the room left, not at sentence ends: a sentence longer than the room left is cut and continues in
the next row, so no row is padded. A row is full when no other piece fits in it (a token and its [SEP]): it
holds ``max_seq_length`` tokens, or one fewer where a document ended with a single free position left.
``short_seq_prob`` and ``random_next_prob`` do not apply to packed rows (they shape pairs).

Packing streams are ranges of document hashes (the top ``stream_bits`` bits of ``common.hashing.document_hash``),
``stream_bits`` chosen from the corpus size alone (about ``TOKENS_PER_STREAM`` tokens each): which documents a
stream holds, and in which order, depends on the seed and the documents' ids, never on the number of document-store
buckets, workers or parts.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from common.hashing import stable_hash64
from common.masking import MaskingVocab
from common.preprocess_config import InstanceConfig
from preprocess.batch import FinalizedBatch, mask_instances, ragged_arange

TOKENS_PER_STREAM = 1 << 22  # a packing stream's share of the corpus: 4M tokens (8 MiB of uint16 ids in memory)
MAX_STREAM_BITS = 16


class Pieces(NamedTuple):
    """Document pieces of packed rows, in row order (a row's pieces in their order within it)."""

    row: np.ndarray       # the row each piece is in (non-decreasing)
    doc: np.ndarray       # the document it comes from (its position in the input lengths)
    start: np.ndarray     # its first token, from the document's start
    length: np.ndarray    # its tokens (>= 1)


def stream_bits_for(corpus_tokens: int, tokens_per_stream: int = TOKENS_PER_STREAM) -> int:
    """How many top bits of a document's hash name its packing stream: about ``tokens_per_stream`` tokens each."""
    streams = max(1, corpus_tokens // tokens_per_stream)
    return min(MAX_STREAM_BITS, (streams - 1).bit_length())


def stream_buckets(stream: int, stream_bits: int, bucket_bits: int) -> range:
    """The document-store buckets that hold stream ``stream``'s documents (hash ranges that overlap its own)."""
    first_hash, last_hash = stream << (64 - stream_bits), ((stream + 1) << (64 - stream_bits)) - 1
    return range(first_hash >> (64 - bucket_bits), (last_hash >> (64 - bucket_bits)) + 1)


def stream_of(doc_hash: int, stream_bits: int) -> int:
    return doc_hash >> (64 - stream_bits) if stream_bits else 0


def stream_order(seed: int, doc_ids: list[str], dupe: int) -> np.ndarray:
    """The order in which duplicate ``dupe`` of a stream packs its documents: by a keyed hash of (seed, id,
    duplicate), so each duplicate joins other documents (ties, which need a 64-bit collision, keep the input order)."""
    ranks = np.fromiter((stable_hash64(seed, "pack", doc_id, dupe) for doc_id in doc_ids), np.uint64, len(doc_ids))
    return np.argsort(ranks, kind="stable")


def stream_pieces(lengths: np.ndarray, max_seq_length: int) -> Pieces:
    """``full_sentences``: documents of ``lengths`` tokens, in this order, packed into rows of ``max_seq_length``.

    Each piece costs its tokens and a [SEP]; a row starts with [CLS]. A document that does not fit in the room left
    is cut; a row with a single free position left (no room for a token and its [SEP]) ends there.
    """
    room_per_row = max_seq_length - 1  # after [CLS]
    rows, docs, starts, sizes = [], [], [], []
    row, room = 0, room_per_row
    for doc, length in enumerate(np.asarray(lengths, np.int64).tolist()):
        start = 0
        while start < length:
            if room < 2:
                row, room = row + 1, room_per_row
            take = min(length - start, room - 1)
            rows.append(row)
            docs.append(doc)
            starts.append(start)
            sizes.append(take)
            room -= take + 1
            start += take
    return Pieces(*(np.asarray(values, np.int64) for values in (rows, docs, starts, sizes)))


def document_pieces(lengths: np.ndarray, max_seq_length: int, dupe: int) -> Pieces:
    """``doc_sentences``: each document of ``lengths`` tokens alone, in rows of ``max_seq_length - 2`` tokens.

    A document of n rows has one shorter row. Duplicate ``dupe`` puts it at row ``(n - 1 - dupe) mod n`` (the last
    for duplicate 0), so the first n duplicates of a document cut it at n different offsets.
    """
    width = max_seq_length - 2
    lengths = np.asarray(lengths, np.int64)
    per_doc = -(-lengths // width)
    short = lengths - (per_doc - 1) * width
    short_row = (per_doc - 1 - dupe) % per_doc
    doc = np.repeat(np.arange(len(lengths)), per_doc)
    k = np.arange(int(per_doc.sum())) - np.repeat(np.cumsum(per_doc) - per_doc, per_doc)
    size = np.where(k == short_row[doc], short[doc], width)
    start = k * width - np.where(k > short_row[doc], width - short[doc], 0)
    return Pieces(np.arange(len(doc)), doc, start, size)


def row_bounds(row: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(first piece, number of pieces) of each of ``rows`` rows, for pieces sorted by row."""
    first = np.searchsorted(row, np.arange(rows), side="left")
    return first, np.bincount(row, minlength=rows)


def finalize_packed(pool: np.ndarray, starts: np.ndarray, lengths: np.ndarray, row: np.ndarray, keys: np.ndarray,
                    cfg: InstanceConfig, vocab: MaskingVocab) -> FinalizedBatch:
    """Packed rows from pieces of ``pool``: ``[CLS] p1 [SEP] p2 [SEP] …``, with their ``doc_starts`` and masks.

    Args:
        pool: token ids the pieces index into.
        starts, lengths: each piece's first token in ``pool`` and its length, in row order.
        row: the row of each piece, ``0..n-1``, non-decreasing.
        keys: uint64 per row; its masks derive from it (static masking: every non-special token is a candidate).
    """
    rows = len(keys)
    first, count = row_bounds(row, rows)
    cost = lengths + 1                       # the piece and its [SEP]
    before = np.cumsum(cost) - cost          # over all pieces
    col = 1 + before - before[first][row]    # the column of each piece's first token
    row_lengths = 1 + np.bincount(row, weights=cost, minlength=rows).astype(np.int64)
    width = int(row_lengths.max(initial=1))
    tokens = np.zeros((rows, width), pool.dtype)
    tokens[:, 0] = vocab.cls_id
    tokens[np.repeat(row, lengths), ragged_arange(col, lengths)] = pool[ragged_arange(starts, lengths)]
    tokens[row, col + lengths] = vocab.sep_id
    valid = np.arange(width)[None, :] < row_lengths[:, None]
    is_first = np.zeros(len(row), bool)
    is_first[first[count > 0]] = True
    masked = mask_instances(tokens, valid, row_lengths, keys, cfg, vocab)
    return FinalizedBatch(
        input_ids=tokens[valid], lengths=row_lengths, segment_a_len=row_lengths, masked_positions=masked.cols,
        masked_counts=np.bincount(masked.rows, minlength=rows), masked_labels=masked.labels,
        truncated=np.zeros(rows, bool), doc_starts=np.where(is_first, 0, col), doc_counts=count)


__all__ = ["MAX_STREAM_BITS", "Pieces", "TOKENS_PER_STREAM", "document_pieces", "finalize_packed", "row_bounds",
           "stream_bits_for", "stream_buckets", "stream_of", "stream_order", "stream_pieces"]
