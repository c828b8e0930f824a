"""The shard reader: manifest checks, disjoint rank slices, length-grouped padding, exact resume."""
import json
import shutil
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from common.errors import DatasetFormatError
from common.manifest import ModelRequirements
from pretrain.data import (
    PretrainingLoader,
    ShardedInstances,
    collate,
    epoch_batches,
    padded_width,
    split_global_batch,
)


def _rows(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    return pa.concat_tables(ipc.open_file(pa.memory_map(str(dataset / s["name"]))).read_all()
                            for s in manifest["shards"]).to_pylist()


def test_collate_pads_to_a_multiple_of_8_and_keeps_every_row_intact(sample_dataset):
    data = ShardedInstances(sample_dataset, ModelRequirements(vocab_size=30522, max_seq_length=128))
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
    batches = epoch_batches(lengths, epoch=0, seed=1, global_batch=32)
    assert batches.shape == (1000 // 32, 32)
    per_rank = np.stack([split_global_batch(b, accumulation=2, world_size=4, micro_batch=4) for b in batches])
    seen = per_rank.reshape(-1)
    assert len(set(seen.tolist())) == len(seen) == 992  # disjoint, all but the last partial batch
    again = epoch_batches(lengths, epoch=0, seed=1, global_batch=32)
    assert (again == batches).all()
    assert not (epoch_batches(lengths, epoch=1, seed=1, global_batch=32) == batches).all()


def _padding_share(lengths, micro_batches):
    padded = sum(-(-lengths[b].max() // 8) * 8 * b.size for b in micro_batches)
    return 1 - lengths[np.concatenate(micro_batches)].sum() / padded


def _micro_batches(batches, micro_batch):
    return [m for b in batches for m in b.reshape(-1, micro_batch)]


def test_length_grouping_cuts_padding(sample_dataset):
    # Uniform lengths: grouping leaves little more than the rounding up to a multiple of 8.
    lengths = np.random.default_rng(0).integers(20, 129, size=20000)
    grouped = _padding_share(lengths, _micro_batches(epoch_batches(lengths, epoch=0, seed=0, global_batch=64), 32))
    random_order = _padding_share(lengths, list(np.random.default_rng(0).permutation(19968).reshape(-1, 32)))
    assert grouped < 0.07 and grouped < random_order / 5
    # Real shards at seq 128: at most 5% of the compute goes to padding.
    data = ShardedInstances(sample_dataset)
    real = data.lengths_of(np.arange(len(data)))
    assert _padding_share(real, _micro_batches(epoch_batches(real, epoch=0, seed=0, global_batch=64), 32)) <= 0.05


def test_the_split_does_not_change_the_samples_or_the_loss_normaliser(sample_dataset):
    """2 ranks x 1 micro-step read exactly the rows of 1 process x 2 accumulation steps."""
    data = ShardedInstances(sample_dataset)
    single = PretrainingLoader(data, micro_batch=8, accumulation=2, world_size=1, rank=0, seed=5)
    ranks = [PretrainingLoader(data, micro_batch=8, accumulation=1, world_size=2, rank=r, seed=5) for r in (0, 1)]
    for _ in range(3):
        one = single.next_step()
        two = [loader.next_step()[0] for loader in ranks]
        for a in range(2):
            assert (one[a]["input_ids"] == two[a]["input_ids"]).all()
            assert one[a]["mlm_loss_scale"] == two[a]["mlm_loss_scale"]
            assert one[a]["token_loss_scale"] == two[a]["token_loss_scale"]
        # scale x masked (or real) tokens summed over the micro-batches = number of micro-batches
        total = sum(len(m["masked_labels"]) for m in one)
        assert abs(one[0]["mlm_loss_scale"] * total - 2) < 1e-5
        real = sum(int(m["attention_mask"].sum()) for m in one)
        assert abs(one[0]["token_loss_scale"] * real - 2) < 1e-5


def test_resume_yields_the_same_next_batch(sample_dataset):
    data = ShardedInstances(sample_dataset)
    first = PretrainingLoader(data, micro_batch=8, accumulation=2, world_size=2, rank=1, seed=3)
    for _ in range(7):
        first.next_step()
    state = first.state_dict()
    expected = [first.next_step() for _ in range(100)]  # crosses into the next epochs
    assert first.epoch >= 2
    resumed = PretrainingLoader(data, micro_batch=8, accumulation=2, world_size=2, rank=1, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    for want_step in expected:
        for got, want in zip(resumed.next_step(), want_step):
            assert all((got[k] == want[k]).all() for k in want)
    # On 1 rank with the same global batch, the position names the same samples.
    other = PretrainingLoader(data, micro_batch=8, accumulation=4, world_size=1, rank=0, seed=3)
    other.load_state_dict(state)
    assert (other.next_step()[3]["input_ids"] == expected[0][1]["input_ids"]).all()  # rows 24:32 of the batch
    with pytest.raises(ValueError, match="global batch"):
        PretrainingLoader(data, micro_batch=8, accumulation=1, world_size=1, rank=0, seed=3).load_state_dict(state)


def _unpadded(batch: dict) -> list:
    """A micro-batch's rows without their padding, and the masked positions as (row, column)."""
    width = batch["input_ids"].shape[1]
    rows = [(ids[mask == 1].tolist(), types[mask == 1].tolist()) for ids, types, mask in
            zip(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])]
    positions = np.stack(np.divmod(batch["masked_positions"], width), axis=1).tolist()
    return [rows, positions, batch["masked_labels"].tolist(), batch["next_sentence_labels"].tolist(),
            float(batch["mlm_loss_scale"]), float(batch["token_loss_scale"])]


@pytest.mark.parametrize("multiple, widths", [(32, {32, 64, 96, 128}), (128, {128})])
def test_static_widths_pad_the_same_rows_in_the_same_order_to_a_few_widths(sample_dataset, multiple, widths):
    """``data.pad_multiple``: only the padding differs from the default (same rows, order, masks and loss scales),
    every width is a multiple (or the sequence length, 128 here), and a resumed loader pads alike."""
    data = ShardedInstances(sample_dataset)
    assert data.manifest.max_seq_length == 128
    default, static = (PretrainingLoader(data, micro_batch=4, accumulation=2, world_size=2, rank=1, seed=3,
                                         pad_multiple=m) for m in (8, multiple))
    seen = set()
    for step in range(40):
        if step == 20:  # resume the static loader mid-run from its own position
            state = static.state_dict()
            static = PretrainingLoader(data, micro_batch=4, accumulation=2, world_size=2, rank=1, seed=3,
                                       pad_multiple=multiple)
            static.load_state_dict(state)
        for ours, theirs in zip(static.next_step(), default.next_step()):
            width = ours["input_ids"].shape[1]
            seen.add(width)
            assert width == padded_width(theirs["input_ids"].shape[1], multiple, 128) and width in widths
            assert _unpadded(ours) == _unpadded(theirs)
    assert len(seen) >= 2 or multiple == 128
    assert padded_width(100, 48, 128) == 128 and padded_width(129, 8) == 136 and padded_width(7, 64, 128) == 64


def test_mismatched_dataset_is_refused_with_the_reason(sample_dataset, tmp_path):
    with pytest.raises(DatasetFormatError, match="vocabulary has 30522 ids but the model's embedding has 1000"):
        ShardedInstances(sample_dataset, ModelRequirements(vocab_size=1000, max_seq_length=128))
    with pytest.raises(DatasetFormatError, match="up to 128 tokens"):
        ShardedInstances(sample_dataset, ModelRequirements(vocab_size=30522, max_seq_length=64))
    with pytest.raises(DatasetFormatError, match="made with another tokenizer"):
        ShardedInstances(sample_dataset, ModelRequirements(vocab_size=30522, max_seq_length=128, vocab_sha256="0" * 64))
    with pytest.raises(DatasetFormatError, match="no manifest.json"):
        ShardedInstances(tmp_path)


def test_rows_read_in_place_equal_arrow_rows_across_shards_and_record_batches(synthetic_dataset):
    dataset = synthetic_dataset(30_000, rows_per_shard=10_000)  # 3 shards of 3 record batches each
    data = ShardedInstances(dataset)
    rows = _rows(dataset)
    assert len(data) == len(rows) == 30_000
    picked = np.asarray([29_999, 0, 4095, 4096, 10_000, 14_097, 8191, 20_001])
    batch = collate(data, picked)
    width = batch["input_ids"].shape[1]
    offset = 0
    for b, i in enumerate(picked):
        row = rows[i]
        n = len(row["input_ids"])
        assert batch["input_ids"][b, :n].tolist() == row["input_ids"] and batch["attention_mask"][b].sum() == n
        assert batch["token_type_ids"][b, row["segment_a_len"] - 1] == 0 and batch["token_type_ids"][b, n - 1] == 1
        k = len(row["masked_positions"])
        assert (batch["masked_positions"][offset:offset + k] == b * width + np.asarray(row["masked_positions"])).all()
        assert batch["masked_labels"][offset:offset + k].tolist() == row["masked_labels"]
        assert batch["next_sentence_labels"][b] == row["next_sentence_label"]
        offset += k
    assert (data.lengths_of(picked) == [len(rows[i]["input_ids"]) for i in picked]).all()


def _copy(dataset, tmp_path):
    """A copy of ``dataset`` to damage, and its manifest."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    return copy, json.loads((copy / "manifest.json").read_text())


def _first_step_peak(dataset) -> int:
    tracemalloc.start()
    try:
        loader = PretrainingLoader(ShardedInstances(dataset), micro_batch=32, accumulation=2, world_size=4, rank=1,
                                   seed=3)
        loader.next_step()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_ranks_memory_does_not_grow_with_the_dataset(synthetic_dataset):
    """Opening a dataset and reading a step allocates the same on 250k rows as on 1M (the old reader copied every row)."""
    small = _first_step_peak(synthetic_dataset(250_000, max_seq_length=32, max_predictions=5))
    large = _first_step_peak(synthetic_dataset(1_000_000, max_seq_length=32, max_predictions=5))
    assert large - small < 750_000  # under 1 byte per added row (the target is 16)
    assert large < 8 << 20


def test_a_damaged_or_altered_shard_is_refused_naming_it(synthetic_dataset, tmp_path):
    source = synthetic_dataset(30_000, rows_per_shard=10_000)
    copy, manifest = _copy(source, tmp_path)
    shard = copy / manifest["shards"][1]["name"]
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    with pytest.raises(DatasetFormatError, match=f"{shard}: {len(data) // 2} bytes but the manifest lists "
                                                 f"{len(data)}; the file is truncated"):
        ShardedInstances(copy)
    manifest["shards"][1]["bytes"] = len(data) // 2  # a manifest altered to match: refused when first read
    (copy / "manifest.json").write_text(json.dumps(manifest))
    opened = ShardedInstances(copy)
    collate(opened, np.arange(5))
    with pytest.raises(DatasetFormatError, match=f"{shard}: not a readable Arrow shard.*truncated"):
        collate(opened, np.asarray([12_000]))
    shard.unlink()
    with pytest.raises(DatasetFormatError, match=f"{shard}: shard listed in the manifest is missing"):
        ShardedInstances(copy)
    shard.write_bytes(data)
    manifest["shards"][1]["bytes"] = len(data)
    manifest["shards"][1]["rows"] += 1
    manifest["rows"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetFormatError, match=f"{shard}: 10000 rows but the manifest lists 10001"):
        collate(ShardedInstances(copy), np.asarray([19_000]))  # in the shard's last record batch


def test_a_manifest_listing_fewer_rows_than_a_one_batch_shard_is_refused_at_its_first_row(synthetic_dataset,
                                                                                          tmp_path):
    """Batch 0 is checked like every later one: in a one-batch shard it is the only place the lie shows."""
    copy, manifest = _copy(synthetic_dataset(6_000, rows_per_shard=3_000), tmp_path)  # shards of one record batch
    shard = copy / manifest["shards"][1]["name"]
    assert ipc.open_file(pa.memory_map(str(shard))).num_record_batches == 1
    manifest["shards"][1]["rows"] -= 100
    manifest["rows"] -= 100  # the totals still add up: only the shard itself shows the difference
    (copy / "manifest.json").write_text(json.dumps(manifest))
    data = ShardedInstances(copy)
    collate(data, np.arange(5))  # the other shard is intact
    with pytest.raises(DatasetFormatError, match=f"^{shard}: 3000 rows but the manifest lists 2900; .*re-run "
                                                 "preprocessing$"):
        collate(data, np.asarray([3_000]))


def test_a_position_saved_in_another_sample_order_is_refused(sample_dataset):
    loader = PretrainingLoader(ShardedInstances(sample_dataset), micro_batch=8, accumulation=1, world_size=1, rank=0,
                               seed=3)
    state = loader.state_dict()
    assert state["order_version"] == 2
    del state["order_version"]  # written before the order was versioned
    with pytest.raises(ValueError, match="sample order version 1.*model.init_from"):
        loader.load_state_dict(state)


def test_token_ids_beyond_the_vocabulary_are_refused_when_read_naming_shard_and_row(synthetic_dataset, tmp_path):
    copy, manifest = _copy(synthetic_dataset(30_000, rows_per_shard=10_000), tmp_path)
    shard = copy / manifest["shards"][2]["name"]
    table = ipc.open_file(pa.memory_map(str(shard))).read_all()
    ids = table.column("input_ids").to_pylist()
    ids[5000][7] = 40000  # an altered id inside a record batch past the first; uint16 holds it
    table = table.set_column(0, table.schema.field(0), pa.array(ids, table.schema.field(0).type))
    altered = tmp_path / "altered.arrow"
    with pa.OSFile(str(altered), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=4096):
            writer.write_batch(batch)
    altered.replace(shard)  # not in place: the table read above still maps the old file
    data = ShardedInstances(copy)  # opening reads no rows
    collate(data, np.arange(100))
    with pytest.raises(DatasetFormatError, match=f"{shard}, row 5000: input_ids holds id 40000, beyond the "
                                                 "vocabulary of 30522"):
        collate(data, np.asarray([3, 25_000, 20_001]))


@pytest.mark.parametrize("field,value", [("shard", "/etc/passwd"), ("shard", "../elsewhere.arrow"),
                                         ("tokenizer", "/home/someone/tokenizer"), ("tokenizer", "sub/../../up"),
                                         ("shard", "shard-00001-o\x002.arrow")])  # NUL: the OS takes no such name
def test_manifest_paths_must_stay_inside_the_dataset(sample_dataset, tmp_path, field, value):
    copy, manifest = _copy(sample_dataset, tmp_path)
    if field == "shard":
        manifest["shards"][0]["name"] = value
    else:
        manifest["tokenizer"]["dir"] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetFormatError, match="is not a relative path inside the dataset directory"):
        ShardedInstances(copy)


def test_a_shard_linked_to_a_file_outside_the_dataset_is_refused_naming_it(sample_dataset, tmp_path):
    copy, manifest = _copy(sample_dataset, tmp_path)
    shard = copy / manifest["shards"][0]["name"]
    outside = tmp_path / "outside.arrow"
    shutil.copyfile(shard, outside)  # the same bytes: only where the file lies is wrong
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(DatasetFormatError, match=f"^{shard}: shard name is a link to {outside}, outside the dataset "
                                                 f"directory {copy}; copy the file itself"):
        ShardedInstances(copy)
    shard.unlink()
    (copy / "moved.arrow").write_bytes(outside.read_bytes())
    shard.symlink_to(copy / "moved.arrow")  # a link that stays inside the directory is allowed
    assert len(ShardedInstances(copy)) == manifest["rows"]


def test_a_manifest_that_lists_only_some_shards_is_refused(synthetic_dataset, tmp_path):
    copy, manifest = _copy(synthetic_dataset(30_000, rows_per_shard=10_000), tmp_path)
    del manifest["shards"][2]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetFormatError, match="its shards hold 20000 rows but it lists 30000 in all"):
        ShardedInstances(copy)


def test_verify_hashes_every_shard_and_names_an_altered_one(synthetic_dataset, tmp_path):
    copy, _ = _copy(synthetic_dataset(30_000, rows_per_shard=10_000), tmp_path)
    assert len(ShardedInstances(copy, verify=True)) == 30_000
    shard = copy / json.loads((copy / "manifest.json").read_text())["shards"][2]["name"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte altered inside the rows
    altered = tmp_path / "altered"
    altered.write_bytes(bytes(data))
    altered.replace(shard)
    assert len(ShardedInstances(copy)) == 30_000  # without verify, opening reads no rows
    with pytest.raises(DatasetFormatError, match=f"{shard}: sha256 .* but the manifest lists .*altered or damaged"):
        ShardedInstances(copy, verify=True)


def test_shards_with_record_batches_of_any_size_are_read_alike(synthetic_dataset, tmp_path):
    source = synthetic_dataset(30_000, rows_per_shard=10_000)
    copy, manifest = _copy(source, tmp_path)
    # Shard 1: a first batch that cannot be the common size; shard 2: one that can, then a shorter one.
    for index, cuts in ((1, (0, 700, 4796, 4809, 10_000)), (2, (0, 4096, 4196, 10_000))):
        shard = copy / manifest["shards"][index]["name"]
        table = ipc.open_file(pa.memory_map(str(shard))).read_all()
        uneven = tmp_path / "uneven.arrow"
        with pa.OSFile(str(uneven), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            for start, stop in zip(cuts, cuts[1:]):
                writer.write_batch(table.slice(start, stop - start).combine_chunks().to_batches()[0])
        uneven.replace(shard)
        manifest["shards"][index]["bytes"] = shard.stat().st_size
    (copy / "manifest.json").write_text(json.dumps(manifest))
    rows = np.asarray([10_001, 19_999, 10_700, 14_800, 10_699, 5, 25_000, 24_150, 20_000, 29_999])
    got, want = collate(ShardedInstances(copy), rows), collate(ShardedInstances(source), rows)
    assert all((got[k] == want[k]).all() for k in want)
