"""The shard reader: manifest checks, disjoint rank slices, length-grouped padding, exact resume."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from preprocess.schema import DatasetFormatError
from pretrain.data import Expected, PretrainingLoader, ShardedInstances, collate, epoch_batches


def _rows(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    return pa.concat_tables(ipc.open_file(pa.memory_map(str(dataset / s["name"]))).read_all()
                            for s in manifest["shards"]).to_pylist()


def test_collate_pads_to_a_multiple_of_8_and_keeps_every_row_intact(sample_dataset):
    data = ShardedInstances(sample_dataset, Expected(vocab_size=30522, max_seq_length=128))
    rows = _rows(sample_dataset)
    picked = np.asarray([5, 0, 17, 3])
    batch = collate(data, picked)
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0 and width - 8 < max(len(rows[i]["input_ids"]) for i in picked) <= width
    offset = 0
    for b, i in enumerate(picked):
        row = rows[i]
        n = len(row["input_ids"])
        assert batch["input_ids"][b, :n].tolist() == row["input_ids"] and (batch["input_ids"][b, n:] == 0).all()
        assert batch["attention_mask"][b].sum() == n
        types = batch["token_type_ids"][b]
        assert (types[:row["segment_a_len"]] == 0).all() and (types[row["segment_a_len"]:n] == 1).all()
        k = len(row["masked_positions"])
        assert (batch["masked_positions"][offset:offset + k] == b * width + np.asarray(row["masked_positions"])).all()
        assert batch["masked_labels"][offset:offset + k].tolist() == row["masked_labels"]
        offset += k
        assert batch["next_sentence_labels"][b] == row["next_sentence_label"]


def test_ranks_read_disjoint_rows_covering_the_epoch():
    lengths = np.random.default_rng(0).integers(10, 129, size=1000)
    batches = epoch_batches(lengths, epoch=0, seed=1, micro_batch=8, world_size=4)
    assert batches.shape == (1000 // 32, 4, 8)
    seen = batches.reshape(-1)
    assert len(set(seen.tolist())) == len(seen) == 992  # disjoint, all but the last partial batch
    again = epoch_batches(lengths, epoch=0, seed=1, micro_batch=8, world_size=4)
    assert (again == batches).all()
    assert not (epoch_batches(lengths, epoch=1, seed=1, micro_batch=8, world_size=4) == batches).all()


def _padding_share(lengths, batches):
    padded = sum(-(-lengths[b].max() // 8) * 8 * b.size for b in batches.reshape(-1, batches.shape[-1]))
    return 1 - lengths[batches.reshape(-1)].sum() / padded


def test_length_grouping_cuts_padding(sample_dataset):
    # Uniform lengths: grouping leaves little more than the rounding up to a multiple of 8.
    lengths = np.random.default_rng(0).integers(20, 129, size=20000)
    grouped = _padding_share(lengths, epoch_batches(lengths, epoch=0, seed=0, micro_batch=32, world_size=1))
    random_order = _padding_share(lengths, np.random.default_rng(0).permutation(19968).reshape(-1, 1, 32))
    assert grouped < 0.07 and grouped < random_order / 5
    # Real shards at seq 128: at most 5% of the compute goes to padding.
    real = ShardedInstances(sample_dataset).lengths
    assert _padding_share(real, epoch_batches(real, epoch=0, seed=0, micro_batch=32, world_size=2)) <= 0.05


def test_resume_yields_the_same_next_batch(sample_dataset):
    data = ShardedInstances(sample_dataset)
    first = PretrainingLoader(data, micro_batch=16, world_size=2, rank=1, seed=3)
    for _ in range(7):
        first.next_batch()
    state = first.state_dict()
    expected = [first.next_batch() for _ in range(200)]  # crosses into the next epochs
    resumed = PretrainingLoader(data, micro_batch=16, world_size=2, rank=1, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    for want in expected:
        got = resumed.next_batch()
        assert all((got[k] == want[k]).all() for k in want)


def test_mismatched_dataset_is_refused_with_the_reason(sample_dataset, tmp_path):
    with pytest.raises(DatasetFormatError, match="vocabulary has 30522 ids but the model's embedding has 1000"):
        ShardedInstances(sample_dataset, Expected(vocab_size=1000, max_seq_length=128))
    with pytest.raises(DatasetFormatError, match="up to 128 tokens"):
        ShardedInstances(sample_dataset, Expected(vocab_size=30522, max_seq_length=64))
    with pytest.raises(DatasetFormatError, match="made with another tokenizer"):
        ShardedInstances(sample_dataset, Expected(vocab_size=30522, max_seq_length=128, vocab_sha256="0" * 64))
    with pytest.raises(DatasetFormatError, match="no manifest.json"):
        ShardedInstances(tmp_path)
