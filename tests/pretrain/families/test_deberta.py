"""DeBERTa-v3 through ``pretrain/run.py``: GDES checked by hand (the discriminator's loss reaches E_Delta, never the
generator's table), the loss falls over a few steps, the shipped configs are the paper's sizes and train, the export
is what transformers and finetuning load, and a resumed run on 2 ranks repeats every loss bit for bit."""
from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import torch

from models.deberta_v2.pair import DebertaPair, flops_per_token, preset
from pretrain import config, families, train
from pretrain.families.deberta_loss import DebertaPretrainingLoss
from tests.pretrain.launching import launch, losses, settings

CONFIGS = pathlib.Path(__file__).resolve().parents[3] / "configs" / "pretrain"
SHIPPED = ("deberta_v3_small", "deberta_v3_base")
METRICS = ("loss", "mlm_loss", "mlm_accuracy", "disc_loss", "disc_accuracy", "replaced_fraction", "replaced_recall")
TINY_RUN = {"model.preset": "deberta_v3_tiny", "model.max_position_embeddings": 128, "train.max_steps": 3,
            "schedule.total_steps": 3, "schedule.warmup_steps": 1, "train.global_batch_size": 8,
            "train.micro_batch_size": 4, "data.window_batches": 1, "optimizer.torch_adam": "true",
            "objective.max_predictions": 20, "train.precision": "fp32",
            "checkpoint.every_steps": 0, "checkpoint.export_hf": "true", "logging.log_every": 1,
            "logging.tensorboard": "false", "logging.progress": "false", "logging.peak_tflops": 1.0}
VOCAB = 100


