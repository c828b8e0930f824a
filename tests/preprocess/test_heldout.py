"""The held-out split end to end on the bundled samples (with a planted copy of a book): the two splits share no
document text, the same documents and shards come out whatever the workers and parts, the evaluation rows carry
their masks also for a dynamic recipe, the manifest describes them and ``verify`` checks them, datasets without a
split still read, and a share that leaves no training documents is refused in one line."""
from __future__ import annotations

import json
import logging
import pathlib
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from common import preprocess_config as config_module
from common.errors import DatasetFormatError
from common.verify import verify_dataset
from preprocess import text
from preprocess.readers import books, wikipedia
from preprocess.executors import pipeline
from preprocess.records import Rejected
from pretrain.data import ShardedInstances, collate, open_evaluation, read_rows
from tests.preprocess.conftest import SAMPLES, read_manifest, run_cli

CONFIG = "configs/preprocess/tiny.yaml"
SPLIT = ["heldout.books.documents=3", "heldout.wikipedia.share=0.25"]
PLANTED = "the-voyage-of-the-marigold.txt"  # copied under another name: the same texts under other ids


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(wikipedia, books) inputs: the samples, and a copy of one sample book in a directory of its own."""
    planted = tmp_path_factory.mktemp("planted")
    shutil.copy(SAMPLES / "books" / PLANTED, planted / f"copy-of-{PLANTED}")
    return [str(SAMPLES / "wikipedia")], [str(SAMPLES / "books"), str(planted)]


def _run(out, bert_vocab, inputs, overrides, provenance=False):
    cfg = config_module.load(CONFIG, overrides + (["output.provenance=true"] if provenance else []))
    return pipeline.run(cfg, wikipedia=inputs[0], books=inputs[1], tokenizer=str(bert_vocab), output=str(out),
                        progress=False)


@pytest.fixture(scope="module")
def split_run(bert_vocab, inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("heldout") / "split"
    _run(out, bert_vocab, inputs, SPLIT, provenance=True)
    return out


def _table(dataset, entries) -> pa.Table:
    return pa.concat_tables(ipc.open_file(pa.memory_map(str(dataset / e["name"]))).read_all() for e in entries)


def _document_texts(inputs) -> dict[str, str]:
    """Every usable document's cleaned text by id, read as the documents stage reads it."""
    cfg = config_module.load(CONFIG).sources
    raws = [raw for uri in inputs[0] for path in sorted(pathlib.Path(uri).iterdir())
            for raw in wikipedia.iter_wikipedia(str(path), cfg)]
    raws += [raw for uri in inputs[1] for path in sorted(pathlib.Path(uri).iterdir())
             for raw in books.iter_book(str(path), cfg)]
    docs = [text.to_document(raw, cfg) for raw in raws if not isinstance(raw, Rejected)]
    return {doc.doc_id: " ".join(doc.sentences) for doc in docs if not isinstance(doc, Rejected)}


def test_splits_share_no_document_text(split_run, inputs):
    manifest = read_manifest(split_run)
    train = _table(split_run, manifest["shards"])
    held = _table(split_run, manifest["evaluation"]["shards"])
    texts = _document_texts(inputs)
    train_ids = set(train.column("doc_a").to_pylist()) | set(train.column("doc_b").to_pylist())
    held_ids = set(held.column("doc_a").to_pylist()) | set(held.column("doc_b").to_pylist())
    assert not train_ids & held_ids
    assert not {texts[d] for d in train_ids} & {texts[d] for d in held_ids}, "a held-out text is in training"
    # The planted copy made text duplicates of a held-out book document: dropped from training, and counted.
    twins = {d for d in texts if texts[d] in {texts[h] for h in held_ids}} - held_ids
    assert twins and not twins & train_ids
    evaluation = manifest["evaluation"]
    assert evaluation["text_duplicates_dropped"] == len(twins)
    assert evaluation["documents"] == len(held_ids) and evaluation["sources"]["books"] == 3
    assert manifest["statistics"]["documents"]["heldout"] == len(held_ids)
    assert manifest["statistics"]["documents"]["used"] == len(texts) - len(held_ids) - len(twins)


