"""The model-state memory estimate (pretrain/memory.py): the ZeRO paper's figures, our DeepSpeed extras, and
the parameter count of the real model configs."""
import pytest

from models.bert.model import count_parameters, preset
from pretrain import config, memory

PHASE1 = "configs/pretrain/bert_large_phase1_seq128.yaml"
BERT_LARGE = 336_226_108  # transformers.BertForPreTraining(bert-large-uncased config).num_parameters()


def test_parameter_count_is_the_models_and_matches_transformers():
    import torch
    import transformers

    large = preset("large", vocab_size=30522)
    assert count_parameters(large) == BERT_LARGE
    with torch.device("meta"):
        theirs = transformers.BertForPreTraining(transformers.BertConfig(
            vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096))
    assert sum(p.numel() for p in theirs.parameters()) == BERT_LARGE
    # The run rounds the dataset's vocabulary up to a multiple of 8: 6 more rows of the embedding and the MLM bias.
    assert count_parameters(preset("large", vocab_size=30528)) == BERT_LARGE + 6 * (1024 + 1)


@pytest.mark.parametrize("stage, gigabytes", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_the_zero_papers_figure_1(stage, gigabytes):
    """Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 GPUs, mixed precision Adam (K = 12)."""
    found = memory.estimate(7_500_000_000, world_size=64, zero_stage=stage, precision="fp16")
    assert found.device_bytes / 1e9 == pytest.approx(gigabytes, abs=0.05)
    assert found.host_bytes == 0 and found.row("fp32 gradient accumulation").device_bytes == 0


def test_bert_large_zero2_bf16_adam_per_parameter_bytes():
    """Params 2 bytes, gradients 2/N, optimizer states 12/N (fp32 master 4 + two moments 8), and DeepSpeed's
    fp32 gradient accumulation partition 4/N that our bf16 config asks for."""
    n, ranks = BERT_LARGE, 2
    found = memory.estimate(n, world_size=ranks, zero_stage=2, precision="bf16", optimizer="adamw")
    assert found.row("parameters").device_bytes == 2 * n
    assert found.row("gradients").device_bytes == 2 * n / ranks
    assert found.row("optimizer states").device_bytes == 12 * n / ranks
    assert found.row("fp32 gradient accumulation").device_bytes == 4 * n / ranks
    assert found.paper_bytes == (2 + 14 / ranks) * n
    assert found.device_bytes == (2 + 18 / ranks) * n


def test_precision_stage_optimizer_and_offload_variants():
    n = 1000
    fp32 = memory.estimate(n, world_size=4, zero_stage=0, precision="fp32")
    assert fp32.device_bytes == 16 * n  # no master copy: weights 4, gradients 4, moments 8
    lamb = memory.estimate(n, world_size=4, zero_stage=0, precision="fp16", optimizer="lamb")
    assert lamb.device_bytes == 16 * n  # LAMB keeps Adam's two moments
    stage1 = memory.estimate(n, world_size=4, zero_stage=1, precision="bf16")
    assert stage1.row("fp32 gradient accumulation").device_bytes == 4 * n  # BF16_Optimizer: the whole model
    stage3 = memory.estimate(n, world_size=4, zero_stage=3, precision="bf16")
    assert (stage3.row("parameters").device_bytes, stage3.row("gradients").device_bytes) == (2 * n / 4, 4 * n / 4)
    offload = memory.estimate(n, world_size=4, zero_stage=2, precision="bf16", offload_optimizer=True)
    assert offload.device_bytes == (2 + 2 / 4) * n and offload.host_bytes == (12 + 4) * n / 4
    everything = memory.estimate(n, world_size=4, zero_stage=3, precision="fp16", offload_optimizer=True,
                                 offload_param=True)
    assert everything.device_bytes == 0 and everything.host_bytes == 16 * n / 4
    with pytest.raises(ValueError, match="zero stage"):
        memory.estimate(n, world_size=4, zero_stage=4, precision="bf16")


def test_the_run_config_decides_model_size_and_accounting(minilm_dir):
    cfg = config.load(PHASE1, ["zero.stage=2", "train.precision=bf16", "optimizer.name=adamw"])
    found = memory.estimate_for_run(cfg, world_size=8, vocab_size=30522)
    assert found.parameters == BERT_LARGE + 6 * (1024 + 1) and (found.zero_stage, found.precision) == (2, "bf16")
    assert "total" in found.table() and "ZeRO 2, bf16, adamw, 8 data-parallel ranks" in found.table()
    warm = config.load(PHASE1, [f"model.init_from={minilm_dir}"])  # the checkpoint's config, not the preset
    assert memory.planned_model_config(warm.model, 30522).hidden_size == 384
