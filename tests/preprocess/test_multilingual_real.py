"""Multilingual BERT data end to end on real dumps: the shared English Wikipedia slice and the real Bulgarian one that
the gensim wheel ships (``gensim/test/test_data/``, found in the installed package at test time, never committed).

The Bulgarian dump is small: one main-namespace article (81 sentences, ~4.8 k tokens) beside 106 English ones
(~780 k tokens), so p_bg = 0.006, far from its smoothed share (0.027 at alpha 0.7, 0.072 at alpha 0.5)."""
from __future__ import annotations

import collections
import importlib.util
import pathlib

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from common import preprocess_config as config
from common.preprocess_config import MultilingualConfig, SourceConfig
from common.tokenizer import load_tokenizer
from preprocess import languages, text, vocab
from preprocess.readers import wikipedia
from preprocess.executors import pipeline
from tests.conftest import require
from tests.preprocess.conftest import read_manifest, run_cli, shard_hashes

CONFIG = "configs/preprocess/mbert_seq128.yaml"
BG_DUMP = "test/test_data/bgwiki-latest-pages-articles-shortened.xml.bz2"
# Packed single-document rows: every token of a row is its document's, so the rows' token shares by language are
# exact (pairs draw their random next segment from any document of the corpus, which dilutes the mix: docs/variants).
DOC_ROWS = ["instances.kind=doc_sentences", "instances.sentence_objective=none", "instances.masking=dynamic",
            "instances.short_seq_prob=0", "output.provenance=true"]
# The copies of a document are dupe_factor x rate rounded up or down, so a language's tokens in the rows miss
# q_i x total by at most one copy of each of its documents: Bulgarian's one article has 22.6 copies expected at alpha
# 0.7 (at most 4.4 % off), 62 at 0.5; English's 106 articles round independently (well under 1 %). Hence 6 %.
RELATIVE_TOLERANCE = 0.06


@pytest.fixture(scope="module")
def bg_dump() -> pathlib.Path:
    spec = importlib.util.find_spec("gensim")  # located, not imported
    root = pathlib.Path(spec.submodule_search_locations[0]) if spec else pathlib.Path("gensim-not-installed")
    return require(root / BG_DUMP, "the Bulgarian Wikipedia dump of the gensim wheel (pip install gensim: dev extra)")


@pytest.fixture(scope="module")
def dumps(real_wiki, bg_dump) -> list[str]:
    return [str(real_wiki), str(bg_dump)]


@pytest.fixture(scope="module")
def tokenizer(dumps, tmp_path_factory) -> pathlib.Path:
    """A cased SentencePiece vocabulary trained on the two dumps mixed as the rows are (alpha 0.7)."""
    out = tmp_path_factory.mktemp("mbert") / "tokenizer"
    cfg = config.load(CONFIG)
    sample, mix = vocab.sample_sentences_by_language([("wiki", d) for d in dumps], cfg.sources, cfg.multilingual,
                                                     100_000, seed=12345)
    assert mix["bg"]["sampled"] > 4 * mix["bg"]["sentences"]  # its 81 sentences repeated up to its share
    vocab.train_sentencepiece(sample, 4000, str(out))
    return out


def _language(doc_id: str) -> str:
    return wikipedia.dump_language(languages.document_group(doc_id).split(":", 1)[1])


def _tokens_by_language(dataset: pathlib.Path) -> collections.Counter:
    """Each language's tokens in the rows (one document per row: all but [CLS] and [SEP] are its)."""
    counts = collections.Counter()
    for shard in read_manifest(dataset)["shards"]:
        table = ipc.open_file(pa.memory_map(str(dataset / shard["name"]))).read_all()
        lengths = pa.compute.list_value_length(table.column("input_ids")).to_pylist()
        for doc_id, length in zip(table.column("doc_a").to_pylist(), lengths):
            counts[_language(doc_id)] += length - 2
    return counts


