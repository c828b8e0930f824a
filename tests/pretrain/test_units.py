"""Pure pieces of the pretraining stage: config checks, the DeepSpeed config, rank discovery, checkpoint
bookkeeping and LAMB."""
import json

import pytest
import torch

from common.configlib import ConfigError
from pretrain import checkpoints, config
from pretrain.ds_config import deepspeed_config
from pretrain.lamb import Lamb
from pretrain.launch import expand_hostlist, from_environment

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
])
def test_inconsistent_settings_are_refused_with_the_reason(override, message):
    with pytest.raises(ConfigError, match=message):
        config.load("configs/pretrain/tiny.yaml", override)


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


def test_slurm_node_lists_expand():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("node-a[8-10]") == ["node-a8", "node-a9", "node-a10"]
    assert expand_hostlist("solo") == ["solo"]


def test_rank_discovery_for_each_launcher():
    torchrun = from_environment({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h0",
                                 "MASTER_PORT": "1234"})
    assert (torchrun.rank, torchrun.world_size, torchrun.local_rank, torchrun.master_addr) == (3, 8, 1, "h0")
    srun = from_environment({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
                             "SLURM_STEP_NODELIST": "gpu[12-15]", "SLURM_JOB_ID": "4242"})
    assert (srun.rank, srun.world_size, srun.local_rank, srun.master_addr, srun.master_port) == \
        (5, 16, 1, "gpu12", 20000 + 4242)
    assert srun.launcher == "srun"

    class FakeComm:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 4

        def bcast(self, value, root):
            return "10.0.0.7"

    mpi = from_environment({"PMI_SIZE": "4", "PMI_RANK": "1", "MPI_LOCALRANKID": "1"}, mpi_comm=FakeComm())
    assert (mpi.rank, mpi.world_size, mpi.local_rank, mpi.master_addr, mpi.launcher) == (1, 4, 1, "10.0.0.7", "mpi")
    single = from_environment({})
    assert (single.rank, single.world_size, single.launcher) == (0, 1, "single")


def test_only_marked_checkpoints_count_and_old_ones_are_pruned(tmp_path):
    for step in (10, 20, 30, 40):
        (tmp_path / checkpoints.tag_for(step)).mkdir()
        if step != 40:  # step 40's save never finished
            checkpoints.publish(tmp_path, checkpoints.tag_for(step), {"step": step, "world_size": 2})
    assert checkpoints.newest(tmp_path).step == 30
    (tmp_path / checkpoints.tag_for(5)).mkdir()  # an unfinished one from long ago
    removed = checkpoints.prune(tmp_path, keep_last=2)
    assert sorted(removed) == ["step_00000005", "step_00000010"]
    assert [c.step for c in checkpoints.complete(tmp_path)] == [20, 30]
    assert (tmp_path / "step_00000040").is_dir()  # newer than the newest complete: may still be in progress


def test_lamb_scales_each_update_to_its_layer_weight_norm():
    torch.manual_seed(0)
    big, small = torch.nn.Parameter(torch.randn(64, 64) * 10), torch.nn.Parameter(torch.randn(64) * 0.01)
    before = [big.detach().clone(), small.detach().clone()]
    optimizer = Lamb([big, small], lr=0.01, weight_decay=0.0)
    big.grad, small.grad = torch.randn(64, 64), torch.randn(64)
    optimizer.step()
    for param, old in zip((big, small), before):
        # First step: Adam's update is sign(grad) (norm sqrt(n)), rescaled to ||w||: the step is lr * ||w||.
        assert (param.detach() - old).norm() == pytest.approx(0.01 * old.norm(), rel=1e-3)
