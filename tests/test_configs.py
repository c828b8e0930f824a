"""Every shipped config loads into its dataclass; unknown keys and bad values are refused by name."""
import pathlib

import pytest

from common import preprocess_config
from common.configlib import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
PREPROCESS_CONFIGS = sorted((ROOT / "configs" / "preprocess").glob("*.yaml"))


def test_there_are_configs():
    names = {p.name for p in PREPROCESS_CONFIGS}
    assert {"phase1_seq128.yaml", "phase2_seq512.yaml", "tiny.yaml"} <= names


@pytest.mark.parametrize("path", PREPROCESS_CONFIGS, ids=lambda p: p.name)
def test_preprocess_config_loads(path):
    cfg = preprocess_config.load(path)
    assert cfg.instances.max_seq_length in (128, 512)


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
