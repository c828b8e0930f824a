"""Exact duplicates removed (``dedup.exact``, preprocess.dedup): a corpus of three sources with planted copies, of
one source's texts in another and of a line within one, and a near copy that must stay. The count removed, the
copy kept (the first by stable key), no distinct document lost, and the same shards on Beam's runner, in two
parts and on the local pool of two processes."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from common import preprocess_config as config_module
from common.hashing import document_hash
from preprocess import dedup
from preprocess.executors import pipeline
from tests.preprocess.conftest import REPO_ROOT, SAMPLES, shard_hashes

CROSS = 5  # web texts repeated in the notes


def _paragraphs() -> list[str]:
    text = "\n".join(path.read_text() for path in sorted((SAMPLES / "books").glob("*.txt")))
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    return sorted({p for p in paragraphs if len(p) > 300 and p.count(". ") >= 2})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("dedup")
    paragraphs = _paragraphs()
    web, own = paragraphs[:30], paragraphs[30:50]
    (root / "web.jsonl").write_text("".join(json.dumps({"url": f"u{i}", "text": t}) + "\n" for i, t in enumerate(web)))
    near = web[7].replace(" the ", " a ", 1)  # one word changed: not an exact copy
    assert near != web[7]
    notes = own + web[:CROSS] + [own[3], near]  # copies of 5 web texts, one note twice
    (root / "notes.txt").write_text("".join(line + "\n" for line in notes))
    offsets, at = [], 0
    for line in notes:
        offsets.append(at)
        at += len((line + "\n").encode())
    ids = {f"web:u{i}": t for i, t in enumerate(web)}
    ids.update({f"notes:notes.txt:{offset}": t for offset, t in zip(offsets, notes)})
    config = root / "dedup.yaml"
    config.write_text((REPO_ROOT / "configs/preprocess/tiny.yaml").read_text() + (
        "inputs:\n"
        f"  - {{name: web, format: jsonl, paths: ['{root / 'web.jsonl'}'], id_field: url}}\n"
        f"  - {{name: notes, format: text, paths: ['{root / 'notes.txt'}']}}\n"))
    return {"root": root, "config": config, "texts": ids, "near": near}


def _run(corpus, bert_vocab, name, overrides=("dedup.exact=true",), beam_args=()):
    cfg = config_module.load(corpus["config"], [*overrides, "output.provenance=true"])
    out = corpus["root"] / name
    manifest = pipeline.run(cfg, wikipedia=[], books=[], tokenizer=str(bert_vocab), output=str(out),
                            beam_args=list(beam_args), progress=False)
    return out, manifest


@pytest.fixture(scope="module")
def deduplicated(corpus, bert_vocab):
    return _run(corpus, bert_vocab, "beam")


def _ids(dataset, manifest) -> set[str]:
    tables = [ipc.open_file(pa.memory_map(str(dataset / e["name"]))).read_all() for e in manifest["shards"]]
    return {d for t in tables for name in ("doc_a", "doc_b") for d in t.column(name).to_pylist() if d}


def test_exact_copies_across_and_within_sources_are_removed_keeping_the_first_by_stable_key(corpus, deduplicated):
    out, manifest = deduplicated
    texts = corpus["texts"]
    by_text: dict[str, list[str]] = {}
    for doc_id, text in texts.items():
        by_text.setdefault(text, []).append(doc_id)
    kept = {min(ids, key=lambda d: (document_hash(d), d)) for ids in by_text.values()}
    assert len(texts) - len(kept) == CROSS + 1
    documents = manifest["statistics"]["documents"]
    assert documents["skipped"]["exact_duplicate"] == CROSS + 1 and documents["used"] == len(kept)
    per_source = {name: entry["skipped"].get("exact_duplicate", 0) for name, entry in documents["sources"].items()}
    expected = {"web": 0, "notes": 0}
    for doc_id in set(texts) - kept:
        expected[doc_id.split(":")[0]] += 1
    assert per_source == expected
    assert sum(entry["documents"] for entry in documents["sources"].values()) == len(kept)
    trained = _ids(out, manifest)
    assert trained == kept  # every distinct text once, the near copy among them, no dropped copy
    assert any(texts[d] == corpus["near"] for d in trained)
    assert manifest["statistics"]["corpus"]["tokens"] == manifest["summary"]["corpus_tokens"]


def test_the_same_shards_on_the_local_pool_and_in_parts_and_none_removed_without_the_option(corpus, deduplicated, bert_vocab):
    out, manifest = deduplicated
    pooled, pooled_manifest = _run(corpus, bert_vocab, "pool", beam_args=[
        "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"])
    parts, parts_manifest = _run(corpus, bert_vocab, "parts", overrides=("dedup.exact=true", "parts=2"))
    for other, other_manifest in ((pooled, pooled_manifest), (parts, parts_manifest)):
        assert shard_hashes(other) == shard_hashes(out)
        assert other_manifest["statistics"]["documents"] == manifest["statistics"]["documents"]
    plain, plain_manifest = _run(corpus, bert_vocab, "plain", overrides=())
    assert "exact_duplicate" not in plain_manifest["statistics"]["documents"]["skipped"]
    assert plain_manifest["statistics"]["documents"]["used"] == len(corpus["texts"])
    assert plain_manifest["statistics"]["corpus"]["tokens"] > manifest["statistics"]["corpus"]["tokens"]


def test_many_ranges_of_text_hashes_find_the_same_copies_as_one(corpus, deduplicated, bert_vocab, monkeypatch):
    """With ranges of about 4 documents (16 of them here) each repeat is still found beside its first copy."""
    assert dedup.partition_bits(0) == 0 and dedup.partition_bits(dedup.ROWS_PER_PARTITION * 3) == 2
    monkeypatch.setattr(dedup, "ROWS_PER_PARTITION", 4)
    out, manifest = deduplicated
    ranged, ranged_manifest = _run(corpus, bert_vocab, "ranged")  # in this process: Beam's runner, patched
    assert dedup.partition_bits(len(corpus["texts"])) == 4
    assert shard_hashes(ranged) == shard_hashes(out)
    assert ranged_manifest["statistics"]["documents"] == manifest["statistics"]["documents"]
