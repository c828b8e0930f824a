"""The packed instance stage on in-memory input: rows of full_sentences and doc_sentences built from a document
store, whatever its bucket layout and however its units are shared out."""
from __future__ import annotations

import collections

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from common import storage
from common.hashing import document_hash
from common.preprocess_config import InstanceConfig
from common.tokenizer import load_tokenizer
from preprocess import docstore, layout, shards
from preprocess.stages import instances, packed
from preprocess.stages.index import instance_units
from tests.preprocess.stages.test_documents import test_pipeline

MAX_SEQ = 32


def _documents(count: int = 24, seed: int = 0) -> list[tuple]:
    """Documents of non-special ids of the real vocabulary: (hash, id, source, token bytes, sentence-length bytes)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        lengths = rng.integers(3, 25, size=int(rng.integers(2, 9))).astype(np.uint32)
        tokens = rng.integers(1000, 30000, size=int(lengths.sum())).astype(np.uint16)
        doc_id = f"book:doc{i}.txt:00000"
        rows.append((document_hash(doc_id), doc_id, f"doc{i}.txt", tokens.tobytes(), lengths.tobytes()))
    return rows


def _store(work: str, documents: list[tuple], bucket_bits: int, stream_bits: int, cfg: InstanceConfig,
           unit_bits: int | None = None) -> list[int]:
    """A document store of ``bucket_bits`` and its index (units of ``unit_bits``, by default one a bucket); returns
    the instance stage's units."""
    for bucket in range(1 << bucket_bits):
        mine = [d for d in documents if docstore.bucket_of(d[0], bucket_bits) == bucket]
        if mine:
            docstore.write_table(f"{work}/docs/b{bucket:06d}/p0000.arrow", docstore.documents_table(mine, 30522))
    offsets = [0]
    for bucket in range(1 << bucket_bits):
        offsets.append(offsets[-1] + len(docstore.load_bucket(work, bucket)))
    index = {"bucket_offsets": offsets, "group_bits": 1, "stream_bits": stream_bits,
             "unit_bits": bucket_bits if unit_bits is None else unit_bits}
    storage.write_json(f"{work}/{layout.INDEX_NAME}", index)
    return instance_units(index, cfg)


def _build(work: str, bert_vocab, cfg: InstanceConfig, unit_parts: list[list[int]], seed: int = 7) -> pa.Table:
    """CreatePackedInstances over each part's units (one pipeline per part); every piece's rows in key order."""
    tok = load_tokenizer(str(bert_vocab))
    for part, units in enumerate(unit_parts):
        if units:
            with test_pipeline() as p:
                _ = p | beam.Create(units) | packed.CreatePackedInstances(str(bert_vocab), work, cfg, seed, part,
                                                                          tok.vocab_size, tok.mask_id)
    tables = [docstore.read_table(uri) for uri in storage.list_files(f"{work}/pieces") if uri.endswith(".arrow")]
    return shards.sort_by_key(pa.concat_tables(tables))


def _content(row: dict, sep: int) -> list[list[int]]:
    """A row's document blocks, masks undone, without [CLS] and the [SEP]s."""
    ids = list(row["input_ids"])
    for position, label in zip(row["masked_positions"], row["masked_labels"]):
        ids[position] = label
    starts = list(row["doc_starts"])
    assert starts[0] == 0 and starts == sorted(set(starts)) and starts[-1] < len(ids)
    ends = starts[1:] + [len(ids)]
    assert all(ids[end - 1] == sep for end in ends)  # each block ends with its [SEP]
    return [ids[start + (start == 0):end - 1] for start, end in zip(starts, ends)]


def _tokens(documents) -> dict[str, list[int]]:
    return {d[1]: np.frombuffer(d[3], np.uint16).astype(int).tolist() for d in documents}


