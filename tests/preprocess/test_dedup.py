"""Duplicates removed (``dedup.exact``, ``dedup.near_threshold``; preprocess.dedup): a corpus of two sources with
planted copies, of one source's texts in another and of a line within one, and near copies one word apart, which
exact removal keeps and near removal takes. The count removed, the copy kept (the first by stable key), no distinct
document lost, and the same shards on Beam's runner, in two
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
    # Near copies, one word changed (not exact copies): of web texts 7, 9, 11 and of note 5.
    near = {f"web:u{i}": web[i].replace(" the ", " a ", 1) for i in (7, 9, 11)}
    near["note 5"] = own[5].replace(" and ", " or ", 1)
    assert all(copy not in web + own for copy in near.values())
    notes = own + web[:CROSS] + [own[3]] + list(near.values())  # copies of 5 web texts, one note twice
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
    originals = {**{key: key for key in near if key.startswith("web:")},
                 "note 5": f"notes:notes.txt:{offsets[5]}"}
    copies = {originals[key]: f"notes:notes.txt:{offsets[notes.index(copy)]}" for key, copy in near.items()}
    return {"root": root, "config": config, "texts": ids, "near": near, "near_pairs": copies}


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
    assert all(any(texts[d] == copy for d in trained) for copy in corpus["near"].values())
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


def test_near_copies_are_removed_keeping_the_first_by_stable_key_on_beam_and_the_pool(corpus, deduplicated,
                                                                                      bert_vocab):
    """MinHash LSH at 0.7: each one-word-changed copy (Jaccard of 5-word shingles near 0.9) loses to the first of its
    pair by stable key; nothing else goes beyond the exact copies."""
    exact_out, exact_manifest = deduplicated
    exact_kept = _ids(exact_out, exact_manifest)
    later = {max(pair, key=lambda d: (document_hash(d), d)) for pair in corpus["near_pairs"].items()}
    overrides = ("dedup.exact=true", "dedup.near_threshold=0.7")
    out, manifest = _run(corpus, bert_vocab, "near", overrides=overrides)
    documents = manifest["statistics"]["documents"]
    assert documents["skipped"]["exact_duplicate"] == CROSS + 1
    assert documents["skipped"]["near_duplicate"] == len(later) == 4
    assert _ids(out, manifest) == exact_kept - later
    per_source = sum(entry["skipped"].get("near_duplicate", 0) for entry in documents["sources"].values())
    assert per_source == 4
    pooled, pooled_manifest = _run(corpus, bert_vocab, "near-pool", overrides=overrides, beam_args=[
        "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"])
    assert shard_hashes(pooled) == shard_hashes(out)
    assert pooled_manifest["statistics"]["documents"] == documents


def test_the_near_threshold_is_checked():
    for value in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"dedup\.near_threshold must be in \(0, 1\]"):
            config_module.DedupConfig(near_threshold=value)
    with pytest.raises(ValueError, match=r"dedup\.num_perm must be in \[16, 1024\]"):
        config_module.DedupConfig(num_perm=4)
