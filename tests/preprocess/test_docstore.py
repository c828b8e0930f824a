"""The document store: a bucket read back from several parts' files is in global order, without duplicate ids."""
from __future__ import annotations

import numpy as np

from common.hashing import document_hash
from preprocess import docstore


def _document(rng, doc_id: str, source: str):
    lengths = rng.integers(1, 9, size=int(rng.integers(1, 6))).astype(np.uint32)
    tokens = rng.integers(5, 30000, size=int(lengths.sum())).astype(np.uint16)
    return (document_hash(doc_id), doc_id, source, tokens.tobytes(), lengths.tobytes())


def _write_parts(work: str, parts: list[list[tuple]]) -> None:
    for part, docs in enumerate(parts):
        docstore.write_table(f"{work}/docs/b{0:06d}/p{part:04d}.arrow", docstore.documents_table(docs, 30522))


def test_bucket_of_several_parts_is_in_global_order_with_each_documents_own_tokens(tmp_path):
    rng = np.random.default_rng(3)
    docs = [_document(rng, f"wiki:{i}", "dump.xml") for i in range(40)]
    # Every part holds an interleaved share, so the parts' rows alternate in global order.
    parts = [docs[i::3] for i in range(3)]
    work = str(tmp_path)
    _write_parts(work, parts)

    loaded = docstore.load_bucket(work, 0)

    expected = sorted(docs, key=lambda d: (d[0], d[1]))
    assert loaded.doc_ids == [d[1] for d in expected]
    assert loaded.duplicates == []
    for rank, (_, _, _, token_bytes, length_bytes) in enumerate(expected):
        tokens, offsets = loaded.document(rank)
        assert tokens.tobytes() == token_bytes
        assert np.diff(offsets).astype(np.uint32).tobytes() == length_bytes
        assert loaded.token_lengths[rank] == len(token_bytes) // 2
        # A document's sentences, through the bucket-wide boundaries, cover exactly its own tokens.
        first, end = loaded.sentence_starts[rank], loaded.sentence_ends[rank]
        assert loaded.boundaries[first] == loaded.token_starts[rank]
        assert loaded.boundaries[end] == loaded.token_ends[rank]
    assert docstore.bucket_ids(work, 0) == ([d[1] for d in expected], [])


def test_a_document_id_in_two_parts_is_kept_once_and_reported(tmp_path):
    rng = np.random.default_rng(4)
    docs = [_document(rng, f"book:b{i}.txt:00000", f"b{i}.txt") for i in range(6)]
    copy = _document(rng, docs[2][1], "elsewhere.txt")  # the same id from another source: sorts after the first
    work = str(tmp_path)
    _write_parts(work, [docs[:4], [copy, *docs[4:]]])

    loaded = docstore.load_bucket(work, 0)

    assert loaded.doc_ids == [d[1] for d in sorted(docs, key=lambda d: (d[0], d[1]))]
    assert loaded.duplicates == [(docs[2][1], "elsewhere.txt")]
    rank = loaded.doc_ids.index(docs[2][1])
    assert loaded.document(rank)[0].tobytes() == docs[2][3]  # the kept copy is the first source's (b2.txt < elsewhere)
    assert docstore.index_bucket(work, 0) == (0, 6, [(docs[2][1], "elsewhere.txt")])


def test_an_empty_bucket_loads_as_no_documents(tmp_path):
    loaded = docstore.load_bucket(str(tmp_path), 5)
    assert len(loaded) == 0 and loaded.token_lengths.size == 0 and loaded.duplicates == []


def _documents_of(loaded: docstore.Bucket) -> list[tuple]:
    return [(doc_id, *(part.tobytes() for part in loaded.document(rank))) for rank, doc_id in enumerate(loaded.doc_ids)]


def test_the_index_merges_a_bucket_of_several_files_into_the_same_documents(tmp_path):
    rng = np.random.default_rng(5)
    docs = [_document(rng, f"wiki:{i}", "dump.xml") for i in range(30)]
    copy = _document(rng, docs[7][1], "other.xml")
    work = str(tmp_path)
    _write_parts(work, [docs[0::2], [copy, *docs[1::2]]])
    before = docstore.load_bucket(work, 0)

    assert docstore.index_bucket(work, 0) == (0, 30, [(docs[7][1], "other.xml")])

    merged = docstore.read_table(f"{docstore.bucket_dir(work, 0)}/{docstore.MERGED}")
    assert merged.num_rows == 30  # in global order, the duplicate dropped
    after = docstore.load_bucket(work, 0)
    assert _documents_of(after) == _documents_of(before) and after.doc_ids == before.doc_ids
    # Counting again (another index builder) reads the parts' files, so it reports the same duplicate and writes
    # the same bytes.
    merged_bytes = (tmp_path / "docs" / "b000000" / docstore.MERGED).read_bytes()
    assert docstore.index_bucket(work, 0) == (0, 30, [(docs[7][1], "other.xml")])
    assert (tmp_path / "docs" / "b000000" / docstore.MERGED).read_bytes() == merged_bytes


def test_a_bucket_in_one_file_is_not_merged(tmp_path):
    rng = np.random.default_rng(6)
    work = str(tmp_path)
    _write_parts(work, [[_document(rng, f"wiki:{i}", "dump.xml") for i in range(5)]])
    assert docstore.index_bucket(work, 0)[1] == 5
    assert not (tmp_path / "docs" / "b000000" / docstore.MERGED).exists()