@pytest.mark.parametrize("alpha", [0.7, 0.5, 1.0])
def test_the_rows_mix_languages_as_alpha_says(dumps, tokenizer, tmp_path, alpha):
    out = tmp_path / "dataset"
    cfg = config.load(CONFIG, DOC_ROWS + [f"multilingual.alpha={alpha}"])
    manifest = pipeline.run(cfg, wikipedia=dumps, books=[], tokenizer=str(tokenizer), output=str(out), progress=False)
    mix = manifest["languages"]
    assert sorted(mix) == ["bg", "en"] and mix["bg"]["documents"] == 1 and mix["en"]["documents"] == 106
    # Expected: q_i = p_i^alpha / sum_j p_j^alpha from the manifest's token counts, computed here from scratch.
    p = {k: v["tokens"] / sum(e["tokens"] for e in mix.values()) for k, v in mix.items()}
    q = {k: p[k] ** alpha / sum(v ** alpha for v in p.values()) for k in p}
    measured = _tokens_by_language(out)
    shares = {k: measured[k] / sum(measured.values()) for k in measured}
    for language in mix:
        assert mix[language]["sampled_share"] == pytest.approx(q[language], abs=1e-8)
        assert mix[language]["instance_tokens"] == measured[language]  # the manifest counts what the rows hold
        assert shares[language] == pytest.approx(q[language], rel=RELATIVE_TOLERANCE), (alpha, shares, q, p)
    if alpha < 1:  # the check has power: the unsmoothed mix would fail it
        assert abs(p["bg"] - q["bg"]) > 3 * RELATIVE_TOLERANCE * q["bg"]
    # The corpus's total is kept (in expectation): the rows hold about dupe_factor x the corpus's tokens.
    assert sum(measured.values()) == pytest.approx(cfg.instances.dupe_factor * sum(e["tokens"] for e in mix.values()),
                                                   rel=0.02)


def test_both_scripts_tokenize_without_unknowns(bg_dump, real_wiki, tokenizer, tmp_path):
    tok = load_tokenizer(str(tokenizer))
    sources = SourceConfig()

    def sentences(dump):
        docs = (text.to_document(record, sources) for record in wikipedia.iter_wikipedia(str(dump), sources)
                if hasattr(record, "text"))
        return [s for d in docs for s in getattr(d, "sentences", ())]

    def rates(tokenizer, texts):
        ids = [i for row in tokenizer.encode_batch(texts) for i in row]
        unknown = sum(i == tokenizer.unk_id for i in ids) / len(ids)
        fallback = sum(tokenizer.id_to_token(i).startswith("<0x") for i in ids) / len(ids)
        return unknown, fallback, sum(map(len, texts)) / len(ids)

    bulgarian, english = sentences(bg_dump), sentences(real_wiki)[:2000]
    assert sum(any("\u0400" <= c <= "\u04ff" for c in s) for s in bulgarian) > 0.9 * len(bulgarian)  # Cyrillic
    for texts in (bulgarian, english):
        unknown, fallback, chars_per_token = rates(tok, texts)
        assert unknown < 0.001 and fallback < 0.01 and chars_per_token > 1.4, (unknown, fallback, chars_per_token)
    # The smoothing matters: a vocabulary of the same size trained on the plain sample (p, not q) cuts Bulgarian
    # into shorter pieces (measured 1.27 against 1.55 characters a token).
    plain = vocab.train_sentencepiece(vocab.sample_sentences([("wiki", str(real_wiki)), ("wiki", str(bg_dump))],
                                                             sources, 100_000, 12345), 4000, str(tmp_path / "plain"))
    assert rates(plain, bulgarian)[2] < 0.9 * rates(tok, bulgarian)[2]


@pytest.fixture(scope="module")
def pairs_dataset(dumps, tokenizer, tmp_path_factory) -> pathlib.Path:
    """The shipped mBERT config (BERT's NSP pairs, alpha 0.7), one in-process run."""
    out = tmp_path_factory.mktemp("mbert-pairs") / "dataset"
    cfg = config.load(CONFIG, ["output.num_shards=3", "output.provenance=true"])
    pipeline.run(cfg, wikipedia=dumps, books=[], tokenizer=str(tokenizer), output=str(out), progress=False)
    return out


