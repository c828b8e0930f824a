"""ALBERT trained by the pretraining pipeline (``pretrain.families.albert``): the shipped albert_base recipe trains
(a tiny preset on a synthetic SOP dataset), logs SOP metrics and an MFU of ALBERT's FLOPs, resumes bit for bit,
exports an ``AlbertForPreTraining`` that transformers runs with our outputs (offline export included), and the
exported run finetunes; padding-free ALBERT gives the padded losses and gradients."""
from __future__ import annotations

import json
import math
import pathlib
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers

from common.errors import CheckpointError
from models import attention
from models.albert import model as albert
from models.albert.hf import load_albert
from models.bert import model as model_module
from pretrain import config, families, train
from pretrain.data import PretrainingLoader, ShardedInstances
from pretrain.families.albert import AlbertFamily
from pretrain.families.bert_loss import STAT_NAMES
from tests.models.test_attention import _segment_by_segment

REPO = pathlib.Path(__file__).resolve().parents[3]
SHIPPED = REPO / "configs" / "pretrain" / "albert_base.yaml"
STEPS, CHECKPOINT_AT, PEAK_TFLOPS = 4, 2, 100.0
# albert_base.yaml made tiny: the paper's optimizer and schedule shape kept (LAMB at ZeRO 0, warm-up then linear
# decay); fp32 because DeepSpeed's CPU accelerator has no fp16; dropout on so that a resume must restore the RNG.
TINY = {"model.preset": "albert_tiny", "model.max_position_embeddings": 128, "model.hidden_dropout_prob": 0.1,
        "model.attention_probs_dropout_prob": 0.1, "train.max_steps": STEPS, "schedule.total_steps": STEPS,
        "schedule.warmup_steps": 1, "train.global_batch_size": 16, "train.micro_batch_size": 8,
        "train.precision": "fp32", "data.window_batches": 1, "optimizer.lr": 3e-3,
        "checkpoint.every_steps": CHECKPOINT_AT, "checkpoint.keep_last": 5, "logging.log_every": 1,
        "logging.tensorboard": "false", "logging.progress": "false", "logging.peak_tflops": PEAK_TFLOPS}


def _cfg(dataset: pathlib.Path, out: pathlib.Path, **more) -> config.PretrainConfig:
    values = {**TINY, "data.path": dataset, "output_dir": out, **more}
    return config.load(SHIPPED, [f"{key}={value}" for key, value in values.items()])


def _records(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def sop_dataset(synthetic_dataset) -> pathlib.Path:
    return synthetic_dataset(1_000, document_tokens=60, sentence_objective="sop", max_seq_length=128)


@pytest.fixture(scope="module")
def albert_run(sop_dataset, one_rank, tmp_path_factory):
    """One run of the shipped recipe, made tiny, with every FLOPs count the loop asked the family for."""
    out = tmp_path_factory.mktemp("albert") / "run"
    counted = []
    original = AlbertFamily.flops_per_token

    def counting(self, model, seq_len, masked_fraction):
        flops = original(self, model, seq_len, masked_fraction)
        counted.append((model.config, seq_len, masked_fraction, flops))
        return flops

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AlbertFamily, "flops_per_token", counting)
        assert train.run(_cfg(sop_dataset, out), one_rank, resume=False) == 0
    return out, counted


def test_the_shipped_config_is_the_papers_albert_base_recipe():
    cfg = config.load(SHIPPED)
    assert (cfg.model.family, cfg.model.preset, cfg.model.max_position_embeddings) == ("albert", "albert_base", 512)
    assert cfg.objective.sentence_objective == "sop" and cfg.data.path == "data/albert_sop_seq512"
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.train.global_batch_size) == ("lamb", 1.76e-3, 4096)
    assert (cfg.train.max_steps, cfg.schedule.warmup_steps, cfg.schedule.decay) == (125_000, 3125, "linear")
    assert cfg.zero.stage == 0 and cfg.checkpoint.export_hf
    assert isinstance(families.for_config(cfg), AlbertFamily)


