"""Synthetic datasets: the real shard format and manifest, valid instances, the same bytes on any worker count."""
import hashlib
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from common import schema
from preprocess.synthetic import SyntheticSpec, main, write_synthetic


def _table(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    return manifest, pa.concat_tables(ipc.open_file(pa.memory_map(str(dataset / s["name"]))).read_all()
                                      for s in manifest["shards"])


def test_instances_are_well_formed_bert_rows(tmp_path, bert_vocab):
    spec = SyntheticSpec(rows=20_000, max_seq_length=128, max_predictions=20, rows_per_shard=8_000, seed=4)
    write_synthetic(spec, str(bert_vocab), tmp_path / "data")
    manifest, table = _table(tmp_path / "data")
    special = manifest["tokenizer"]["special_ids"]
    assert manifest["format_version"] == schema.FORMAT_VERSION and manifest["rows"] == table.num_rows == 20_000
    assert [s["rows"] for s in manifest["shards"]] == [6_666, 6_667, 6_667]
    for entry in manifest["shards"]:
        assert hashlib.sha256((tmp_path / "data" / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
    assert table.schema.equals(schema.instance_schema(30522, provenance=False), check_metadata=False)
    lengths = np.asarray([len(r) for r in table.column("input_ids").to_pylist()])
    assert lengths.max() <= 128 and 0.05 < (lengths < 100).mean() < 0.15 and np.median(lengths) >= 120
    assert manifest["tokens"] == lengths.sum()
    masks = 0
    for row in table.slice(0, 3000).to_pylist():
        ids, a, positions = row["input_ids"], row["segment_a_len"], row["masked_positions"]
        assert ids[0] == special["[CLS]"] and ids[a - 1] == ids[-1] == special["[SEP]"] and 3 <= a <= len(ids) - 2
        assert positions == sorted(set(positions)) and 1 <= len(positions) <= 20
        assert not {0, a - 1, len(ids) - 1} & set(positions)
        masks += sum(ids[p] == special["[MASK]"] for p in positions)
        assert min(row["masked_labels"]) > max(special.values())  # never a special token
    total = sum(len(p) for p in table.slice(0, 3000).column("masked_positions").to_pylist())
    assert 0.75 < masks / total < 0.85
    assert 0.45 < np.mean(table.column("next_sentence_label").to_numpy()) < 0.55


def test_the_same_bytes_with_any_number_of_workers(tmp_path, bert_vocab):
    spec = SyntheticSpec(rows=9_000, max_seq_length=64, max_predictions=10, rows_per_shard=3_000)
    one = write_synthetic(spec, str(bert_vocab), tmp_path / "one", workers=1)
    two = write_synthetic(spec, str(bert_vocab), tmp_path / "two", workers=2)
    assert [s["sha256"] for s in one["shards"]] == [s["sha256"] for s in two["shards"]]
    other = write_synthetic(SyntheticSpec(rows=9_000, max_seq_length=64, max_predictions=10, rows_per_shard=3_000,
                                          seed=1), str(bert_vocab), tmp_path / "other")
    assert other["shards"][0]["sha256"] != one["shards"][0]["sha256"]


def test_refuses_an_existing_output_and_a_disk_without_room(tmp_path, bert_vocab, monkeypatch, capsys):
    (tmp_path / "taken").mkdir()
    assert main(["--rows", "10", "--tokenizer", str(bert_vocab), "--output", str(tmp_path / "taken")]) == 2
    assert "taken exists" in capsys.readouterr().err
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 10**6, 10**6))
    assert main(["--rows", "100000000", "--tokenizer", str(bert_vocab), "--output", str(tmp_path / "big")]) == 2
    assert "100,000,000 rows need up to" in capsys.readouterr().err
    assert not (tmp_path / "big").exists() and not (tmp_path / "big.incomplete").exists()
