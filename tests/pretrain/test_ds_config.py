"""The DeepSpeed JSON config (``pretrain.ds_config``) follows the run's config sections."""
import json

import pytest

from common.configlib import ConfigError
from pretrain import config
from pretrain.ds_config import deepspeed_config

PHASE1 = "configs/pretrain/bert_large_phase1_seq128.yaml"


def _deepspeed_config(cfg, plan, output_dir):
    return deepspeed_config(plan, output_dir, train=cfg.train, optimizer=cfg.optimizer, zero=cfg.zero,
                            logging=cfg.logging)


def test_deepspeed_config_follows_the_run_config(tmp_path):
    cfg = config.load("configs/pretrain/tiny.yaml", ["zero.stage=3", "zero.offload_optimizer=cpu", "train.precision=bf16",
                                                     "train.global_batch_size=256", "train.micro_batch_size=8"])
    plan = config.batch_plan(cfg.train, world_size=4)
    assert (plan.accumulation, plan.micro_batch) == (8, 8)
    ds = _deepspeed_config(cfg, plan, tmp_path)
    assert ds["train_batch_size"] == 256 == ds["train_micro_batch_size_per_gpu"] * 4 * ds["gradient_accumulation_steps"]
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["bf16"]["enabled"] and "fp16" not in ds and ds["optimizer"]["type"] == "AdamW"
    assert ds["gradient_clipping"] == 1.0 and ds["tensorboard"]["enabled"]
    phase1 = config.load(PHASE1, ["train.precision=fp16"])  # what auto resolves to on a GPU (LAMB at ZeRO 0)
    fp16 = _deepspeed_config(phase1, config.batch_plan(phase1.train, 512), tmp_path)
    assert fp16["fp16"]["loss_scale"] == 0 and fp16["fp16"]["initial_scale_power"] == 16  # dynamic scaling
    assert "optimizer" not in fp16  # LAMB is ours, handed to DeepSpeed as a client optimizer
    with pytest.raises(ConfigError, match="not a multiple"):
        config.batch_plan(cfg.train, world_size=3)
    with pytest.raises(ValueError, match="resolve it first"):  # auto is never handed to DeepSpeed unresolved
        _deepspeed_config(config.load(PHASE1), config.batch_plan(phase1.train, 512), tmp_path)
    json.dumps(ds)
