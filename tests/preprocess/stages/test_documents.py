"""The documents stage's transforms on in-memory input with TestPipeline and assert_that, and the tokenizer its
DoFns share with the instance stage's."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

TestPipeline.__test__ = False  # a Beam class whose name pytest would otherwise try to collect

from common import storage
from common.hashing import document_hash
from common.preprocess_config import InputSourceConfig, InstanceConfig, SourceConfig
from common.tokenizer import load_tokenizer
from preprocess import docstore
from preprocess.executors.beamrun import beam_options
from preprocess.readers import key_of
from preprocess.records import RawDocument, Rejected
from preprocess.stages import documents, pairs, worker_tokenizer

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
               | beam.ParDo(documents.CleanAndTokenize(SOURCES, str(bert_vocab), bits))
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
    worker_tokenizer.share_tokenizer(offered_uri, offered)
    dofn = documents.CleanAndTokenize(SOURCES, offered_uri, 0)  # nothing to load at that path: it must not try
    dofn.setup()
    assert dofn.tokenizer is offered
    # Without an offer the first DoFn loads it and the others of the process reuse that one.
    first, second = (pairs.PlanAndBuildInstances(str(bert_vocab), str(tmp_path), InstanceConfig(), 1)
                     for _ in range(2))
    first.setup()
    second.setup()
    assert first.tokenizer is second.tokenizer is not offered
    assert first.tokenizer.identity() == offered.identity()


def _tokenize_one(vocab, raw):
    dofn = documents.CleanAndTokenize(SOURCES, str(vocab), 0)
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
                 | documents.BuildDocumentStore(SOURCES, str(bert_vocab), 2, work, 3, 30522))
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
    assert counts["sources"] == {"wikipedia": {"documents": 20, "sentences": counts["sentences"],
                                               "tokens": counts["tokens"], "skipped": {"redirect": 1}, "failed": {}}}


def test_a_large_file_of_an_inputs_source_is_spread_in_its_readers_pieces(tmp_path):
    path = tmp_path / "essays.parquet"
    texts = [f"Essay {i}. {PROSE}" if i % 9 else None for i in range(60)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=7)
    spec = InputSourceConfig(name="essays", format="parquet", paths=[str(path)])
    with test_pipeline() as p:
        units = (p | beam.Create([(key_of(spec), str(path))])
                 | beam.ParDo(documents.SplitLargeFiles(path.stat().st_size // 5, (spec,))))
        kinds = units | "Pieces" >> beam.Map(lambda unit: unit[2][0]) | beam.combiners.Count.PerElement()
        assert_that(kinds, equal_to([("rowgroups", 5)]), label="five runs of row groups")
        records = (units | beam.ParDo(documents.ReadSourceFile(SOURCES, (spec,)))
                   | beam.Map(lambda r: (r.doc_id, type(r).__name__)))
        assert_that(records, equal_to([(f"essays:essays.parquet:{i // 7}/{i % 7}",
                                        "RawDocument" if i % 9 else "Rejected") for i in range(60)]),
                    label="every row once")


def test_a_source_with_limits_of_its_own_is_cleaned_by_them(bert_vocab):
    spec = InputSourceConfig(name="short", format="jsonl", paths=["x"], min_chars=10, min_sentences=1)
    raw = [RawDocument("short:a.jsonl:0", "a.jsonl", "plain", "One short sentence."),
           RawDocument("web:a.jsonl:0", "a.jsonl", "plain", "One short sentence.")]
    dofn = documents.CleanAndTokenize(SOURCES, str(bert_vocab), 0, (spec,))
    dofn.setup()
    tags = [tag for item in raw for _, (tag, _) in dofn.process(item)]
    assert tags == ["doc", "rejected"]  # the other source keeps sources' min_document_chars and sentences
