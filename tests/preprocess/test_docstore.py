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


def test_copies_of_one_id_from_one_source_keep_the_same_copy_whatever_part_holds_which(tmp_path):
    rng = np.random.default_rng(5)
    first, second, third = (_document(rng, "web:key-7", "crawl.jsonl") for _ in range(3))  # one id, three texts
    others = [_document(rng, f"web:{i}", "crawl.jsonl") for i in range(5)]
    smallest = min((first, second, third), key=lambda d: np.frombuffer(d[3], np.uint16).tolist())
    for arrangement in ([[first, *others], [second, third]], [[third], [second, *others], [first]],
                        [[second, third, first, *others]]):
        work = str(tmp_path / str(len(arrangement)))
        _write_parts(work, arrangement)
        loaded = docstore.load_bucket(work, 0)
        rank = loaded.doc_ids.index("web:key-7")
        assert loaded.document(rank)[0].tobytes() == smallest[3]
        assert loaded.duplicates == [("web:key-7", "crawl.jsonl")] * 2 and len(loaded) == 6


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
    assert docstore.bucket_count(work, 0) == (0, 6, [(docs[2][1], "elsewhere.txt")])


def test_an_empty_bucket_loads_as_no_documents(tmp_path):
    loaded = docstore.load_bucket(str(tmp_path), 5)
    assert len(loaded) == 0 and loaded.token_lengths.size == 0 and loaded.duplicates == []


def test_counts_of_parts_add_up_by_reason_with_dead_letters_in_order():
    letter = {"reason": "not_utf8", "detail": "byte 0x9f"}
    first = {**docstore.no_counts(), "documents": 2, "sentences": 9, "tokens": 70, "skipped": {"redirect": 1},
             "failed": {"not_utf8": 1}, "dead_letters": [{"source": "b.txt", "doc_id": "book:b.txt:2", **letter}]}
    second = {**docstore.no_counts(), "documents": 1, "sentences": 3, "tokens": 20,
              "skipped": {"redirect": 2, "too_short": 1}, "failed": {"not_utf8": 1},
              "dead_letters": [{"source": "a.txt", "doc_id": "book:a.txt:7", **letter}]}
    total = docstore.add_counts([first, second])
    assert (total["documents"], total["sentences"], total["tokens"]) == (3, 12, 90)
    assert total["skipped"] == {"redirect": 3, "too_short": 1} and total["failed"] == {"not_utf8": 2}
    assert [d["source"] for d in total["dead_letters"]] == ["a.txt", "b.txt"]
    assert docstore.add_counts([]) == docstore.no_counts()
    assert first["dead_letters"][0]["source"] == "b.txt", "the parts' own counts are left as they were"