def test_a_preset_that_is_not_albert_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"model.preset is 'base', not an ALBERT size; .* albert_tiny, albert_base"):
        families.for_config(config.load(SHIPPED, ["model.preset=base"]))


def test_the_run_logs_sop_metrics_and_an_mfu_of_albert_flops(albert_run):
    out, counted = albert_run
    records = _records(out)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)) and len(counted) == STEPS
    for record, (model_config, seq_len, masked_fraction, flops) in zip(records, counted):
        assert {"sop_loss", "sop_accuracy", "mlm_loss", "mlm_accuracy"} <= set(record) and "nsp_loss" not in record
        assert record["loss"] == pytest.approx(record["mlm_loss"] + record["sop_loss"], rel=1e-12)
        assert all(math.isfinite(record[k]) for k in ("loss", "sop_loss", "sop_accuracy", "mfu"))
        # The count is ALBERT's (every application of the shared group), at the step's width and masked share.
        assert flops == albert.flops_per_token(model_config, seq_len, masked_fraction=masked_fraction)
        assert 0 < seq_len <= 128 and 0.05 < masked_fraction < 0.3
        assert record["mfu"] == pytest.approx(record["tokens_per_second"] * flops / (PEAK_TFLOPS * 1e12), rel=1e-9)
    model_config, seq_len, masked_fraction, flops = counted[0]
    assert model_config.num_hidden_groups == 1 and model_config.num_hidden_layers == 2
    once = albert.flops_per_token(replace(model_config, num_hidden_layers=1), seq_len, masked_fraction)
    assert flops > once  # the one group's second application is counted too


def test_the_export_loads_in_transformers_with_equal_outputs_on_a_real_batch(albert_run, sop_dataset):
    out, _ = albert_run
    theirs, info = transformers.AlbertForPreTraining.from_pretrained(out / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours, fresh = load_albert(out / "hf")
    assert fresh == [] and ours.config.vocab_size == 30528 and ours.config.embedding_size == 64
    loader = PretrainingLoader(ShardedInstances(sop_dataset), micro_batch=8, accumulation=1, world_size=1, rank=0,
                               seed=3)
    batch = next(b for b in (loader.next_step()[0] for _ in range(50)) if (b["attention_mask"] == 0).any())
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}  # padded rows, as training sees them
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        expected = theirs.eval()(**inputs)
        mlm, sop = ours.eval()(*inputs.values())
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(mlm[real], expected.prediction_logits[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sop, expected.sop_logits, rtol=1e-5, atol=1e-5)


def test_the_offline_export_of_the_last_checkpoint_is_the_end_of_run_export(albert_run, tmp_path):
    from pretrain.export import main as export_main

    out, _ = albert_run
    assert export_main([str(out), str(tmp_path / "offline")]) == 0
    online = sorted(p.relative_to(out / "hf") for p in (out / "hf").rglob("*") if p.is_file())
    offline = sorted(p.relative_to(tmp_path / "offline") for p in (tmp_path / "offline").rglob("*") if p.is_file())
    assert online == offline and pathlib.Path("model.safetensors") in online
    for name in online:
        assert (out / "hf" / name).read_bytes() == (tmp_path / "offline" / name).read_bytes(), name


def test_a_resumed_run_repeats_the_uninterrupted_loss_curve_bitwise(albert_run, sop_dataset, one_rank, tmp_path):
    out, _ = albert_run
    part = tmp_path / "part"
    tag = f"step_{CHECKPOINT_AT:08d}"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "checkpoints" / tag, part / "checkpoints" / tag)
    assert train.run(_cfg(sop_dataset, part, **{"checkpoint.export_hf": "false"}), one_rank, resume=True) == 0
    want = {r["step"]: r for r in _records(out)}
    got = _records(part)
    assert [r["step"] for r in got] == list(range(CHECKPOINT_AT + 1, STEPS + 1))
    for record in got:
        for key in ("loss", "mlm_loss", "sop_loss", "sop_accuracy", "grad_norm"):
            assert record[key] == want[record["step"]][key], (record["step"], key)


