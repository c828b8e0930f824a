"""Bring your own corpus, end to end: a JSON lines + Parquet mixture (the config's ``inputs:``) through
``python -m preprocess run``: its dead letters counted per source, a dataset that ``preprocess verify`` accepts, and the
same shards for 1 and 2 workers."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from common import preprocess_config as config_module
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess import vocab
from preprocess.executors import local, part_budget, pipeline
from preprocess.executors.plan import resolve_inputs
from preprocess.readers import key_of
from tests.preprocess.conftest import REPO_ROOT, SAMPLES, read_manifest, run_cli, shard_hashes


def _paragraphs() -> list[str]:
    """Prose paragraphs of the bundled sample books, as documents of the mixture."""
    text = "\n".join(path.read_text() for path in sorted((SAMPLES / "books").glob("*.txt")))
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    return [p for p in paragraphs if len(p) > 300 and p.count(". ") >= 2]


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    paragraphs = _paragraphs()
    half = len(paragraphs) // 2
    crawl = root / "crawl"
    crawl.mkdir()
    lines = [json.dumps({"url": f"https://example.org/{i}", "text": p}) for i, p in enumerate(paragraphs[:half])]
    lines[3:3] = ["{this is not json", json.dumps({"url": "https://example.org/none"}),
                  json.dumps({"url": "https://example.org/0", "text": paragraphs[half]})]  # the id of line 0 again
    (crawl / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    table = pa.table({"text": paragraphs[half:] + [None], "lang": ["en"] * (len(paragraphs) - half + 1)})
    pq.write_table(table, root / "essays.parquet", row_group_size=4)
    config = root / "mixture.yaml"
    config.write_text((REPO_ROOT / "configs/preprocess/tiny.yaml").read_text() + (
        "inputs:\n"
        f"  - {{name: web, format: jsonl, paths: ['{crawl}'], id_field: url}}\n"
        f"  - {{name: essays, format: parquet, paths: ['{root / 'essays.parquet'}'], min_chars: 100}}\n"))
    return {"root": root, "config": config, "documents": len(paragraphs)}


@pytest.fixture(scope="module")
def one_worker(mixture, bert_vocab):
    out = mixture["root"] / "one"
    run_cli("run", "--config", mixture["config"], "--tokenizer", bert_vocab, "--output", out)
    return out


def test_a_jsonl_and_parquet_mixture_builds_a_dataset_that_verify_accepts(one_worker, mixture):
    manifest = read_manifest(one_worker)
    docs = manifest["statistics"]["documents"]
    assert docs["failed"] == {"not_json": 1, "missing_text_field": 1, "duplicate_id": 1, "null_text": 1}
    assert docs["used"] == mixture["documents"] and manifest["rows"] > 50
    assert docs["sources"]["web"]["failed"] == {"not_json": 1, "missing_text_field": 1, "duplicate_id": 1}
    assert docs["sources"]["essays"]["failed"] == {"null_text": 1}
    assert sum(entry["documents"] for entry in docs["sources"].values()) == mixture["documents"]
    assert [entry["kind"] for entry in manifest["inputs"]] == ["jsonl:web", "parquet:essays"]
    assert "inputs" in manifest["parameters"] and manifest["parameters"]["inputs"][0]["id_field"] == "url"
    letters = [json.loads(line) for line in (one_worker / "dead_letters.jsonl").read_text().splitlines()]
    by_reason = {letter["reason"]: letter for letter in letters}
    assert set(by_reason) == {"not_json", "missing_text_field", "duplicate_id", "null_text"}
    assert by_reason["not_json"]["detail"].startswith("part-0.jsonl line at byte ")
    assert by_reason["duplicate_id"]["doc_id"] == "web:https://example.org/0"
    assert by_reason["null_text"]["detail"].startswith("essays.parquet row group ")
    assert "verified" in run_cli("verify", one_worker).stdout.lower()


def test_the_same_shards_for_one_and_two_workers_under_a_budget_and_two_parts(one_worker, mixture, bert_vocab):
    cfg = config_module.load(mixture["config"])
    sized = resolve_inputs([], [], tuple(cfg.inputs))
    pieces = [unit[2] for _, unit in local.plan_units(sized, 2, 4, local.exact_pieces(tuple(cfg.inputs)))]
    assert any(piece and piece[0] == "rowgroups" for piece in pieces)  # the two workers share the Parquet file
    out = mixture["root"] / "two"
    budget = part_budget.pool_peak(sized, 2, 2, local.unit_shares(sized, tuple(cfg.inputs)))  # two parts fit
    proc = run_cli("run", "--config", mixture["config"], "--tokenizer", bert_vocab, "--output", out,
                   "--direct_num_workers", "2", "--direct_running_mode", "multi_processing", "--max-memory",
                   str(2 * budget))
    assert ": 2 parts (estimated peak" in proc.stderr and read_manifest(out)["parameters"]["parts"] == 2
    parts = mixture["root"] / "parts"
    run_cli("run", "--config", mixture["config"], "--tokenizer", bert_vocab, "--output", parts, "--parts", "2")
    for other in (out, parts):
        assert shard_hashes(other) == shard_hashes(one_worker)
        assert (other / "dead_letters.jsonl").read_text() == (one_worker / "dead_letters.jsonl").read_text()


def test_a_source_configured_with_the_wrong_text_field_fails_in_one_line(mixture, bert_vocab, tmp_path):
    config = tmp_path / "wrong.yaml"
    config.write_text((REPO_ROOT / "configs/preprocess/tiny.yaml").read_text() + (
        f"inputs:\n  - {{name: web, format: jsonl, paths: ['{mixture['root'] / 'crawl'}'], text_field: body}}\n"))
    proc = run_cli("run", "--config", config, "--tokenizer", bert_vocab, "--output", tmp_path / "out", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "no field 'body'" in lines[0] and "part-0.jsonl" in lines[0] and "url, text" in lines[0]


def test_the_vocabulary_sample_and_the_memory_budget_read_the_new_sources(mixture):
    spec = InputSourceConfig(name="essays", format="parquet", paths=[str(mixture["root"] / "essays.parquet")])
    files = [(key_of(spec), spec.paths[0])]
    sentences = vocab.sample_sentences(files, SourceConfig(), 50, seed=1, inputs=(spec,))
    assert len(sentences) == 50 and all(isinstance(s, str) and s for s in sentences)
    sized = [(key_of(spec), spec.paths[0], 1 << 20), ("jsonl:web", "crawl.jsonl.gz", 1 << 20)]
    assert part_budget.estimated_peak(sized, 1) > part_budget.BASE_PEAK_BYTES + (18 << 20)


@pytest.fixture(scope="module")
def weighted(mixture, bert_vocab):
    """The mixture with web text weighted 3:1 against the essays (about 1:1 in the corpus), on one worker and on two
    workers in two parts."""
    runs = {}
    printed = {}
    for name, options in (("one", []), ("two", ["--parts", "2", "--direct_num_workers", "2",
                                                "--direct_running_mode", "multi_processing"])):
        runs[name] = mixture["root"] / f"weighted-{name}"
        printed[name] = run_cli("run", "--config", mixture["config"], "--tokenizer", bert_vocab, "--output",
                                runs[name], "--set", "mixture.weights={web: 3, essays: 1}", *options).stdout
    return {**runs, "printed": printed["one"]}


def test_weights_give_each_source_its_share_of_the_tokens_for_any_workers_and_parts(weighted, one_worker):
    natural = read_manifest(one_worker)["sources"]
    assert {entry["rate"] for entry in natural.values()} == {1.0}
    assert all(entry["requested_share"] == entry["share"] for entry in natural.values())
    assert sum(entry["rows"] for entry in natural.values()) == read_manifest(one_worker)["rows"]
    sources = read_manifest(weighted["one"])["sources"]
    assert (sources["web"]["requested_share"], sources["essays"]["requested_share"]) == (0.75, 0.25)
    assert sources["web"]["share"] == natural["web"]["share"] and 0.3 < sources["web"]["share"] < 0.7
    assert sources["web"]["rate"] > 1 > sources["essays"]["rate"]
    for name, entry in sources.items():  # the draw rounds each document's copies: near, not exact, on ~40 documents
        assert abs(entry["realised_share"] - entry["requested_share"]) < 0.06, (name, entry)
        assert abs(natural[name]["realised_share"] - natural[name]["share"]) < 0.06, (name, natural[name])
    assert shard_hashes(weighted["two"]) == shard_hashes(weighted["one"]) != shard_hashes(one_worker)
    web = sources["web"]
    assert (f"web {web['share']:.1%} -> 75.0% -> {web['realised_share']:.1%}" in weighted["printed"]
            ), weighted["printed"]


def test_a_weighted_mixture_that_leaves_a_source_without_a_weight_is_refused_before_the_run(mixture, bert_vocab,
                                                                                             tmp_path):
    proc = run_cli("run", "--config", mixture["config"], "--tokenizer", bert_vocab, "--output", tmp_path / "out",
                   "--set", "mixture.weights={web: 1}", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "mixture.weights has no weight for essays" in lines[0] and "mixture.weights.essays" in lines[0]
    assert not (tmp_path / "out").exists()


def test_an_inputs_source_is_held_out_and_its_texts_elsewhere_leave_training(mixture, bert_vocab, tmp_path):
    """heldout.inputs.web holds out 4 web documents; a text source repeating every web text (one per line, other
    ids) loses exactly the copies of those 4 from training, and keeps the rest."""
    web_texts = [json.loads(line)["text"] for line in (mixture["root"] / "crawl" / "part-0.jsonl").read_text()
                 .splitlines() if line.startswith('{"url"') and '"text"' in line]
    web_texts = web_texts[:3] + web_texts[4:]  # less the line whose id repeats (a dead letter: duplicate_id)
    notes = tmp_path / "notes.txt"
    notes.write_text("".join(text + "\n" for text in web_texts))
    offsets = np.cumsum([0] + [len((text + "\n").encode()) for text in web_texts])[:-1]
    config = tmp_path / "split.yaml"
    config.write_text(mixture["config"].read_text() + f"  - {{name: notes, format: text, paths: ['{notes}']}}\n")
    cfg = config_module.load(config, ["heldout.inputs={web: {documents: 4}}", "output.provenance=true"])
    manifest = pipeline.run(cfg, wikipedia=[], books=[], tokenizer=str(bert_vocab), output=str(tmp_path / "out"),
                            progress=False)
    evaluation = manifest["evaluation"]
    assert evaluation["sources"] == {"web": 4} and evaluation["selection"]["web"] == {"documents": 4}
    assert evaluation["text_duplicates_dropped"] == 4
    held = {d for d in _ids(tmp_path / "out", evaluation["shards"])}
    train = _ids(tmp_path / "out", manifest["shards"])
    assert len(held) == 4 and all(d.startswith("web:") for d in held) and not held & train
    urls = [json.loads(line)["url"] for line in (mixture["root"] / "crawl" / "part-0.jsonl").read_text()
            .splitlines() if line.startswith('{"url"') and '"text"' in line]
    urls = urls[:3] + urls[4:]
    twins = {f"notes:notes.txt:{offsets[urls.index(d.split(':', 1)[1])]}" for d in held}
    notes_trained = {d for d in train if d.startswith("notes:")}
    assert not twins & notes_trained and len(notes_trained) == len(web_texts) - 4


def _ids(dataset, entries) -> set[str]:
    tables = [ipc.open_file(pa.memory_map(str(dataset / e["name"]))).read_all() for e in entries]
    return {d for t in tables for name in ("doc_a", "doc_b") for d in t.column(name).to_pylist() if d}


def test_heldout_inputs_must_name_a_source_of_inputs(mixture):
    with pytest.raises(config_module.configlib.ConfigError, match=r"heldout\.inputs names 'news', which is no "):
        config_module.load(mixture["config"], ["heldout.inputs={news: {share: 0.1}}"])
    with pytest.raises(config_module.configlib.ConfigError, match=r"heldout\.inputs\.web\.share is 1\.0"):
        config_module.load(mixture["config"], ["heldout.inputs={web: {share: 1}}"])
    with pytest.raises(config_module.configlib.ConfigError, match=r"heldout\.inputs\.web.*'sharee'"):
        config_module.load(mixture["config"], ["heldout.inputs={web: {sharee: 0.1}}"])  # each entry a typed section