def _batch(seed=0, batch=4, length=24):
    """A masked batch as the loader gives it: every 5th real token masked (id 4), the last row padded."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[-1, -6:] = 0
    ids[mask == 0] = 0
    positions = torch.nonzero(mask.reshape(-1)).squeeze(1)[2::5]
    labels = ids.reshape(-1)[positions].clone()
    ids.reshape(-1)[positions] = 4
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
            "masked_positions": positions, "masked_labels": labels}


def _loss(seed=0) -> DebertaPretrainingLoss:
    torch.manual_seed(seed)
    return DebertaPretrainingLoss(DebertaPair(preset("deberta_v3_tiny", vocab_size=VOCAB)))


def test_gdes_the_discriminator_trains_the_residual_and_never_the_generators_embeddings():
    loss = _loss()
    pair = loss.model
    generator_words = pair.generator.deberta.embeddings.word_embeddings.weight
    delta = pair.discriminator.deberta.embeddings.word_embeddings.delta
    assert not delta.any()  # E_Delta starts at zero: the discriminator starts from the generator's table
    torch.testing.assert_close(pair.discriminator.deberta.embeddings.word_embeddings.weight, generator_words)
    terms = loss.terms(**_batch(), sample_seed=3)
    terms.discriminator_loss.backward(retain_graph=True)
    assert generator_words.grad is None or not generator_words.grad.any()  # stop-gradient: nothing reaches E_G
    assert delta.grad is not None and delta.grad.abs().sum() > 0
    assert not delta.grad[0].any()  # the padding row learns nothing, as in any table with a padding_idx
    delta.grad = None
    terms.generator_loss.backward()
    assert generator_words.grad.abs().sum() > 0  # E_G learns from the generator's MLM loss...
    assert delta.grad is None or not delta.grad.any()  # ...which never reaches E_Delta


def test_a_few_steps_decrease_the_loss():
    loss = _loss(1)
    optimizer = torch.optim.Adam(loss.parameters(), lr=3e-3)
    batch, values = _batch(2), []
    scales = {"mlm_loss_scale": torch.tensor(1.0 / batch["masked_labels"].numel()),
              "token_loss_scale": 1.0 / batch["attention_mask"].sum()}  # each loss a mean over its tokens
    for step in range(12):
        total, _ = loss(**batch, **scales, sample_seed=step)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        values.append(float(total.detach()))
    assert values[-1] < 0.7 * values[0], values
    assert loss.model.discriminator.deberta.embeddings.word_embeddings.delta.abs().sum() > 0


def test_the_shipped_configs_are_the_papers_sizes():
    small, base = (config.load(CONFIGS / f"{name}.yaml") for name in SHIPPED)
    for cfg, layers in ((small, 6), (base, 12)):
        assert (cfg.model.family, cfg.electra.discriminator_weight) == ("deberta-v2", 50.0)
        pair = families.for_config(cfg).new_model(vocab_size=128100, pad_token_id=0).config
        d, g = pair.discriminator, pair.generator
        assert (d.num_hidden_layers, d.hidden_size, d.num_attention_heads, d.intermediate_size) == (layers, 768, 12,
                                                                                                    3072)
        assert (g.num_hidden_layers, g.hidden_size) == (layers // 2, 768)  # half depth, same width
        assert (d.position_buckets, d.max_relative, d.share_att_key, d.position_biased_input) == (256, 512, True,
                                                                                                 False)
        assert cfg.objective.sentence_objective == "none" and cfg.model.max_position_embeddings == 512


def test_what_the_family_cannot_train_is_refused_in_one_line():
    path = CONFIGS / "deberta_v3_small.yaml"
    for override, message in (("model.padding_free=true", "model.padding_free is not implemented for model.family "
                                                          "deberta-v2"),
                              ("electra.generator_fraction=0.5", "electra.generator_fraction is ELECTRA's"),
                              ("model.preset=electra_small", "not a DeBERTa-v3 preset")):
        with pytest.raises(ValueError, match=message):
            families.for_config(config.load(path, [override]))


def _records(run: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_shipped_config_trains_exports_and_the_export_loads(one_rank, synthetic_dataset, tmp_path):
    import transformers

    from finetune import pretrained

    out = tmp_path / "run"
    dataset = synthetic_dataset(200, kind="doc_sentences", masking="dynamic", document_tokens=100)
    overrides = {**TINY_RUN, "data.path": dataset, "output_dir": out}
    cfg = config.load(CONFIGS / "deberta_v3_small.yaml", [f"{k}={v}" for k, v in overrides.items()])
    assert train.run(cfg, one_rank, resume=False) == 0
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    pair = families.for_config(cfg).new_model(vocab_size=30528, pad_token_id=0).config
    for record in records:
        assert all(k in record for k in METRICS) and record["mfu"] > 0
    assert flops_per_token(pair, 128) > flops_per_token(pair, 64)  # the attention terms grow with the row
    encoder = transformers.AutoModel.from_pretrained(str(out / "hf"), torch_dtype=torch.float32).eval()
    ours = pretrained.load_encoder(out / "hf").eval()
    ids = torch.randint(5, 1000, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], encoder(input_ids=ids).last_hidden_state, rtol=1e-5, atol=1e-5)
    assert (out / "hf" / "generator" / "config.json").is_file()


def test_a_resumed_run_on_two_ranks_repeats_every_loss_bitwise(synthetic_dataset, tmp_path):
    """Dropout on, ZeRO 1, fp32: the ranks' RNG states, the loader and the sampling seeds must all resume."""
    dataset = synthetic_dataset(600, kind="full_sentences", masking="dynamic", document_tokens=60)
    common = {"model.family": "deberta-v2", "model.preset": "deberta_v3_tiny", "objective.masking": "dynamic",
              "objective.sentence_objective": "none", "zero.stage": 1, "train.precision": "fp32",
              "train.global_batch_size": 8, "train.micro_batch_size": 4,
              "checkpoint.every_steps": 2, "checkpoint.keep_last": 5}
    full, part = tmp_path / "full", tmp_path / "part"
    result = launch("torchrun", 2, settings(dataset, full, steps=4, **common))
    assert result.returncode == 0, result.stdout[-4000:]
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    result = launch("torchrun", 2, ["--resume", *settings(dataset, part, steps=4, **common)])
    assert result.returncode == 0 and "at step 2 (16 samples consumed) on 2 ranks" in result.stdout, result.stdout
    assert sorted(losses(part)) == [3, 4]
    want = {r["step"]: r for r in _records(full)}
    for record in _records(part):
        assert all(record[k] == want[record["step"]][k] for k in METRICS), (record, want[record["step"]])