def test_the_exported_run_finetunes_on_glue(albert_run, tmp_path):
    from finetune import cli

    out, _ = albert_run
    report_dir = tmp_path / "report"
    argv = ["glue", "--checkpoint", str(out), "--tasks", "sst2", "--data", str(REPO / "samples"),
            "--config", str(REPO / "configs" / "finetune" / "tiny.yaml"), "--output", str(report_dir),
            "--set", "seeds=[3]", "--set", "glue.training.epochs=1"]
    assert cli.main(argv) == 0
    (result,) = json.loads((report_dir / "report.json").read_text())["results"]
    assert result["task"] == "sst2" and result["runs"][0]["steps"] > 0
    assert all(math.isfinite(v) for v in result["mean"].values())


def _objectives(data: ShardedInstances, sentence: str, **more):
    """The padded and the padding-free objective of the family around models with equal initial weights."""
    made = []
    for padding_free in (False, True):
        values = {**TINY, "model.padding_free": padding_free, "objective.sentence_objective": sentence, **more}
        cfg = config.load(SHIPPED, [f"{k}={v}" for k, v in values.items()])
        family = families.for_config(cfg)
        torch.manual_seed(0)
        made.append(family.loss_module(family.new_model(vocab_size=-(-data.manifest.tokenizer.vocab_size // 8) * 8,
                                                      pad_token_id=0)).train())
    return made


def _step(objective, batch):
    torch.manual_seed(11)  # the same dropout masks in both modes (Unpadding.dropout draws the padded ones)
    loss, stats = objective(**batch)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in objective.model.named_parameters() if p.grad is not None}
    objective.zero_grad(set_to_none=True)
    return loss.detach(), stats, grads


@pytest.mark.parametrize("kernel", [attention.SDPA_PADDED_GRID, attention.VARLEN])
@pytest.mark.parametrize("documents", [False, True], ids=["pairs", "documents"])
def test_padding_free_albert_gives_the_padded_losses_and_gradients(synthetic_dataset, documents, kernel,
                                                                    monkeypatch):
    """Tolerance as tests/pretrain/test_padding_free.py states it (fp32): 1e-5 relative on the losses and
    statistics, and on each gradient 1e-5 of its largest entry; dropout 0.1 on (hidden only with varlen, which has
    no attention dropout: ALBERT v2's presets have none, so a CUDA run of them gets it). The varlen kernel is CUDA's:
    on CPU it is replaced by SDPA on each segment alone, as tests/models/test_attention.py does."""
    monkeypatch.setattr(model_module, "varlen_attention", _segment_by_segment)
    spec = ({"kind": "full_sentences", "document_tokens": 20, "sentence_objective": "none"} if documents
            else {"sentence_objective": "sop"})
    dataset = synthetic_dataset(300 if documents else 400, max_seq_length=64, max_predictions=10, **spec)
    data = ShardedInstances(dataset)
    loader = PretrainingLoader(data, micro_batch=8, accumulation=2, world_size=1, rank=0, seed=5,
                               document_attention=documents)
    batches = [{k: torch.from_numpy(np.asarray(v)) for k, v in b.items()} for b in loader.next_step()]
    assert any(bool((b["attention_mask"] == 0).any()) for b in batches)
    padded, free = _objectives(data, spec["sentence_objective"],
                                 **({"model.attention_probs_dropout_prob": 0.0} if kernel == attention.VARLEN else {}))
    assert attention.use(free.model, kernel) == 1  # the one shared group's attention, applied twice
    for batch in batches:
        loss, stats, grads = _step(padded, batch)
        free_loss, free_stats, free_grads = _step(free, batch)
        torch.testing.assert_close(free_loss, loss, rtol=1e-5, atol=0)
        torch.testing.assert_close(free_stats, stats, rtol=1e-5, atol=1e-5)
        assert free_grads.keys() == grads.keys()
        for name in sorted(n for n in grads if not n.endswith("attention.key.bias")):  # zero but for rounding
            atol = 1e-5 * grads[name].abs().max().item()
            torch.testing.assert_close(free_grads[name], grads[name], rtol=1e-5, atol=atol, msg=name)
        if not documents:
            assert grads["sop_classifier.classifier.weight"].abs().max() > 0
            assert stats[STAT_NAMES.index("pair_sequences")] == len(batch["input_ids"])
    if documents:
        assert any(int(b["document_ids"].max()) > 0 for b in batches)
        whole_rows = {k: v for k, v in batches[0].items() if k not in ("document_ids", "position_ids")}
        with torch.no_grad():  # document attention is in force: without the ids the loss is another
            assert abs(free(**whole_rows)[0] - free(**batches[0])[0]) > 1e-4


