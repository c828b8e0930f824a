"""Each Beam transform on in-memory input with TestPipeline and assert_that."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

TestPipeline.__test__ = False  # a Beam class whose name pytest would otherwise try to collect

from common import storage
from common.hashing import document_hash
from common.preprocess_config import InstanceConfig, SourceConfig
from common.tokenizer import load_tokenizer
from preprocess import docstore, handoff, shards, transforms
from preprocess.beamrun import beam_options
from preprocess.records import RawDocument, Rejected

SOURCES = SourceConfig(min_document_chars=20, min_document_sentences=2)
PROSE = ("The river rises in the northern hills. It flows south through three towns. "
         "Farmers along its banks grow wheat and barley. In spring the water runs high and fast.")


def test_pipeline(**kwargs):
    return TestPipeline(options=beam_options([]), **kwargs)


test_pipeline.__test__ = False  # a helper, not a test


def _doc(i: int) -> RawDocument:
    return RawDocument(f"wiki:test:{i}", "test.xml", "wiki", f"'''Article {i}''' is about [[rivers|a river]]. {PROSE}")


def test_clean_and_tokenize_keys_documents_and_rejections_by_bucket(bert_vocab):
    tok = load_tokenizer(str(bert_vocab))
    elements = [_doc(1), RawDocument("wiki:test:2", "test.xml", "wiki", "Too short."),
                Rejected("test.xml", "wiki:test:3", "skipped", "redirect")]
    bits = 2
    with test_pipeline() as p:
        out = (p | beam.Create(elements)
               | beam.ParDo(transforms.CleanAndTokenize(SOURCES, str(bert_vocab), bits))
               | beam.Map(lambda kv: (kv[0], kv[1][0], kv[1][1][1] if kv[1][0] == "doc" else kv[1][1][1:4])))
        assert_that(out, equal_to([
            (docstore.bucket_of(document_hash("wiki:test:1"), bits), "doc", "wiki:test:1"),
            (docstore.bucket_of(document_hash("wiki:test:2"), bits), "rejected", ("wiki:test:2", "skipped", "too_short")),
            (docstore.bucket_of(document_hash("wiki:test:3"), bits), "rejected", ("wiki:test:3", "skipped", "redirect")),
        ]))
    # The token payload is the tokenizer's encoding of each cleaned sentence.
    row = _tokenize_one(bert_vocab, _doc(1))
    lengths = np.frombuffer(row[4], dtype=np.uint32)
    tokens = np.frombuffer(row[3], dtype=np.uint16)
    assert len(lengths) >= 4 and lengths.sum() == len(tokens)
    assert tok.decode(tokens[: lengths[0]].tolist()).startswith("article 1 is about a river")


def test_dofns_of_a_process_share_one_tokenizer(tmp_path, bert_vocab):
    # The driver offers the tokenizer it loaded: DoFns (in-process or in forked workers) do not load it again.
    offered = load_tokenizer(str(bert_vocab))
    offered_uri = str(tmp_path / "offered")
    transforms.share_tokenizer(offered_uri, offered)
    dofn = transforms.CleanAndTokenize(SOURCES, offered_uri, 0)  # nothing to load at that path: it must not try
    dofn.setup()
    assert dofn.tokenizer is offered
    # Without an offer the first DoFn loads it and the others of the process reuse that one.
    first, second = (transforms.PlanAndBuildInstances(str(bert_vocab), str(tmp_path), InstanceConfig(), 1)
                     for _ in range(2))
    first.setup()
    second.setup()
    assert first.tokenizer is second.tokenizer is not offered
    assert first.tokenizer.identity() == offered.identity()


def _tokenize_one(vocab, raw):
    dofn = transforms.CleanAndTokenize(SOURCES, str(vocab), 0)
    dofn.setup()
    [(_, (tag, row))] = list(dofn.process(raw))
    assert tag == "doc"
    return row


def test_build_document_store_writes_sorted_buckets_and_counts(tmp_path, bert_vocab):
    pages = "".join(f"<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>Page {i}. {PROSE}</text>"
                    f"</revision></page>" for i in range(1, 21))
    redirect = "<page><title>R</title><ns>0</ns><id>99</id><redirect title='T1'/><revision><text>#REDIRECT [[T1]]</text></revision></page>"
    dump = tmp_path / "testwiki-pages-articles.xml"
    dump.write_text(f"<mediawiki><siteinfo><dbname>testwiki</dbname></siteinfo>{pages}{redirect}</mediawiki>")
    work = str(tmp_path / "work")
    with test_pipeline() as p:
        parts = (p | beam.Create([("wiki", str(dump))])
                 | transforms.BuildDocumentStore(SOURCES, str(bert_vocab), 2, work, 3, 30522))
        assert_that(parts, equal_to([3]))
    loaded = [docstore.load_bucket(work, b) for b in range(4)]
    assert sum(len(b) for b in loaded) == 20
    for bucket, docs in enumerate(loaded):
        hashes = [document_hash(d) for d in docs.doc_ids]
        assert hashes == sorted(hashes) and all(docstore.bucket_of(h, 2) == bucket for h in hashes)
    # The part's counts in one file, not one per bucket: 4 buckets of documents, the redirect among the skipped.
    counts = storage.read_json(docstore.counts_uri(work, 3))
    assert counts["documents"] == 20 and counts["skipped"] == {"redirect": 1} and counts["failed"] == {}
    assert counts["tokens"] == sum(len(b.tokens) for b in loaded) and counts["sentences"] > 20
    assert sorted(p.name for p in (tmp_path / "work" / "docs").rglob("*")) == \
        sorted([f"b{b:06d}" for b in range(4)] + ["p0003.arrow"] * 4)


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
    storage.write_json(f"{work}/{transforms.INDEX_NAME}",
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
            groups = (p | beam.Create([0, 1]) | transforms.CreateInstances(
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
        _ = p | beam.Create(list(units)) | transforms.CreateInstances(str(bert_vocab), work, cfg, seed, 0, tok.vocab_size,
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
    index = storage.read_json(f"{work}/{transforms.INDEX_NAME}")
    storage.write_json(f"{work}/{transforms.INDEX_NAME}", {**index, "unit_bits": unit_bits})


def test_units_of_several_buckets_send_one_batch_per_group_and_change_no_instance(small_store, bert_vocab, monkeypatch):
    # Sent per bucket, the batches and requests of the pairs stage numbered buckets x groups (and buckets x target
    # buckets), a few rows each: their count grew with the square of the input. A unit of buckets sends at most one
    # batch per group each flush and one request per target unit, and builds the same instances.
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    per_bucket = _run_create_instances(small_store, bert_vocab, cfg)
    _with_units(small_store, 0)
    assert transforms.unit_buckets(storage.read_json(f"{small_store}/{transforms.INDEX_NAME}"), 0) == [0, 1]
    dofn = transforms.PlanAndBuildInstances(str(bert_vocab), small_store, cfg, 7)
    dofn.setup()
    sent = list(dofn.process(0))
    done = [group for tag, (group, _) in sent if tag == "done"]
    requests = [unit for tag, (unit, _) in sent if tag == "request"]
    assert sorted(done) == [0, 1] and requests == [0]  # 2 groups, 1 target unit, for 2 buckets
    by_unit = _run_create_instances(small_store, bert_vocab, cfg, units=[0])
    assert by_unit == per_bucket and len(by_unit) > 40
    # Flushing after every bucket (as a unit larger than FLUSH_ROWS does) changes nothing either.
    monkeypatch.setattr(transforms, "FLUSH_ROWS", 1)
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
    index = storage.read_json(f"{small_store}/{transforms.INDEX_NAME}")
    storage.write_json(f"{small_store}/{transforms.INDEX_NAME}", {**index, "group_bits": 6, "unit_bits": 1})
    _run_create_instances(small_store, bert_vocab, cfg)
    fine = _pieces_by_group(small_store, 6, 6)
    planned = sum(storage.read_json(f"{small_store}/planned/b{b:06d}.json")["instances"] for b in (0, 1))
    assert len(fine) > 16 and sum(map(len, fine.values())) == planned > 40

    monkeypatch.setattr(transforms, "TRANSPORT_GROUP_BITS", 1)
    monkeypatch.setattr(transforms, "JOIN_RANGE_BITS", 0)
    dofn = transforms.PlanAndBuildInstances(str(bert_vocab), small_store, cfg, 7)
    dofn.setup()
    sent = [item for unit in (0, 1) for item in dofn.process(unit)]
    done = [group for tag, (group, _) in sent if tag == "done"]
    requests = [target for tag, (target, _) in sent if tag == "request"]
    assert sorted(set(done)) == [0, 1] and len(done) == 4  # two transport groups a unit, not 64 groups
    assert requests == [0, 0]  # one join range for both units' requests
    resolve = transforms.ResolveRandomNext(str(bert_vocab), small_store, cfg, 7)
    resolve.setup()
    resolved = [group for group, _ in resolve.process((0, [payload for tag, (_, payload) in sent if tag == "request"]))]
    assert sorted(resolved) == [0, 1]

    storage.remove_tree(f"{small_store}/pieces")
    _run_create_instances(small_store, bert_vocab, cfg)
    assert _pieces_by_group(small_store, 6, 1) == fine  # two pieces, and each group's rows as before
