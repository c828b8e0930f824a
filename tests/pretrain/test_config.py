"""The pretraining config (``pretrain.config``): the shipped phase configs carry the published recipe, and
inconsistent settings are refused with the reason."""
import pytest

from common.configlib import ConfigError
from pretrain import config

PHASE1, PHASE2 = "configs/pretrain/bert_large_phase1_seq128.yaml", "configs/pretrain/bert_large_phase2_seq512.yaml"


def test_shipped_configs_carry_the_published_recipe():
    one, two = config.load(PHASE1), config.load(PHASE2)
    assert (one.train.global_batch_size, one.optimizer.lr, one.train.max_steps) == (65536, 6e-3, 7038)
    assert (two.train.global_batch_size, two.optimizer.lr, two.train.max_steps) == (32768, 4e-3, 1563)
    assert one.optimizer.name == two.optimizer.name == "lamb" and one.model.preset == "large"
    assert two.model.init_from == one.output_dir  # phase 2 starts from phase 1, with its own schedule
    assert config.load("configs/pretrain/tiny.yaml").model.preset == "tiny"


@pytest.mark.parametrize("override, message", [
    (["zero.stage=0", "train.precision=bf16"], "bf16 without ZeRO"),
    (["optimizer.name=lamb", "zero.stage=2", "train.precision=fp16"], "trust ratio per parameter tensor"),
    (["train.max_steps=50"], "schedule.total_steps"),
    (["zero.offload_param=cpu", "zero.stage=2"], "offload_param needs zero stage 3"),
    (["train.micro_batch_size=48"], "not a multiple of micro_batch_size"),
    (["train.bogus=1"], "unknown key 'train.bogus'"),
    (["output_dir=s3://bucket/run"], "object-store URI; checkpoints are written as files"),
])
def test_inconsistent_settings_are_refused_with_the_reason(override, message):
    with pytest.raises(ConfigError, match=message):
        config.load("configs/pretrain/tiny.yaml", override)