def test_manifest_describes_the_evaluation_shards(split_run):
    manifest = read_manifest(split_run)
    evaluation = manifest["evaluation"]
    held = _table(split_run, evaluation["shards"])
    assert evaluation["rows"] == held.num_rows == sum(e["rows"] for e in evaluation["shards"]) > 0
    assert all(e["name"].startswith("eval/") and len(e["sha256"]) == 64 for e in evaluation["shards"])
    lengths = np.diff(held.column("input_ids").combine_chunks().offsets.to_numpy())
    assert evaluation["tokens"] == int(lengths.sum())
    assert evaluation["selection"] == {"seed": 12345, "books": {"documents": 3}, "wikipedia": {"share": 0.25}}
    assert manifest["rows"] == sum(e["rows"] for e in manifest["shards"])  # the training totals, as before
    assert "verified" in verify_dataset(split_run) and "evaluation rows" in verify_dataset(split_run)


def test_same_split_for_any_workers_and_parts(split_run, bert_vocab, inputs, tmp_path):
    reference = read_manifest(split_run)
    sets = [a for o in SPLIT + ["output.provenance=true"] for a in ("--set", o)]
    for name, extra in {"two-processes": ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
                        "two-parts": ["--parts", "2"]}.items():
        run_cli("run", "--config", CONFIG, "--wikipedia", *inputs[0], "--books", *inputs[1], "--tokenizer",
                bert_vocab, "--output", tmp_path / name, *sets, *extra)
        manifest = read_manifest(tmp_path / name)
        for key in ("shards",):
            assert [e["sha256"] for e in manifest[key]] == [e["sha256"] for e in reference[key]], name
        assert [e["sha256"] for e in manifest["evaluation"]["shards"]] == \
            [e["sha256"] for e in reference["evaluation"]["shards"]], f"{name}: other evaluation shards"


def test_dynamic_recipe_stores_the_evaluation_masks(bert_vocab, inputs, tmp_path):
    out = tmp_path / "dynamic"
    _run(out, bert_vocab, inputs, SPLIT + ["instances.masking=dynamic"])
    manifest = read_manifest(out)
    train, held = _table(out, manifest["shards"]), _table(out, manifest["evaluation"]["shards"])
    assert train.column("masked_positions").combine_chunks().flatten().to_numpy().size == 0
    assert manifest["evaluation"]["masking"] == "static" and manifest["objective"]["masking"] == "dynamic"
    evaluation = open_evaluation(out)
    block = read_rows(evaluation, np.arange(len(evaluation)))
    assert len(evaluation) == held.num_rows and evaluation.manifest.objective.masking == "static"
    assert (block.counts > 0).all() and len(block.labels) == block.counts.sum()
    batch = collate(evaluation, np.arange(4))  # a micro-batch as the training loader makes them
    assert batch["input_ids"].shape[0] == 4 and len(batch["masked_labels"]) == block.counts[:4].sum()


def test_verify_catches_an_altered_evaluation_shard(split_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(split_run, copy)
    shard = copy / read_manifest(copy)["evaluation"]["shards"][0]["name"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetFormatError, match="eval/shard-00000"):
        verify_dataset(copy)
    shard.unlink()
    with pytest.raises(DatasetFormatError, match="missing"):
        verify_dataset(copy)


def test_datasets_without_a_split_still_read(split_run, tmp_path, caplog):
    old = tmp_path / "old"
    shutil.copytree(split_run, old, ignore=shutil.ignore_patterns("eval"))
    manifest = read_manifest(old)
    del manifest["evaluation"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert "evaluation" not in verify_dataset(old)
    assert len(ShardedInstances(old)) == manifest["rows"]
    with caplog.at_level(logging.INFO, logger="pretrain"):
        assert open_evaluation(old) is None and open_evaluation(old) is None
    said = [r.getMessage() for r in caplog.records if "evaluation off" in r.getMessage()]
    assert said == [f"no evaluation split in {old}: evaluation off"]
    with pytest.raises(DatasetFormatError, match="no evaluation split"):
        ShardedInstances(old, evaluation=True)


def test_a_share_that_leaves_no_training_documents_is_refused(bert_vocab, tmp_path):
    proc = run_cli("run", "--config", CONFIG, "--wikipedia", SAMPLES / "wikipedia", "--tokenizer", bert_vocab,
                   "--output", tmp_path / "out", "--set", "heldout.wikipedia.share=1", check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "heldout.wikipedia.share" in lines[0] and "below 1" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()