def test_the_mix_is_identical_across_workers_and_parts(pairs_dataset, dumps, tokenizer, tmp_path):
    reference = read_manifest(pairs_dataset)
    rows = collections.Counter()
    for shard in reference["shards"]:
        table = ipc.open_file(pa.memory_map(str(pairs_dataset / shard["name"]))).read_all()
        rows.update(map(_language, table.column("doc_a").to_pylist()))
    assert {k: v["rows"] for k, v in reference["languages"].items()} == dict(rows)  # rows by their A's language
    common = ["run", "--config", CONFIG, "--wikipedia", *dumps, "--tokenizer", tokenizer, "--provenance",
              "--set", "output.num_shards=3"]
    for name, extra in {"two-processes": ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
                        "three-parts": ["--parts", "3"]}.items():
        run_cli(*common, "--output", tmp_path / name, *extra)
        assert shard_hashes(tmp_path / name) == shard_hashes(pairs_dataset), name
        assert read_manifest(tmp_path / name)["languages"] == reference["languages"], name


def test_a_tiny_bert_trains_on_the_multilingual_pairs(pairs_dataset, tmp_path):
    import json

    from tests.pretrain.launching import launch, settings

    out = tmp_path / "run"
    proc = launch("python", 1, settings(pairs_dataset, out, steps=12, **{"train.precision": "fp32",
                                                                          "optimizer.lr": 2e-3,
                                                                          "checkpoint.every_steps": 0}), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 12 and records[-1]["mlm_loss"] < records[0]["mlm_loss"] - 0.5, records


def test_a_book_without_a_language_is_refused_in_one_line(real_wiki, tokenizer, tmp_path):
    book = tmp_path / "emma.txt"
    book.write_text("Emma Woodhouse, handsome, clever, and rich, had lived nearly twenty-one years. " * 20)
    proc = run_cli("run", "--config", CONFIG, "--wikipedia", real_wiki, "--books", book, "--tokenizer", tokenizer,
                   "--output", tmp_path / "out", check=False)
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert f"{book}: a book input of a multilingual run needs a language" in proc.stderr
    assert "multilingual.languages" in proc.stderr and "Traceback" not in proc.stderr


def test_a_dump_naming_no_language_is_refused_in_one_line(tokenizer, tmp_path):
    prose = "The river rises in the northern hills. It flows south through three towns and past many farms. " * 4
    dump = tmp_path / "nodb.xml"
    dump.write_text("<mediawiki>" + "".join(f"<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>{prose}"
                                            "</text></revision></page>" for i in range(3)) + "</mediawiki>")
    proc = run_cli("run", "--config", CONFIG, "--wikipedia", dump, "--tokenizer", tokenizer,
                   "--output", tmp_path / "out", check=False)
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert "nodb.xml: no language for this input" in proc.stderr and "multilingual.languages" in proc.stderr
    assert "Traceback" not in proc.stderr
    # Set in the config, it is used.
    proc = run_cli("run", "--config", CONFIG, "--wikipedia", dump, "--tokenizer", tokenizer, "--output",
                   tmp_path / "named", "--set", "multilingual.languages={'nodb.*': en}")
    assert list(read_manifest(tmp_path / "named")["languages"]) == ["en"]


def test_alpha_one_reproduces_the_monolingual_dataset_and_monolingual_runs_have_no_languages(dumps, tokenizer,
                                                                                             tmp_path):
    made = {}
    for name, overrides in {"mono": ["multilingual.enabled=false"], "alpha1": ["multilingual.alpha=1.0"]}.items():
        made[name] = pipeline.run(config.load(CONFIG, overrides), wikipedia=dumps, books=[], tokenizer=str(tokenizer),
                                  output=str(tmp_path / name), progress=False)
    assert "languages" not in made["mono"] and MultilingualConfig().enabled is False
    # alpha 1: every rate is 1, every document keeps dupe_factor copies: the very rows of the monolingual run.
    assert {e["rate"] for e in made["alpha1"]["languages"].values()} == {1.0}
    assert shard_hashes(tmp_path / "alpha1") == shard_hashes(tmp_path / "mono")
