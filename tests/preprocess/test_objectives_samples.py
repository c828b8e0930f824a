"""The objectives menu end to end on the bundled samples: packed rows whatever the workers and parts, unmasked rows
for dynamic masking."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest

from common import preprocess_config as config_module
from preprocess import pipeline
from tests.preprocess.conftest import SAMPLES, read_manifest, run_cli, shard_hashes

CONFIG = "configs/preprocess/tiny.yaml"
PACKED = ["instances.kind=full_sentences", "instances.sentence_objective=none"]


def _inputs(bert_vocab) -> list:
    return ["--config", CONFIG, "--wikipedia", SAMPLES / "wikipedia", "--books", SAMPLES / "books",
            "--tokenizer", bert_vocab]


def _table(dataset) -> pa.Table:
    manifest = read_manifest(dataset)
    return pa.concat_tables(ipc.open_file(pa.memory_map(str(dataset / s["name"]))).read_all()
                            for s in manifest["shards"])


@pytest.fixture(scope="module")
def packed_run(bert_vocab, tmp_path_factory):
    """full_sentences in one in-process run."""
    out = tmp_path_factory.mktemp("packed") / "one-run"
    cfg = config_module.load(CONFIG, PACKED)
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    return out


def test_packed_rows_do_not_depend_on_workers_or_parts(packed_run, bert_vocab, tmp_path):
    table = _table(packed_run)
    assert "doc_starts" in table.column_names and table.num_rows > 500
    reference = shard_hashes(packed_run)
    sets = [a for o in PACKED for a in ("--set", o)]
    for name, extra in {"two-processes": ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
                        "three-parts": ["--parts", "3"]}.items():
        run_cli("run", *_inputs(bert_vocab), *sets, "--output", tmp_path / name, *extra)
        assert shard_hashes(tmp_path / name) == reference, f"{name} differs from the one-process run"


@pytest.mark.parametrize("overrides", [["instances.masking=dynamic"], PACKED + ["instances.masking=dynamic"]],
                         ids=["pairs", "full_sentences"])
def test_dynamic_masking_stores_every_row_unmasked(bert_vocab, tmp_path, overrides):
    out = tmp_path / "dynamic"
    pipeline.run(config_module.load(CONFIG, overrides), wikipedia=[str(SAMPLES / "wikipedia")],
                 books=[str(SAMPLES / "books")], tokenizer=str(bert_vocab), output=str(out), progress=False)
    table = _table(out)
    assert table.num_rows > 500
    assert pc.sum(pc.list_value_length(table.column("masked_positions"))).as_py() == 0
    assert pc.sum(pc.list_value_length(table.column("masked_labels"))).as_py() == 0
    mask_id = read_manifest(out)["tokenizer"]["special_ids"]["[MASK]"]
    assert mask_id not in set(pc.list_flatten(table.column("input_ids")).to_pylist())
