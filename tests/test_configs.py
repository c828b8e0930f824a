"""Every shipped config loads into its dataclass with its paper's recipe; unknown keys and bad values are refused by
name."""
import pathlib

import pytest

from common import preprocess_config
from common.configlib import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
PREPROCESS_CONFIGS = sorted((ROOT / "configs" / "preprocess").glob("*.yaml"))


def test_there_are_configs():
    names = {p.name for p in PREPROCESS_CONFIGS}
    assert {"phase1_seq128.yaml", "phase2_seq512.yaml", "tiny.yaml"} <= names


# Each shipped preprocessing config's recipe, as its paper (or reference code) builds the rows: (length, row kind,
# sentence objective, masking time, mask unit, mask rate, masks per row at most).
RECIPES = {
    # BERT (Devlin et al. 2019; NVIDIA's phase 1 and 2): sentence pairs with NSP, masks fixed at preprocessing.
    "phase1_seq128.yaml": (128, "pairs", "nsp", "static", "token", 0.15, 20),
    "phase2_seq512.yaml": (512, "pairs", "nsp", "static", "token", 0.15, 80),
    "tiny.yaml": (128, "pairs", "nsp", "static", "token", 0.15, 20),
    # Multilingual BERT (Devlin et al., mBERT): BERT's phase-1 recipe over several languages' dumps, smoothed mix.
    "mbert_seq128.yaml": (128, "pairs", "nsp", "static", "token", 0.15, 20),
    # ALBERT (Lan et al. 2020): sentence-order prediction instead of NSP; n-gram masks at full length.
    "albert_sop_seq128.yaml": (128, "pairs", "sop", "static", "token", 0.15, 20),
    "albert_sop_seq512.yaml": (512, "pairs", "sop", "static", "ngram", 0.15, 80),
    # RoBERTa (Liu et al. 2019): FULL-SENTENCES rows, no NSP, masked anew each epoch.
    "roberta_seq512.yaml": (512, "full_sentences", "none", "dynamic", "token", 0.15, 80),
    # SpanBERT (Joshi et al. 2020): single-segment rows, no NSP, geometric spans.
    "spanbert_seq512.yaml": (512, "doc_sentences", "none", "dynamic", "span", 0.15, 80),
    # ELECTRA (Clark et al. 2020): one document per row, no NSP; int((0.15 + 0.005) x length) masks, as its code.
    "electra_seq128.yaml": (128, "doc_sentences", "none", "dynamic", "token", 0.15, 19),
    "electra_seq512.yaml": (512, "doc_sentences", "none", "dynamic", "token", 0.15, 79),
    # ModernBERT-style (Warner et al. 2024): packed rows, no NSP, 30 % masked.
    "modern_seq512.yaml": (512, "full_sentences", "none", "dynamic", "token", 0.3, 160),
}


def test_every_shipped_preprocess_config_has_its_recipe_checked():
    assert {p.name for p in PREPROCESS_CONFIGS} == set(RECIPES)


@pytest.mark.parametrize("path", PREPROCESS_CONFIGS, ids=lambda p: p.name)
def test_preprocess_config_loads_with_its_papers_recipe(path):
    i = preprocess_config.load(path).instances
    found = (i.max_seq_length, i.kind, i.sentence_objective, i.masking, i.mask_unit, i.masked_lm_prob,
             i.max_predictions_per_seq)
    assert found == RECIPES[path.name]
    if i.sentence_objective == "none":
        assert i.short_seq_prob == 0.0 and i.dupe_factor == 1  # no pairs to shorten; dynamic masks need no copies


def test_phase_configs_follow_the_published_recipe():
    phase1 = preprocess_config.load(ROOT / "configs/preprocess/phase1_seq128.yaml")
    phase2 = preprocess_config.load(ROOT / "configs/preprocess/phase2_seq512.yaml")
    assert (phase1.instances.max_seq_length, phase1.instances.max_predictions_per_seq) == (128, 20)
    assert (phase2.instances.max_seq_length, phase2.instances.max_predictions_per_seq) == (512, 80)
    for cfg in (phase1, phase2):
        assert (cfg.instances.masked_lm_prob, cfg.instances.short_seq_prob) == (0.15, 0.1)


def test_overrides_and_errors(tmp_path):
    cfg = preprocess_config.load(ROOT / "configs/preprocess/tiny.yaml", ["instances.dupe_factor=7", "seed=3"])
    assert cfg.instances.dupe_factor == 7 and cfg.seed == 3
    with pytest.raises(ConfigError, match="unknown key 'instances.dupe'"):
        preprocess_config.load(None, ["instances.dupe=1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("instances:\n  masked_lm_prob: 0.15\n  whole_word_masking: true\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*whole_word_masking"):
        preprocess_config.load(bad)
    with pytest.raises(ConfigError, match="expected an integer"):
        preprocess_config.load(None, ["instances.dupe_factor=many"])
    with pytest.raises(ConfigError, match="max_seq_length"):
        preprocess_config.load(None, ["instances.max_seq_length=4"])


def test_exponent_floats_without_a_dot_are_numbers():
    """YAML 1.1 reads 1e-4 as a string; a learning rate written that way must still load."""
    from pretrain import config as pretrain_config

    cfg = pretrain_config.load("configs/pretrain/tiny.yaml", ["optimizer.lr=1e-4", "optimizer.eps=1e-8"])
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.eps == 1e-8
    with pytest.raises(ConfigError, match="expected a number"):
        pretrain_config.load("configs/pretrain/tiny.yaml", ["optimizer.lr=fast"])
