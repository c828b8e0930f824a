"""The shipped recipes of the objectives menu: each config parses, states the objective it is named after, points at
its preprocessing output, and trains a few steps on CPU (a tiny model, a synthetic dataset of its objective)."""
import json
import math
import pathlib

import pytest

from common.manifest import Manifest
from pretrain import config, train
from pretrain.recipe import resolve

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs" / "pretrain"

# config -> (its dataset's synthetic spec, the objective it must state, its data.path)
RECIPES = {
    "roberta_base": ({"kind": "full_sentences", "masking": "dynamic", "max_seq_length": 128},
                     {"masking": "dynamic", "mask_unit": "token", "masked_lm_prob": 0.15,
                      "sentence_objective": "none", "attention": "full"}, "data/roberta_seq512"),
    "spanbert_base": ({"kind": "doc_sentences", "masking": "dynamic", "mask_unit": "span", "max_seq_length": 128},
                      {"masking": "dynamic", "mask_unit": "span", "sentence_objective": "none", "attention": "full",
                       "span_boundary": True}, "data/spanbert_seq512"),
    "albert_sop": ({"sentence_objective": "sop", "max_seq_length": 128},
                   {"masking": "static", "mask_unit": None, "sentence_objective": "sop", "attention": "full"},
                   "data/albert_sop_seq128"),
    "modern_base": ({"kind": "full_sentences", "masking": "dynamic", "max_seq_length": 128},
                    {"masking": "dynamic", "mask_unit": "token", "masked_lm_prob": 0.3, "max_predictions": None,
                     "sentence_objective": "none", "attention": "document"}, "data/modern_seq512"),
}
TINY_RUN = {"model.preset": "tiny", "model.max_position_embeddings": 128, "train.max_steps": 2,
            "schedule.total_steps": 2, "schedule.warmup_steps": 1, "schedule.warmup_proportion": "null",
            "train.global_batch_size": 16, "train.micro_batch_size": 8, "data.window_batches": 1,
            "optimizer.torch_adam": "true", "checkpoint.every_steps": 0, "checkpoint.export_hf": "false",
            "logging.log_every": 1, "logging.tensorboard": "false", "logging.progress": "false"}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_shipped_recipe_parses_states_its_objective_and_trains(name, one_rank, synthetic_dataset, tmp_path):
    spec, objective, path = RECIPES[name]
    shipped = config.load(CONFIGS / f"{name}.yaml")
    assert {key: getattr(shipped.objective, key) for key in objective} == objective
    assert shipped.data.path == path and shipped.model.preset == "base"
    dataset = synthetic_dataset(1_000, document_tokens=60, **spec)
    manifest = Manifest.read(dataset)
    recipe = resolve(shipped.objective, manifest)  # the shipped objective accepts a dataset of its kind
    overrides = {**TINY_RUN, "data.path": dataset, "output_dir": tmp_path / "run"}  # precision auto, as shipped
    cfg = config.load(CONFIGS / f"{name}.yaml", [f"{key}={value}" for key, value in overrides.items()])
    assert train.run(cfg, one_rank, resume=False) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["loss"]) for r in records)
    pair = recipe.sentence_objective
    for record in records:
        boundary = record["sbo_loss"] * record["sbo_share"] if shipped.objective.span_boundary else 0.0  # SpanBERT
        if pair == "none":
            assert record["loss"] == pytest.approx(record["mlm_loss"] + boundary, rel=1e-9, abs=0)
            assert "nsp_loss" not in record and "sop_loss" not in record
        else:
            assert f"{pair}_loss" in record and "nsp_loss" not in record


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_pretraining_config_parses(path):
    cfg = config.load(path)
    assert cfg.train.max_steps == cfg.schedule.total_steps
    assert set(RECIPES) <= {p.stem for p in CONFIGS.glob("*.yaml")}
