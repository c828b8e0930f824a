"""Multilingual datasets' pure parts (``preprocess.languages``): each document's language, the exponentially smoothed
mix q_i ∝ p_i^alpha, the per-document copies that realise it, the vocabulary sample's quotas; the documents stage's
counts by language (TestPipeline); the config's checks."""
from __future__ import annotations

import json
import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

TestPipeline.__test__ = False  # a Beam class whose name pytest would otherwise try to collect

from common import preprocess_config, storage
from common.configlib import ConfigError
from common.errors import InputError
from common.preprocess_config import InputSourceConfig, MultilingualConfig, SourceConfig
from preprocess import docstore, languages, readers, vocab
from preprocess.executors.beamrun import beam_options
from preprocess.readers import wikipedia
from preprocess.records import RawDocument, Rejected
from preprocess.stages import documents

ON = MultilingualConfig(enabled=True, alpha=0.7)
PROSE = ("The river rises in the northern hills. It flows south through three towns. "
         "Farmers along its banks grow wheat and barley. In spring the water runs high and fast.")


def test_a_documents_language_comes_from_its_dump_or_from_the_config():
    assert wikipedia.dump_language("bgwiki") == "bg" and wikipedia.dump_language("zh_yuewiki") == "zh_yue"
    assert languages.language_for("wiki:bgwiki:558", "bgwiki-latest.xml.bz2", ON) == "bg"
    cfg = MultilingualConfig(enabled=True, languages={"bgwiki-*": "xx", "*.txt": "en"})
    assert languages.language_for("wiki:bgwiki:558", "bgwiki-latest.xml.bz2", cfg) == "xx"  # the config wins
    assert languages.language_for("book:emma.txt:00003", "emma.txt", cfg) == "en"
    assert languages.document_group("book:emma.txt:00003") == "book:emma.txt"
    # A dump without <dbname> (the reader's placeholder "wiki"), or a book without a pattern: one line, with the fix.
    for doc_id, source in (("wiki:wiki:7", "dump.xml"), ("book:emma.txt:00001", "emma.txt")):
        with pytest.raises(InputError, match=rf"{source}: no language .*multilingual.languages"):
            languages.language_for(doc_id, source, ON)
    with pytest.raises(InputError, match=r"books/emma.txt: a book input .* multilingual.languages"):
        languages.check_inputs([("wiki", "enwiki.xml.bz2", 1), ("book", "books/emma.txt", 1)], ON)
    languages.check_inputs([("book", "books/emma.txt", 1)], cfg)


def test_smoothed_shares_follow_the_formula():
    sizes = {"en": 900.0, "bg": 90.0, "is": 10.0}
    p = {k: v / 1000 for k, v in sizes.items()}
    for alpha in (0.0, 0.5, 0.7, 1.0):
        q = languages.smoothed_shares(sizes, alpha)
        norm = sum(v ** alpha for v in p.values())
        assert q == pytest.approx({k: v ** alpha / norm for k, v in p.items()})
    assert languages.smoothed_shares(sizes, 1.0) == pytest.approx(p)            # alpha 1: the corpus's own mix
    assert languages.smoothed_shares(sizes, 0.0) == pytest.approx({k: 1 / 3 for k in p})  # alpha 0: uniform
    mix = languages.language_mix({k: {"tokens": int(v), "documents": 1, "sentences": 1} for k, v in sizes.items()},
                                 MultilingualConfig(enabled=True, alpha=0.5))
    # The rates keep the corpus's total: sum of p_i x rate_i = sum of q_i = 1; small languages are up-sampled.
    assert sum(e["share"] * e["rate"] for e in mix.values()) == pytest.approx(1.0)
    assert mix["is"]["rate"] > mix["bg"]["rate"] > 1 > mix["en"]["rate"]
    by_sentences = languages.language_mix({"en": {"tokens": 10, "sentences": 1}, "bg": {"tokens": 1, "sentences": 1}},
                                          MultilingualConfig(enabled=True, alpha=0.5, basis="sentences"))
    assert by_sentences["en"]["share"] == by_sentences["bg"]["share"] == 0.5  # XLM's basis: sentences


