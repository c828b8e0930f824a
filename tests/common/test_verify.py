"""`python -m preprocess verify DIR`: every shard against the manifest, one line naming what is wrong."""
import json
import re
import shutil

import pytest

from preprocess.cli import main
from preprocess.synthetic import SyntheticSpec, write_synthetic


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, bert_vocab):
    out = tmp_path_factory.mktemp("verify") / "dataset"
    write_synthetic(SyntheticSpec(rows=9_000, max_seq_length=64, rows_per_shard=3_000), str(bert_vocab), out)
    return out


def _copy(dataset, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    return copy, json.loads((copy / "manifest.json").read_text())


def test_an_intact_dataset_verifies(dataset, capsys):
    assert main(["verify", str(dataset)]) == 0
    assert "3 shards, 9,000 rows" in capsys.readouterr().out


def _altered_shard(copy, manifest):
    shard = copy / manifest["shards"][1]["name"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 1
    shard.write_bytes(bytes(data))
    return f"{shard}: sha256 .* but the manifest lists"


def _truncated_shard(copy, manifest):
    shard = copy / manifest["shards"][0]["name"]
    shard.write_bytes(shard.read_bytes()[:1000])
    return f"{shard}: 1000 bytes but the manifest lists"


def _missing_shard(copy, manifest):
    shard = copy / manifest["shards"][2]["name"]
    shard.unlink()
    return f"{shard}: shard listed in the manifest is missing"


def _partial_manifest(copy, manifest):
    del manifest["shards"][0]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return "its shards hold 6000 rows but it lists 9000 in all"


def _escaping_path(copy, manifest):
    manifest["tokenizer"]["dir"] = "../../elsewhere"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return "tokenizer.dir '../../elsewhere' is not a relative path inside the dataset directory"


def _shard_linked_outside(copy, manifest):
    shard = copy / manifest["shards"][1]["name"]
    outside = copy.parent / "outside.arrow"
    shard.replace(outside)  # the very bytes the manifest lists: only where the file lies is wrong
    shard.symlink_to(outside)
    return f"{shard}: shard name is a link to {outside}, outside the dataset directory"


@pytest.mark.parametrize("damage", [_altered_shard, _truncated_shard, _missing_shard, _partial_manifest, _escaping_path,
                                    _shard_linked_outside])
def test_damage_is_named_in_one_line(dataset, tmp_path, capsys, damage):
    copy, manifest = _copy(dataset, tmp_path)
    expected = damage(copy, manifest)
    assert main(["verify", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert re.search(expected, err), err
