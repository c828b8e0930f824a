"""The objectives menu's contract: the config refuses impossible combinations, the manifest records the choice,
and datasets of format version 1 (no ``objective``) read as the 2018 recipe."""
from __future__ import annotations

import json

import pytest

from common.errors import DatasetFormatError
from common.manifest import Manifest
from common.masking import MaskingRecipe
from common.objectives import MASK_UNITS, ObjectiveEntry
from common.preprocess_config import InstanceConfig


def _document(version: int, **extra) -> dict:
    return {"format": "bert-instances", "format_version": version, "rows": 0, "max_seq_length": 128, "shards": [],
            "tokenizer": {"dir": "tokenizer", "kind": "wordpiece", "vocab_size": 100, "lowercase": True,
                          "special_ids": {"[PAD]": 0}, "vocab_sha256": "0" * 64}, **extra}


@pytest.mark.parametrize("kind, objective", [("pairs", "none"), ("full_sentences", "nsp"), ("doc_sentences", "sop")])
def test_a_pair_objective_needs_pairs_and_packed_rows_need_none(kind, objective):
    with pytest.raises(ValueError, match=f"kind {kind} with sentence_objective {objective}"):
        InstanceConfig(kind=kind, sentence_objective=objective)


def test_the_replacement_split_is_checked_and_recorded(tmp_path):
    with pytest.raises(ValueError, match="mask_token_fraction 0.9 and random_token_fraction 0.2 must be >= 0 and add"):
        InstanceConfig(mask_token_fraction=0.9, random_token_fraction=0.2)
    chosen = {"kind": "pairs", "sentence_objective": "nsp", "masking": "static", "mask_token_fraction": 1.0,
              "random_token_fraction": 0.0}
    manifest = Manifest.parse(_document(2, objective=chosen), tmp_path / "manifest.json")
    assert (manifest.objective.mask_token_fraction, manifest.objective.random_token_fraction) == (1.0, 0.0)
    assert Manifest.parse(_document(1), tmp_path / "manifest.json").objective.mask_token_fraction == 0.8


@pytest.mark.parametrize("unit", MASK_UNITS)
def test_every_mask_unit_is_a_masking_mode_the_config_and_manifest_take(unit, tmp_path):
    assert MaskingRecipe(mode=unit).mode == InstanceConfig(mask_unit=unit).mask_unit == unit
    chosen = {"kind": "pairs", "sentence_objective": "sop", "masking": "static", "mask_unit": unit}
    assert Manifest.parse(_document(2, objective=chosen), tmp_path / "manifest.json").objective.mask_unit == unit


@pytest.mark.parametrize("field, value", [("mask_unit", "sentence"), ("masking", "per_step"), ("kind", "sentences")])
def test_unknown_choices_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"{field}.*{value}"):
        InstanceConfig(**{field: value, **({"sentence_objective": "none"} if field == "kind" else {})})


def test_a_version_1_manifest_reads_as_static_nsp_pairs(tmp_path):
    whole_word = _document(1, parameters={"instances": {"whole_word_mask": True, "masked_lm_prob": 0.2,
                                                         "max_predictions_per_seq": 30}})
    manifest = Manifest.parse(whole_word, tmp_path / "manifest.json")
    assert manifest.objective == ObjectiveEntry(kind="pairs", sentence_objective="nsp", masking="static",
                                                mask_unit="whole_word", masked_lm_prob=0.2,
                                                max_predictions_per_seq=30)
    assert not manifest.objective.packed


def test_a_version_2_manifest_carries_its_objective(tmp_path):
    chosen = {"kind": "full_sentences", "sentence_objective": "none", "masking": "dynamic", "mask_unit": "span",
              "masked_lm_prob": 0.3, "max_predictions_per_seq": 80}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(_document(2, objective=chosen)))
    manifest = Manifest.read(tmp_path)
    assert manifest.objective == ObjectiveEntry(**chosen) and manifest.objective.packed


def test_an_altered_objective_is_refused_naming_the_manifest(tmp_path):
    altered = _document(2, objective={"kind": "pairs", "sentence_objective": "nsp", "masking": "sometimes"})
    with pytest.raises(DatasetFormatError, match=r"manifest\.json.*masking"):
        Manifest.parse(altered, tmp_path / "manifest.json")


def test_a_future_format_version_is_refused(tmp_path):
    with pytest.raises(DatasetFormatError, match="format version 3 but this code reads versions 1, 2"):
        Manifest.parse(_document(3), tmp_path / "manifest.json")
