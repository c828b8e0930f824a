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


def _original(row):
    """A row's tokens before masking (its labels put back)."""
    ids = list(row["input_ids"])
    for position, label in zip(row["masked_positions"], row["masked_labels"]):
        ids[position] = label
    return ids


@pytest.mark.parametrize("kind", ["full_sentences", "doc_sentences"])
def test_packed_rows_are_documents_in_blocks_with_their_starts(tmp_path, bert_vocab, kind):
    from common.manifest import Manifest

    spec = SyntheticSpec(rows=3_000, max_seq_length=128, rows_per_shard=1_000, kind=kind, masking="dynamic",
                         document_tokens=60, seed=2)
    write_synthetic(spec, str(bert_vocab), tmp_path / "data")
    manifest, table = _table(tmp_path / "data")
    special = manifest["tokenizer"]["special_ids"]
    assert table.schema.equals(schema.instance_schema(30522, provenance=False, packed=True), check_metadata=False)
    read = Manifest.read(tmp_path / "data")
    assert read.objective == spec.objective and read.objective.sentence_objective == "none" and read.objective.packed
    blocks, lengths = [], []
    for row in table.to_pylist():
        ids, starts = row["input_ids"], row["doc_starts"]
        lengths.append(len(ids))
        assert row["segment_a_len"] == len(ids) and row["next_sentence_label"] == 0
        assert row["masked_positions"] == [] and row["masked_labels"] == []  # dynamic: the loader masks
        assert special["[MASK]"] not in ids and ids[0] == special["[CLS]"] and ids[-1] == special["[SEP]"]
        assert starts[0] == 0 and starts == sorted(set(starts))
        assert all(ids[s - 1] == special["[SEP]"] for s in starts[1:])
        assert ids.count(special["[SEP]"]) == len(starts)  # each block ends with its [SEP], nothing else does
        blocks.append(len(starts))
    blocks, lengths = np.asarray(blocks), np.asarray(lengths)
    assert lengths.max() <= 128
    if kind == "full_sentences":  # rows run on across documents and end near the maximum
        assert np.median(lengths) >= 122 and (blocks >= 2).mean() > 0.5
    else:  # one document per row; a document's last row is as short as what is left of it
        assert (blocks == 1).all() and (lengths < 64).mean() > 0.2


def test_static_masks_of_other_units_come_from_common_masking(tmp_path, bert_vocab):
    from common.masking import MaskingVocab
    from common.tokenizer import load_tokenizer

    spec = SyntheticSpec(rows=2_000, max_seq_length=128, max_predictions=40, rows_per_shard=2_000,
                         kind="full_sentences", mask_unit="whole_word", masked_lm_prob=0.3, document_tokens=80)
    write_synthetic(spec, str(bert_vocab), tmp_path / "data")
    manifest, table = _table(tmp_path / "data")
    special = set(manifest["tokenizer"]["special_ids"].values())
    continuation = MaskingVocab.from_tokenizer(load_tokenizer(str(bert_vocab))).is_continuation
    predicted = tokens = 0
    for row in table.to_pylist():
        ids, positions = _original(row), row["masked_positions"]
        assert positions == sorted(set(positions)) and not special & set(row["masked_labels"])
        chosen = set(positions)
        for p in positions:  # a chosen word piece's continuation is chosen with it
            if p + 1 < len(ids) and continuation[ids[p + 1]] and ids[p + 1] not in special:
                assert p + 1 in chosen
        predicted, tokens = predicted + len(positions), tokens + len(ids)
    assert 0.26 < predicted / tokens < 0.31  # whole words under a budget of 30% of the tokens


def test_pairs_can_carry_sentence_order_labels_and_impossible_combinations_are_refused(tmp_path, bert_vocab):
    from common.manifest import Manifest

    spec = SyntheticSpec(rows=2_000, rows_per_shard=2_000, sentence_objective="sop")
    write_synthetic(spec, str(bert_vocab), tmp_path / "sop")
    assert Manifest.read(tmp_path / "sop").objective.sentence_objective == "sop"
    _, table = _table(tmp_path / "sop")
    assert 0.45 < np.mean(table.column("next_sentence_label").to_numpy()) < 0.55
    with pytest.raises(ValueError, match="pairs take nsp or sop"):
        SyntheticSpec(rows=10, sentence_objective="none")
    with pytest.raises(ValueError, match="packed kinds .* take none"):
        SyntheticSpec(rows=10, kind="doc_sentences", sentence_objective="nsp")
    assert main(["--rows", "10", "--tokenizer", str(bert_vocab), "--output", str(tmp_path / "bad"),
                 "--kind", "pairs", "--sentence-objective", "none"]) == 2
