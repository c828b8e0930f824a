"""The instance stage for pairs on in-memory input with TestPipeline: random next resolved across buckets,
sentence-order pairs, and instances that do not depend on how units, groups and join ranges are cut."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from common import storage
from common.hashing import document_hash
from common.preprocess_config import InstanceConfig
from common.tokenizer import load_tokenizer
from preprocess import docstore, handoff, layout, shards
from preprocess.stages import instances, pairs
from tests.preprocess.stages.test_documents import test_pipeline


@pytest.fixture()
def small_store(tmp_path, bert_vocab):
    """Six documents of the real vocabulary's ids in a 2-bucket store."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        lengths = rng.integers(8, 30, size=12).astype(np.uint32)
        tokens = rng.integers(1000, 30000, size=int(lengths.sum())).astype(np.uint16)
        doc_id = f"book:doc{i}.txt:00000"
        rows.append((document_hash(doc_id), doc_id, f"doc{i}.txt", tokens.tobytes(), lengths.tobytes()))
    work = str(tmp_path / "work")
    for bucket in (0, 1):
        mine = [r for r in rows if docstore.bucket_of(r[0], 1) == bucket]
        docstore.write_table(f"{work}/docs/b{bucket:06d}/p0000.arrow", docstore.documents_table(mine, 30522))
    sizes = [len(docstore.load_bucket(work, b)) for b in (0, 1)]
    # What the index stage writes: global document offsets per bucket and the key-range group layout.
    storage.write_json(f"{work}/{layout.INDEX_NAME}",
                       {"bucket_offsets": [0, sizes[0], sizes[0] + sizes[1]], "group_bits": 1})
    return work


def test_create_instances_resolves_random_next_across_buckets(small_store, bert_vocab):
    work = small_store
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    tok = load_tokenizer(str(bert_vocab))
    pieces = {}
    # Without spreading (the local pool's pipelines) the pieces are the same; without provenance they lack
    # only the document ids.
    # Handing batches over by reference (one-process runners) changes nothing either.
    for spread, provenance, by_reference in ((True, True, False), (False, True, False), (False, False, False),
                                             (False, True, True)):
        with handoff.open_lot() as lot, test_pipeline() as p:
            groups = (p | beam.Create([0, 1]) | pairs.CreateInstances(
                str(bert_vocab), work, cfg, 7, 0, tok.vocab_size, tok.mask_id, spread=spread, provenance=provenance,
                lot=lot if by_reference else None))
            assert_that(groups | beam.Distinct(), equal_to([0, 1]))
        # A piece's rows come in arrival order (the shard sorts them): compare them in key order.
        pieces[spread, provenance, by_reference] = [
            shards.sort_by_key(docstore.read_table(shards.piece_uri(work, g, 0))) for g in (0, 1)]
    assert all(a.equals(b) for a, b in zip(pieces[True, True, False], pieces[False, True, False]))
    assert all(a.equals(b) for a, b in zip(pieces[False, True, True], pieces[False, True, False]))
    assert all(a.drop_columns(["doc_a", "doc_b"]).equals(b)
               for a, b in zip(pieces[False, True, False], pieces[False, False, False]))
    tables = pieces[False, True, False]
    planned = sum(storage.read_json(f"{work}/planned/b{b:06d}.json")["instances"] for b in (0, 1))
    assert sum(t.num_rows for t in tables) == planned > 0
    for group, table in enumerate(tables):
        keys = table.column("order_key").to_pylist()
        assert {int(g) for g in shards.group_of_keys(np.asarray(keys, np.uint64), 1)} == {group}
        for row in table.to_pylist():
            assert len(row["input_ids"]) <= 64 and row["input_ids"][0] == tok.cls_id
            if row["next_sentence_label"] == 1:
                assert row["doc_b"] != row["doc_a"]
            else:
                assert row["doc_b"] == row["doc_a"]
    random_sources = {(r["doc_a"], r["doc_b"]) for t in tables for r in t.to_pylist() if r["next_sentence_label"]}
    assert len({b for _, b in random_sources}) >= 4  # B drawn from many documents, in both buckets


def _run_create_instances(work, bert_vocab, cfg, seed=7, units=(0, 1)):
    """CreateInstances over ``units`` (by default the store's two buckets, each a unit); the pieces' rows in key
    order, as dicts."""
    tok = load_tokenizer(str(bert_vocab))
    with test_pipeline() as p:
        _ = p | beam.Create(list(units)) | pairs.CreateInstances(str(bert_vocab), work, cfg, seed, 0, tok.vocab_size,
                                                                  tok.mask_id)
    return [row for g in (0, 1) for row in shards.sort_by_key(docstore.read_table(shards.piece_uri(work, g, 0)))
            .to_pylist()]


def test_sentence_order_pairs_come_from_one_document_in_or_out_of_order(small_store, bert_vocab):
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3, sentence_objective="sop")
    documents = {}
    for bucket in (0, 1):
        loaded = docstore.load_bucket(small_store, bucket)
        documents.update({doc_id: loaded.document(rank)[0].astype(int).tolist()
                          for rank, doc_id in enumerate(loaded.doc_ids)})
    found = _run_create_instances(small_store, bert_vocab, cfg)
    planned = [storage.read_json(f"{small_store}/planned/b{b:06d}.json") for b in (0, 1)]
    assert sum(m["instances"] for m in planned) == len(found) and all(m["sop_dropped_chunks"] == 0 for m in planned)
    labels = []
    for row in found:
        assert row["doc_a"] == row["doc_b"]  # never a random document
        ids = list(row["input_ids"])
        for position, label in zip(row["masked_positions"], row["masked_labels"]):
            ids[position] = label
        a, b = ids[1:row["segment_a_len"] - 1], ids[row["segment_a_len"]:-1]
        text = documents[row["doc_a"]]
        a_at, b_at = _find(text, a), _find(text, b)  # each a contiguous span of the document
        assert (a_at > b_at) == (row["next_sentence_label"] == 1)
        labels.append(row["next_sentence_label"])
    assert 0.35 < np.mean(labels) < 0.65 and len(labels) > 40


