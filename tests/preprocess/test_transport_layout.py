"""The shards do not depend on how the instance stage's rows travel: at a corpus's worth of key-range groups and
units, the same bytes whether rows cross by key-range group or by a few transport groups, and requests by every
target unit or by a few join ranges; nor on the size of the document-store buckets."""
from __future__ import annotations

from common import preprocess_config as config_module
from preprocess import layout
from preprocess.executors import pipeline, plan
from preprocess.stages import index
from tests.preprocess.conftest import SAMPLES, read_manifest, shard_hashes


def _build(out, bert_vocab) -> dict:
    pipeline.run(config_module.load("configs/preprocess/tiny.yaml"), wikipedia=[str(SAMPLES / "wikipedia")],
                 books=[str(SAMPLES / "books")], tokenizer=str(bert_vocab), output=str(out), progress=False)
    return read_manifest(out)


def test_shards_do_not_depend_on_transport_groups_or_join_ranges(bert_vocab, tmp_path, monkeypatch):
    # Groups of 4 rows, buckets of 2 KiB of input and units of 16 instances: the samples get hundreds of groups
    # and dozens of units, as a corpus thousands of times larger has with the real sizes.
    monkeypatch.setattr(index, "ROWS_PER_GROUP", 4)
    monkeypatch.setattr(index, "ROWS_PER_UNIT", 16)
    monkeypatch.setattr(plan, "BYTES_PER_BUCKET", 2048)
    by_group = _build(tmp_path / "by-group", bert_vocab)
    assert by_group["layout"]["group_bits"] == 8 and by_group["layout"]["bucket_bits"] >= 6
    assert by_group["rows"] > 500
    monkeypatch.setattr(layout, "TRANSPORT_GROUP_BITS", 2)
    monkeypatch.setattr(layout, "JOIN_RANGE_BITS", 1)
    by_transport = _build(tmp_path / "by-transport", bert_vocab)
    assert by_transport["layout"] == by_group["layout"] and by_transport["rows"] == by_group["rows"]
    assert shard_hashes(tmp_path / "by-transport") == shard_hashes(tmp_path / "by-group")


def test_shards_do_not_depend_on_the_bucket_size(bert_vocab, tmp_path, monkeypatch):
    # The samples fit one bucket of the real size; buckets of 2 KiB of input give them dozens.
    one_bucket = _build(tmp_path / "one-bucket", bert_vocab)
    monkeypatch.setattr(plan, "BYTES_PER_BUCKET", 2048)
    many_buckets = _build(tmp_path / "many-buckets", bert_vocab)
    assert one_bucket["layout"]["bucket_bits"] == 0 and many_buckets["layout"]["bucket_bits"] >= 6
    assert many_buckets["rows"] == one_bucket["rows"] > 0
    assert shard_hashes(tmp_path / "many-buckets") == shard_hashes(tmp_path / "one-bucket")
