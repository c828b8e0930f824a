"""Packed rows (full_sentences, doc_sentences) as pure functions: where documents are cut, how rows are laid out."""
import numpy as np
import pytest

from common.hashing import document_hash
from common.preprocess_config import InstanceConfig
from preprocess.sentence_rows import (
    document_pieces,
    finalize_packed,
    stream_bits_for,
    stream_buckets,
    stream_of,
    stream_order,
    stream_pieces,
)
from tests.preprocess.test_instances import CLS, SEP, keys_for, make_vocab


def _check_cover(pieces, lengths):
    """Every token of every document is in exactly one piece, and a document's pieces come in its order."""
    for doc, length in enumerate(lengths):
        mine = np.flatnonzero(pieces.doc == doc)
        assert pieces.start[mine].tolist() == np.concatenate([[0], np.cumsum(pieces.length[mine])[:-1]]).tolist()
        assert pieces.length[mine].sum() == length and (pieces.length[mine] >= 1).all()


def _row_lengths(pieces):
    return 1 + np.bincount(pieces.row, weights=pieces.length + 1).astype(int)


@pytest.mark.parametrize("max_seq_length", [8, 16, 128])
def test_full_sentences_fill_every_row_but_the_last_and_cut_documents_where_room_ends(max_seq_length):
    rng = np.random.default_rng(max_seq_length)
    lengths = rng.integers(1, 3 * max_seq_length, 300)
    pieces = stream_pieces(lengths, max_seq_length)
    _check_cover(pieces, lengths)
    assert (np.diff(pieces.row) >= 0).all() and (np.diff(pieces.doc) >= 0).all()  # documents follow one another
    rows = _row_lengths(pieces)
    assert rows.max() <= max_seq_length
    ends_document = pieces.start + pieces.length == lengths[pieces.doc]
    last_piece = np.searchsorted(pieces.row, np.arange(len(rows)), side="right") - 1
    for row, length in enumerate(rows[:-1]):
        # Full: no room for another piece (a token and its [SEP]); one position is left only after a document's end.
        assert length == max_seq_length or (length == max_seq_length - 1 and ends_document[last_piece[row]])
    fill = rows.sum() / (len(rows) * max_seq_length)
    assert fill > 1 - 1.5 / len(rows) - 1.5 / max_seq_length


def test_doc_sentences_keep_each_document_to_its_own_rows_and_move_the_short_row_per_duplicate():
    lengths = np.asarray([1, 6, 7, 20, 21, 50])
    width = 6  # max_seq_length 8: [CLS] and [SEP] around 6 tokens
    layouts = []
    for dupe in range(4):
        pieces = document_pieces(lengths, 8, dupe)
        _check_cover(pieces, lengths)
        assert pieces.row.tolist() == list(range(len(pieces.row)))  # one piece per row: never two documents
        for doc, length in enumerate(lengths):
            sizes = pieces.length[pieces.doc == doc]
            n = -(-length // width)
            assert len(sizes) == n and (sizes == width).sum() >= n - 1
            if n > 1 and length % width:
                # Duplicate d's short row is row (n - 1 - d) mod n: the last for the first duplicate.
                assert int(np.flatnonzero(sizes < width)[0]) == (n - 1 - dupe) % n
        layouts.append([tuple(pieces.start[pieces.doc == 5])])
    assert len({tuple(x) for x in layouts}) == 4  # a 9-row document is cut four different ways


def test_packed_rows_are_cls_pieces_and_separators_with_their_document_starts():
    cfg = InstanceConfig(max_seq_length=16, kind="full_sentences", sentence_objective="none", masked_lm_prob=0.2)
    pool = np.arange(5, 105, dtype=np.uint16)
    # Row 0: [0, 3) of the pool, then [50, 58); row 1: [20, 33).
    batch = finalize_packed(pool, np.asarray([0, 50, 20]), np.asarray([3, 8, 13]), np.asarray([0, 0, 1]),
                            keys_for(2), cfg, make_vocab())
    assert batch.lengths.tolist() == [14, 15] and batch.segment_a_len.tolist() == [14, 15]
    assert batch.doc_starts.tolist() == [0, 5, 0] and batch.doc_counts.tolist() == [2, 1]
    rows = np.split(batch.input_ids, np.cumsum(batch.lengths)[:-1])
    positions = np.split(batch.masked_positions, np.cumsum(batch.masked_counts)[:-1])
    labels = np.split(batch.masked_labels, np.cumsum(batch.masked_counts)[:-1])
    expected = [[CLS, 5, 6, 7, SEP, *range(55, 63), SEP], [CLS, *range(25, 38), SEP]]
    for row, chosen, original, want in zip(rows, positions, labels, expected):
        assert len(chosen) == 3 and not {0, len(want) - 1} & set(chosen.tolist())
        assert SEP not in [want[p] for p in chosen]  # specials are never masked
        restored = row.copy()
        restored[chosen] = original
        assert restored.tolist() == want


def test_each_duplicate_packs_the_stream_in_its_own_order():
    ids = [f"book:b{i}.txt:00000" for i in range(50)]
    orders = [stream_order(3, ids, dupe) for dupe in range(3)]
    assert all(sorted(o.tolist()) == list(range(50)) for o in orders)
    assert len({tuple(o.tolist()) for o in orders}) == 3
    assert stream_order(3, ids, 1).tolist() == orders[1].tolist() and stream_order(4, ids, 1).tolist() != orders[1].tolist()


def test_streams_are_hash_ranges_chosen_by_the_corpus_size_alone():
    assert stream_bits_for(10) == 0 and stream_bits_for(4 << 22) == 2 and stream_bits_for(5 << 22) == 3
    assert stream_bits_for(1 << 60) == 16
    # Buckets finer than streams: a stream spans several; coarser: several streams share one.
    assert list(stream_buckets(1, 1, 3)) == [4, 5, 6, 7] and list(stream_buckets(3, 2, 1)) == [1]
    assert list(stream_buckets(0, 0, 0)) == [0] and list(stream_buckets(0, 0, 2)) == [0, 1, 2, 3]
    doc_hash = document_hash("wiki:x:1")
    assert stream_of(doc_hash, 3) in stream_buckets(stream_of(doc_hash, 3), 3, 3)
    assert stream_of(doc_hash, 0) == 0


def test_dynamic_packed_rows_are_stored_unmasked():
    cfg = InstanceConfig(max_seq_length=16, kind="doc_sentences", sentence_objective="none", masking="dynamic")
    pool = np.arange(5, 105, dtype=np.uint16)
    batch = finalize_packed(pool, np.asarray([0, 20]), np.asarray([14, 14]), np.asarray([0, 1]), keys_for(2), cfg,
                            make_vocab())
    assert batch.masked_counts.tolist() == [0, 0] and len(batch.masked_positions) == len(batch.masked_labels) == 0
    assert batch.input_ids.tolist() == [CLS, *range(5, 19), SEP, CLS, *range(25, 39), SEP]