def test_copies_realise_the_rate_on_average_and_depend_on_the_document_alone():
    doc_ids = [f"wiki:bgwiki:{i}" for i in range(20000)]
    groups = {"wiki:bgwiki": "bg"}
    mix = {"bg": {"rate": 0.37}}
    copies = languages.document_copies(7, doc_ids, groups, mix, dupe_factor=5)
    assert set(copies.tolist()) == {1, 2}                      # 5 x 0.37 = 1.85, rounded down or up
    # The fraction rounded up is 0.85 within 4 binomial standard deviations (sqrt(0.85 x 0.15 / 20000) = 0.0025).
    assert abs(np.mean(copies) - 1.85) < 4 * math.sqrt(0.85 * 0.15 / len(doc_ids))
    # Keyed by (seed, document): the same in any subset or order; another seed draws again.
    assert languages.document_copies(7, doc_ids[::-3], groups, mix, 5).tolist() == copies[::-3].tolist()
    assert languages.document_copies(8, doc_ids, groups, mix, 5).tolist() != copies.tolist()
    assert languages.document_copies(7, doc_ids[:5], groups, {"bg": {"rate": 2.0}}, 5).tolist() == [10] * 5


def test_a_dump_given_two_languages_is_refused():
    assert languages.group_languages({"wiki:enwiki": {"en": 3}}) == {"wiki:enwiki": "en"}
    with pytest.raises(InputError, match=r"wiki:enwiki: the files of one dump .*\(en, xx\)"):
        languages.group_languages({"wiki:enwiki": {"en": 3, "xx": 1}})


def test_the_vocabulary_sample_mixes_languages_as_the_rows_do(tmp_path):
    def dump(name: str, dbname: str, pages: int, sentences: int) -> tuple[str, str]:
        body = " ".join(f"Sentence number {s} of page {{i}} is from {dbname}." for s in range(sentences))
        xml = "".join(f"<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>{body.format(i=i)}</text>"
                      "</revision></page>" for i in range(pages))
        path = tmp_path / name
        path.write_text(f"<mediawiki><siteinfo><dbname>{dbname}</dbname></siteinfo>{xml}</mediawiki>")
        return "wiki", str(path)

    files = [dump("big.xml", "enwiki", 40, 20), dump("small.xml", "iswiki", 2, 10)]  # 800 and 20 sentences
    cfg = MultilingualConfig(enabled=True, alpha=0.5, basis="sentences")
    sample, mix = vocab.sample_sentences_by_language(files, SourceConfig(min_document_chars=20), cfg, 400, seed=3)
    q = languages.smoothed_shares({"en": 800, "is": 20}, 0.5)
    assert {k: v["sentences"] for k, v in mix.items()} == {"en": 800, "is": 20}
    assert {k: v["sampled"] for k, v in mix.items()} == {"en": round(400 * q["en"]), "is": round(400 * q["is"])}
    assert len(sample) == 400 and sum("iswiki" in s for s in sample) == mix["is"]["sampled"]
    # Icelandic's 20 sentences are repeated up to its quota (q = 0.14: 55 of 400), each 2 or 3 times.
    repeats = {s: sample.count(s) for s in sample if "iswiki" in s}
    assert len(repeats) == 20 and set(repeats.values()) <= {2, 3}
    assert vocab.sample_sentences_by_language(files, SourceConfig(min_document_chars=20), cfg, 400, seed=3)[0] == sample


def test_the_documents_stage_counts_by_language(tmp_path, bert_vocab):
    def dump(name, dbname, pages):
        xml = "".join(f"<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>Page {i}. {PROSE}</text>"
                      "</revision></page>" for i in range(1, pages + 1))
        (tmp_path / name).write_text(f"<mediawiki><siteinfo><dbname>{dbname}</dbname></siteinfo>{xml}</mediawiki>")
        return "wiki", str(tmp_path / name)

    work = str(tmp_path / "work")
    sources = SourceConfig(min_document_chars=20, min_document_sentences=2)
    with TestPipeline(options=beam_options([])) as p:
        parts = (p | beam.Create([dump("a.xml", "enwiki", 6), dump("b.xml", "bgwiki", 3)])
                 | documents.BuildDocumentStore(sources, str(bert_vocab), 2, work, 0, 30522, multilingual=ON))
        assert_that(parts, equal_to([0]))
    counts = storage.read_json(docstore.counts_uri(work, 0))
    assert {k: v["documents"] for k, v in counts["languages"].items()} == {"en": 6, "bg": 3}
    assert sum(v["tokens"] for v in counts["languages"].values()) == counts["tokens"]
    assert counts["language_groups"] == {"wiki:enwiki": {"en": 6}, "wiki:bgwiki": {"bg": 3}}