def test_full_sentences_hold_every_token_once_per_duplicate_in_full_rows(tmp_path, bert_vocab):
    cfg = InstanceConfig(max_seq_length=MAX_SEQ, max_predictions_per_seq=5, dupe_factor=2, kind="full_sentences",
                         sentence_objective="none")
    documents = _documents()
    work = str(tmp_path / "work")
    units = _store(work, documents, bucket_bits=2, stream_bits=1, cfg=cfg)
    table = _build(work, bert_vocab, cfg, [units])
    sep = load_tokenizer(str(bert_vocab)).sep_id
    rows = table.to_pylist()
    blocks = [block for row in rows for block in _content(row, sep)]
    counts = collections.Counter(token for block in blocks for token in block)
    expected = collections.Counter(token for tokens in _tokens(documents).values() for token in tokens)
    assert counts == collections.Counter({token: 2 * n for token, n in expected.items()})
    lengths = np.asarray([len(row["input_ids"]) for row in rows])
    # Every row is full (a single free position at most) but the last of each stream and duplicate: 2 x 2.
    assert (lengths < MAX_SEQ - 1).sum() <= 4 and lengths.max() == MAX_SEQ
    assert all(row["segment_a_len"] == len(row["input_ids"]) and row["next_sentence_label"] == 0 for row in rows)
    assert max(len(row["doc_starts"]) for row in rows) >= 3  # rows go on across documents
    # Each duplicate packs the stream in another order: most rows differ (a row that falls at the same offset of a
    # document in both duplicates without crossing a document is repeated).
    contents = [tuple(tuple(b) for b in _content(row, sep)) for row in rows]
    assert len(set(contents)) > 0.8 * len(contents)
    planned = sum(storage.read_json(u)["instances"] for u in storage.list_files(f"{work}/planned"))
    assert planned == len(rows)


def test_doc_sentences_never_cross_a_document(tmp_path, bert_vocab):
    cfg = InstanceConfig(max_seq_length=MAX_SEQ, max_predictions_per_seq=5, dupe_factor=3, kind="doc_sentences",
                         sentence_objective="none")
    documents = _documents()
    work = str(tmp_path / "work")
    table = _build(work, bert_vocab, cfg, [_store(work, documents, bucket_bits=1, stream_bits=0, cfg=cfg)])
    sep = load_tokenizer(str(bert_vocab)).sep_id
    texts = _tokens(documents)
    by_document = collections.defaultdict(list)
    for row in table.to_pylist():
        [block] = _content(row, sep)  # one document per row
        assert row["doc_a"] == row["doc_b"]
        by_document[row["doc_a"]].append(block)
    for doc_id, tokens in texts.items():
        blocks = by_document[doc_id]
        assert len(blocks) == 3 * -(-len(tokens) // (MAX_SEQ - 2))
        # Each duplicate's rows are consecutive slices of the document that cover it once.
        assert collections.Counter(t for b in blocks for t in b) == collections.Counter(tokens * 3)
        assert all(any(tokens[i:i + len(b)] == b for i in range(len(tokens))) for b in blocks)


@pytest.mark.parametrize("kind", ["full_sentences", "doc_sentences"])
def test_rows_do_not_depend_on_the_bucket_layout_or_how_units_are_shared_out(tmp_path, bert_vocab, kind,
                                                                             monkeypatch):
    cfg = InstanceConfig(max_seq_length=MAX_SEQ, max_predictions_per_seq=5, dupe_factor=2, kind=kind,
                         sentence_objective="none")
    documents = _documents(count=30, seed=1)
    results = []
    # Streams of 2 hash bits in stores of 0, 2 and 3 bucket bits: a bucket holds several streams, one, or a part;
    # doc_sentences units of one bucket or of four (sent on after every bucket, as a unit larger than FLUSH_ROWS is).
    for bucket_bits, parts, unit_bits, flush_rows in ((0, 1, None, None), (2, 1, None, None), (3, 3, None, None),
                                                     (3, 1, 1, 1)):
        work = str(tmp_path / f"b{bucket_bits}-{unit_bits}")
        units = _store(work, documents, bucket_bits, stream_bits=2, cfg=cfg, unit_bits=unit_bits)
        if flush_rows:
            monkeypatch.setattr(instances, "FLUSH_ROWS", flush_rows)
        table = _build(work, bert_vocab, cfg, [units[i::parts] for i in range(parts)])
        results.append(table.drop_columns(["truncated"]))
    assert results[0].num_rows > 40
    assert all(r.equals(results[0]) for r in results[1:])