def test_activation_checkpointing_recomputes_the_shared_applications_with_equal_gradients(synthetic_dataset):
    data = ShardedInstances(synthetic_dataset(400, max_seq_length=64, max_predictions=10, sentence_objective="sop"))
    loader = PretrainingLoader(data, micro_batch=8, accumulation=1, world_size=1, rank=0, seed=5)
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in loader.next_step()[0].items()}
    padded, _ = _objectives(data, "sop")
    family = families.for_config(config.load(SHIPPED, ["model.preset=albert_tiny"]))
    _, _, plain = _step(padded, batch)
    family.set_activation_checkpointing(padded.model, True)
    assert padded.model.albert.encoder.gradient_checkpointing
    _, _, recomputed = _step(padded, batch)
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_weights_from_a_checkpoint_rebuild_the_model_flat_or_not_and_misfits_are_named(tmp_path):
    cfg = config.load(SHIPPED, ["model.preset=albert_tiny", "model.max_position_embeddings=96",
                                f"output_dir={tmp_path / 'run'}"])
    family = families.for_config(cfg)
    torch.manual_seed(0)
    model = family.new_model(vocab_size=304, pad_token_id=0)
    # As the engine consolidates: named_parameters (one name per tied tensor), flat under ZeRO 3.
    state = {name: p.detach().clone().reshape(-1) for name, p in model.named_parameters()}
    rebuilt = family.model_from_state(state)
    assert rebuilt.config == model.config
    assert rebuilt.predictions.decoder.weight is rebuilt.albert.embeddings.word_embeddings.weight
    assert all(torch.equal(rebuilt.state_dict()[k], v) for k, v in model.state_dict().items())
    del state["sop_classifier.classifier.bias"]
    with pytest.raises(CheckpointError, match="sop_classifier.classifier.bias"):
        family.model_from_state(state, model.config)


def test_init_from_loads_a_transformers_albert_directory(tmp_path):
    hf_config = transformers.AlbertConfig(vocab_size=304, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=96)
    torch.manual_seed(0)
    transformers.AlbertForPreTraining(hf_config).save_pretrained(tmp_path / "hf")
    cfg = config.load(SHIPPED, [f"model.init_from={tmp_path / 'hf'}", "model.preset=base"])  # the preset is unused
    family = families.for_config(cfg)
    model, fresh = family.load_model(tmp_path / "hf")
    assert fresh == [] and family.vocab_size(model) == 304 and family.positions(model) == 96
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert family.model_from_state(state).config == model.config  # the init_from directory's config


def test_a_padding_free_run_has_the_padded_runs_loss_curve(albert_run, sop_dataset, one_rank, tmp_path):
    """model.padding_free through pretrain.train (LAMB, dropout on): rounding differences only (rtol 1e-4, as
    tests/pretrain/test_padding_free.py allows BERT's curve over a few steps)."""
    out, _ = albert_run
    free = tmp_path / "padding-free"
    cfg = _cfg(sop_dataset, free, **{"model.padding_free": "true", "checkpoint.export_hf": "false",
                                      "checkpoint.every_steps": 0})
    assert train.run(cfg, one_rank, resume=False) == 0
    padded, padding_free = _records(out), _records(free)
    assert [r["step"] for r in padding_free] == [r["step"] for r in padded]
    for key in ("loss", "mlm_loss", "sop_loss"):
        np.testing.assert_allclose([r[key] for r in padding_free], [r[key] for r in padded], rtol=1e-4, err_msg=key)
