"""The objectives menu end to end on the bundled samples: packed rows whatever the workers and parts, unmasked rows
for dynamic masking, sentence-order pairs, ALBERT's n-gram masks, and the manifest's objective and statistics."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest

from common import preprocess_config as config_module
from common.manifest import Manifest
from common.objectives import ObjectiveEntry
from common.tokenizer import load_tokenizer
from preprocess.executors import pipeline
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


def test_the_manifest_names_the_objective_and_reports_the_packing(packed_run):
    manifest = Manifest.read(packed_run)
    assert manifest.objective == ObjectiveEntry(kind="full_sentences", sentence_objective="none", masking="static",
                                                mask_unit="token", masked_lm_prob=0.15, max_predictions_per_seq=20)
    stats = manifest.document["statistics"]
    table = _table(packed_run)
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy()
    blocks = pc.list_value_length(table.column("doc_starts")).to_numpy()
    assert stats["fill_fraction"] == pytest.approx(lengths.sum() / (len(lengths) * 128), abs=1e-6)
    assert stats["fill_fraction"] > 0.99  # only the last row of each duplicate's stream is short
    assert stats["documents_per_row"] == pytest.approx(blocks.mean(), abs=1e-6) and blocks.mean() > 1
    assert "next_sentence_random_fraction" not in stats and "truncated_fraction" not in stats
    assert (table.column("next_sentence_label").to_numpy() == 0).all()


def test_sentence_order_pairs_end_to_end(bert_vocab, tmp_path):
    out = tmp_path / "sop"
    cfg = config_module.load(CONFIG, ["instances.sentence_objective=sop", "output.provenance=true"])
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    manifest = Manifest.read(out)
    assert (manifest.objective.kind, manifest.objective.sentence_objective) == ("pairs", "sop")
    table = _table(out)
    assert table.column("doc_a").to_pylist() == table.column("doc_b").to_pylist()  # both segments of one document
    labels = table.column("next_sentence_label").to_numpy()
    stats = manifest.document["statistics"]
    assert stats["sentence_order_swapped_fraction"] == pytest.approx(labels.mean(), abs=1e-6)
    assert 0.45 < labels.mean() < 0.55 and stats["sop_dropped_chunks"] == 0
    assert stats["instances"]["sentence_order"] == {"in_order": int((labels == 0).sum()), "swapped": int(labels.sum())}


def test_ngram_masks_are_stored_as_runs_of_whole_words(bert_vocab, tmp_path):
    """ALBERT's masks (``mask_unit: ngram``) from the tiny config: within the budget, whole words, and runs of about
    1.6 words where whole-word masks give about 1.1 (6/11 of the n-grams are one word, the rest two or three)."""
    out = tmp_path / "ngram"
    cfg = config_module.load(CONFIG, ["instances.mask_unit=ngram"])
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    assert Manifest.read(out).objective.mask_unit == "ngram"
    table = _table(out)
    continuation = load_tokenizer(str(bert_vocab)).is_continuation
    counts = pc.list_value_length(table.column("masked_positions")).to_numpy()
    assert table.num_rows > 500 and (counts > 0).all() and (counts <= cfg.instances.max_predictions_per_seq).all()
    words_per_run = []
    for a_len, positions, labels in zip(table.column("segment_a_len").to_pylist(),
                                        table.column("masked_positions").to_pylist(),
                                        table.column("masked_labels").to_pylist()):
        masked = dict(zip(positions, labels))
        for pos, label in masked.items():
            if continuation[label] and pos - 1 not in (0, a_len - 1):  # a segment may start inside a cut word
                assert pos - 1 in masked, "a word is masked entirely or not at all"
        run_words = 0
        for pos in sorted(masked):
            if pos - 1 not in masked and run_words:
                words_per_run.append(run_words)
                run_words = 0
            run_words += not continuation[masked[pos]]
        words_per_run.append(run_words)
    assert 1.4 < np.mean(words_per_run) < 2.0, np.mean(words_per_run)


@pytest.mark.parametrize("name", ["roberta_seq512", "spanbert_seq512", "albert_sop_seq128", "albert_sop_seq512",
                                  "modern_seq512", "electra_seq128", "electra_seq512"])
def test_each_recipe_config_builds_its_dataset(bert_vocab, tmp_path, name):
    cfg = config_module.load(f"configs/preprocess/{name}.yaml")
    out = tmp_path / name
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    recipe = cfg.instances
    objective = Manifest.read(out).objective
    assert (objective.kind, objective.sentence_objective, objective.masking, objective.mask_unit) == \
        (recipe.kind, recipe.sentence_objective, recipe.masking, recipe.mask_unit)
    table = _table(out)
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy()
    assert table.num_rows > 50 and lengths.max() == recipe.max_seq_length
    assert ("doc_starts" in table.column_names) == objective.packed
    masks = pc.list_value_length(table.column("masked_positions")).to_numpy()
    assert (masks == 0).all() if recipe.masking == "dynamic" else (masks > 0).all()
    labels = set(table.column("next_sentence_label").to_pylist())
    assert labels == ({0, 1} if recipe.sentence_objective == "sop" else {0})