def _find(haystack: list[int], needle: list[int]) -> int:
    starts = [i for i in range(len(haystack) - len(needle) + 1) if haystack[i:i + len(needle)] == needle]
    assert len(starts) == 1, "a segment is one contiguous span of its document"
    return starts[0]


def _with_units(work: str, unit_bits: int) -> None:
    index = storage.read_json(f"{work}/{layout.INDEX_NAME}")
    storage.write_json(f"{work}/{layout.INDEX_NAME}", {**index, "unit_bits": unit_bits})


def test_units_of_several_buckets_send_one_batch_per_group_and_change_no_instance(small_store, bert_vocab, monkeypatch):
    # Sent per bucket, the batches and requests of the pairs stage numbered buckets x groups (and buckets x target
    # buckets), a few rows each: their count grew with the square of the input. A unit of buckets sends at most one
    # batch per group each flush and one request per target unit, and builds the same instances.
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    per_bucket = _run_create_instances(small_store, bert_vocab, cfg)
    _with_units(small_store, 0)
    assert layout.unit_buckets(storage.read_json(f"{small_store}/{layout.INDEX_NAME}"), 0) == [0, 1]
    dofn = pairs.PlanAndBuildInstances(str(bert_vocab), small_store, cfg, 7)
    dofn.setup()
    sent = list(dofn.process(0))
    done = [group for tag, (group, _) in sent if tag == "done"]
    requests = [unit for tag, (unit, _) in sent if tag == "request"]
    assert sorted(done) == [0, 1] and requests == [0]  # 2 groups, 1 target unit, for 2 buckets
    by_unit = _run_create_instances(small_store, bert_vocab, cfg, units=[0])
    assert by_unit == per_bucket and len(by_unit) > 40
    # Flushing after every bucket (as a unit larger than FLUSH_ROWS does) changes nothing either.
    monkeypatch.setattr(instances, "FLUSH_ROWS", 1)
    assert _run_create_instances(small_store, bert_vocab, cfg, units=[0]) == per_bucket


def _pieces_by_group(work: str, group_bits: int, transport_bits: int) -> dict[int, list[dict]]:
    """Every non-empty key-range group's rows in key order, from the pieces of part 0, and checks that each piece
    is its transport group's and holds its groups one after the other."""
    present = []
    for transport in range(1 << transport_bits):
        uri = shards.piece_uri(work, transport, 0)
        if storage.exists(uri):
            groups = shards.group_of_keys(docstore.read_table(uri).column("order_key").to_numpy(), group_bits)
            assert np.all(np.diff(groups) >= 0) and np.all(groups >> (group_bits - transport_bits) == transport)
            present.extend(np.unique(groups).tolist())
    pieces = shards.PieceGroups(work, group_bits - transport_bits)
    return {group: pieces.sorted(group).to_pylist() for group in present}


def test_many_groups_and_units_cross_the_groupbykeys_in_few_batches_and_change_no_instance(small_store, bert_vocab,
                                                                                            monkeypatch):
    # Key-range groups and units grow with the corpus. Cut by every group and every target unit, a flush and a
    # unit's requests came a row or two per batch at full scale; they cross the GroupByKeys by transport group and
    # join range instead, and WritePieceGroup writes one piece per transport group, group after group.
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    index = storage.read_json(f"{small_store}/{layout.INDEX_NAME}")
    storage.write_json(f"{small_store}/{layout.INDEX_NAME}", {**index, "group_bits": 6, "unit_bits": 1})
    _run_create_instances(small_store, bert_vocab, cfg)
    fine = _pieces_by_group(small_store, 6, 6)
    planned = sum(storage.read_json(f"{small_store}/planned/b{b:06d}.json")["instances"] for b in (0, 1))
    assert len(fine) > 16 and sum(map(len, fine.values())) == planned > 40

    monkeypatch.setattr(layout, "TRANSPORT_GROUP_BITS", 1)
    monkeypatch.setattr(layout, "JOIN_RANGE_BITS", 0)
    dofn = pairs.PlanAndBuildInstances(str(bert_vocab), small_store, cfg, 7)
    dofn.setup()
    sent = [item for unit in (0, 1) for item in dofn.process(unit)]
    done = [group for tag, (group, _) in sent if tag == "done"]
    requests = [target for tag, (target, _) in sent if tag == "request"]
    assert sorted(set(done)) == [0, 1] and len(done) == 4  # two transport groups a unit, not 64 groups
    assert requests == [0, 0]  # one join range for both units' requests
    resolve = pairs.ResolveRandomNext(str(bert_vocab), small_store, cfg, 7)
    resolve.setup()
    resolved = [group for group, _ in resolve.process((0, [payload for tag, (_, payload) in sent if tag == "request"]))]
    assert sorted(resolved) == [0, 1]

    storage.remove_tree(f"{small_store}/pieces")
    _run_create_instances(small_store, bert_vocab, cfg)
    assert _pieces_by_group(small_store, 6, 1) == fine  # two pieces, and each group's rows as before