def test_the_config_section_is_checked_and_off_by_default(tmp_path):
    assert preprocess_config.load(None).multilingual.enabled is False
    cfg = preprocess_config.load("configs/preprocess/mbert_seq128.yaml", ["multilingual.alpha=0.5"])
    assert cfg.multilingual.enabled and cfg.multilingual.alpha == 0.5 and cfg.multilingual.basis == "tokens"
    with pytest.raises(ConfigError, match="alpha must be in"):
        preprocess_config.load(None, ["multilingual.alpha=1.5"])
    with pytest.raises(ConfigError, match="basis must be tokens or sentences"):
        preprocess_config.load(None, ["multilingual.basis=bytes"])
    with pytest.raises(ConfigError, match="unknown key 'multilingual.langs'"):
        preprocess_config.load(None, ["multilingual.langs={}"])


def _mixed_language_jsonl(path) -> InputSourceConfig:
    """JSON lines whose records name their language (``lang``): 5 English, 2 German, and 3 bad language values."""
    records = [{"text": f"Page {i}. {PROSE}", "lang": "en"} for i in range(5)]
    records += [{"text": f"Seite {i}. {PROSE}", "lang": "de"} for i in range(2)]
    records += [{"text": PROSE, "lang": None}, {"text": PROSE, "lang": "en:us"}, {"text": PROSE}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return InputSourceConfig(name="web", format="jsonl", paths=[str(path)], language_field="lang")


def test_a_records_language_field_is_its_documents_language(tmp_path, bert_vocab):
    spec = _mixed_language_jsonl(tmp_path / "mixed.jsonl")
    records = list(readers.reader_of(readers.key_of(spec)).read(spec.paths[0], None, spec, SourceConfig(), {}))
    ids = [r.doc_id for r in records if isinstance(r, RawDocument)]
    assert ids[0] == "web@en:mixed.jsonl:0" and ids[5].startswith("web@de:mixed.jsonl:")
    assert [r.reason for r in records if isinstance(r, Rejected)] == ["bad_language"] * 3
    assert {readers.source_of(i) for i in ids} == {"web"} and readers.id_language(ids[5]) == "de"
    assert languages.language_for(ids[5], "mixed.jsonl", ON) == "de"
    assert languages.document_group(ids[5]) == "web@de:mixed.jsonl"
    files = [(readers.key_of(spec), spec.paths[0], 1)]
    languages.check_inputs(files, ON, (spec,))  # no file pattern needed: the records name their languages
    plain = InputSourceConfig(name="web", format="jsonl", paths=spec.paths)
    with pytest.raises(InputError, match="mixed.jsonl: a plain input of a multilingual run needs a language"):
        languages.check_inputs(files, ON, (plain,))
    work = str(tmp_path / "work")
    sources = SourceConfig(min_document_chars=20, min_document_sentences=2)
    with TestPipeline(options=beam_options([])) as p:
        parts = (p | beam.Create([files[0][:2]])
                 | documents.BuildDocumentStore(sources, str(bert_vocab), 2, work, 0, 30522, multilingual=ON,
                                                inputs=(spec,)))
        assert_that(parts, equal_to([0]))
    counts = storage.read_json(docstore.counts_uri(work, 0))
    assert {k: v["documents"] for k, v in counts["languages"].items()} == {"en": 5, "de": 2}
    assert counts["language_groups"] == {"web@en:mixed.jsonl": {"en": 5}, "web@de:mixed.jsonl": {"de": 2}}


def test_a_language_field_that_the_first_record_lacks_fails_at_once(tmp_path):
    path = tmp_path / "crawl.jsonl"
    path.write_text(json.dumps({"text": PROSE, "language": "en"}) + "\n")
    spec = InputSourceConfig(name="web", format="jsonl", paths=[str(path)], language_field="lang")
    with pytest.raises(InputError, match="no field 'lang' .* set inputs 'web' language_field"):
        list(readers.reader_of(readers.key_of(spec)).read(str(path), None, spec, SourceConfig(), {}))
    with pytest.raises(ValueError, match="language_field is empty"):
        InputSourceConfig(name="web", format="jsonl", paths=[str(path)], language_field="")
