"""ELECTRA through ``pretrain/run.py``: each shipped config trains, the metrics are ELECTRA's (MFU from the pair's
FLOPs), the end-of-run export is the discriminator that transformers and finetuning load, a checkpoint exports to
the same directory, ``init_from`` continues the pair, and a resumed run on 2 ranks repeats every loss bit for bit."""
from __future__ import annotations

import json
import math
import pathlib
import shutil

import pytest
import torch

from common.errors import CheckpointError
from common.manifest import Manifest
from models.electra.hf import GENERATOR, load_pair
from models.electra.model import flops_per_token
from models.hf_io import load_weights
from pretrain import config, families, train
from pretrain.monitor import format_line
from tests.pretrain.launching import launch, losses, settings

CONFIGS = pathlib.Path(__file__).resolve().parents[3] / "configs" / "pretrain"
SAMPLES = pathlib.Path(__file__).resolve().parents[3] / "samples"
SHIPPED = ("electra_small", "electra_base")
ELECTRA_METRICS = ("loss", "mlm_loss", "mlm_accuracy", "disc_loss", "disc_accuracy", "replaced_fraction",
                   "replaced_recall")
TINY_RUN = {"model.preset": "electra_tiny", "model.max_position_embeddings": 128, "train.max_steps": 3,
            "schedule.total_steps": 3, "schedule.warmup_steps": 1, "train.global_batch_size": 16,
            "train.micro_batch_size": 8, "data.window_batches": 1, "optimizer.torch_adam": "true",
            "checkpoint.every_steps": 0, "checkpoint.export_hf": "true", "logging.log_every": 1,
            "logging.tensorboard": "false", "logging.progress": "false", "logging.peak_tflops": 1.0}


def _dataset(synthetic_dataset) -> pathlib.Path:
    """Rows of the shipped configs' kind: one document each, stored unmasked."""
    return synthetic_dataset(600, kind="doc_sentences", masking="dynamic", document_tokens=200)


def _records(run: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def small_run(one_rank, synthetic_dataset, tmp_path_factory) -> tuple[config.PretrainConfig, pathlib.Path]:
    """electra_small.yaml at the tiny preset, 3 steps, exported at the end (fp32 masters of a bf16 run)."""
    out = tmp_path_factory.mktemp("electra") / "run"
    overrides = {**TINY_RUN, "data.path": _dataset(synthetic_dataset), "output_dir": out}
    cfg = config.load(CONFIGS / "electra_small.yaml", [f"{k}={v}" for k, v in overrides.items()])
    assert train.run(cfg, one_rank, resume=False) == 0
    return cfg, out


def test_the_shipped_configs_are_the_papers():
    small, base = (config.load(CONFIGS / f"{name}.yaml") for name in SHIPPED)
    assert (small.model.family, small.model.preset, base.model.preset) == ("electra", "electra_small", "electra_base")
    assert (small.train.global_batch_size, small.optimizer.lr, small.train.max_steps) == (128, 5e-4, 1_000_000)
    assert (base.train.global_batch_size, base.optimizer.lr, base.train.max_steps) == (256, 2e-4, 766_000)
    assert (small.electra.generator_fraction, base.electra.generator_fraction) == (0.25, pytest.approx(1 / 3))
    for cfg in (small, base):
        assert cfg.electra.discriminator_weight == 50.0 and cfg.schedule.warmup_steps == 10_000
        assert (cfg.objective.masked_lm_prob, cfg.objective.mask_token_fraction) == (0.15, 0.85)
        assert cfg.objective.random_token_fraction == 0.0 and cfg.optimizer.weight_decay == 0.01


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_config_trains_a_few_steps_with_electras_metrics(name, one_rank, synthetic_dataset, tmp_path,
                                                                   small_run):
    if name == "electra_small":
        cfg, out = small_run
    else:
        out = tmp_path / "run"
        overrides = {**TINY_RUN, "data.path": _dataset(synthetic_dataset), "output_dir": out,
                     "checkpoint.export_hf": "false"}
        cfg = config.load(CONFIGS / f"{name}.yaml", [f"{k}={v}" for k, v in overrides.items()])
        assert train.run(cfg, one_rank, resume=False) == 0
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    pair = families.for_config(cfg).new_model(vocab_size=30528, pad_token_id=0).config
    for record in records:
        assert all(math.isfinite(record[key]) for key in ELECTRA_METRICS), record
        assert record["loss"] == pytest.approx(record["mlm_loss"] + 50.0 * record["disc_loss"], rel=1e-6)
        assert 0.0 < record["replaced_fraction"] < 0.2  # 15% masked, nearly all replaced by a fresh generator
        assert "disc" in format_line(record) and "nsp" not in format_line(record)
        # MFU: tokens/s x the pair's FLOPs per token (generator + discriminator) / peak, at the step's padded width.
        implied = record["mfu"] * 1.0e12 / record["tokens_per_second"]
        masked = record["replaced_fraction"] / record["masked_replaced_fraction"]  # masked / real tokens
        widths = [w for w in range(8, 129) if flops_per_token(pair, w, masked) == pytest.approx(implied, rel=1e-6)]
        assert widths, (implied, flops_per_token(pair, 128, masked))
    assert records[-1]["loss"] < records[0]["loss"]


def test_the_export_is_the_discriminator_transformers_loads_with_equal_outputs(small_run):
    import transformers

    _, out = small_run
    pair, fresh = load_pair(out / "hf")
    assert not fresh
    ids = torch.randint(1000, 30000, (2, 24), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, -6:] = 0
    types = torch.zeros_like(ids)
    real = mask.bool()
    discriminator = transformers.ElectraForPreTraining.from_pretrained(str(out / "hf")).eval()
    generator = transformers.ElectraForMaskedLM.from_pretrained(str(out / "hf" / GENERATOR)).eval()
    pair.eval()
    with torch.no_grad():
        theirs = discriminator(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(pair.discriminator(ids, types, mask)[real], theirs[real], rtol=1e-5, atol=1e-5)
        theirs = generator(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(pair.generator(ids, types, mask)[real], theirs[real], rtol=1e-5, atol=1e-5)
    assert (out / "hf" / "tokenizer").is_dir() and (out / "hf" / GENERATOR / "tokenizer").is_dir()


def test_a_checkpoint_exports_to_the_runs_export(small_run, tmp_path):
    from pretrain.export import export_checkpoint

    _, out = small_run
    export_checkpoint(out, tmp_path / "hf")
    for directory in (pathlib.Path(), pathlib.Path(GENERATOR)):
        want, got = load_weights(out / "hf" / directory), load_weights(tmp_path / "hf" / directory)
        assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_init_from_continues_the_pair_or_gives_a_discriminator_a_new_generator(small_run, tmp_path):
    cfg, out = small_run
    family = families.for_config(cfg)
    pair, fresh = family.load_model(out / "hf")
    assert not fresh and torch.equal(pair.generator.generator_lm_head.bias,
                                     load_weights(out / "hf" / GENERATOR)["generator_lm_head.bias"])
    alone = tmp_path / "discriminator"
    shutil.copytree(out / "hf", alone, ignore=shutil.ignore_patterns(GENERATOR))
    pair, fresh = family.load_model(alone)
    assert fresh == [f"the generator (no {alone / GENERATOR}; its embeddings are the discriminator's)"]
    assert pair.discriminator.electra.embeddings is pair.generator.electra.embeddings
    other = tmp_path / "mixed"
    shutil.copytree(out / "hf", other)
    from safetensors.torch import save_file

    state = load_weights(other / GENERATOR)
    state["electra.embeddings.LayerNorm.bias"] = state["electra.embeddings.LayerNorm.bias"] + 1
    save_file(state, str(other / GENERATOR / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"generator: its embeddings .* are not the discriminator's"):
        family.load_model(other)


def test_the_export_finetunes_on_glue(small_run, tmp_path):
    from finetune import cli

    _, out = small_run
    report = tmp_path / "report"
    argv = ["glue", "--checkpoint", str(out), "--tasks", "sst2", "--data", str(SAMPLES),
            "--config", "configs/finetune/tiny.yaml", "--output", str(report),
            "--set", "seeds=[3]", "--set", "glue.training.epochs=1"]
    assert cli.main(argv) == 0
    (result,) = json.loads((report / "report.json").read_text())["results"]
    assert result["runs"][0]["steps"] > 0 and math.isfinite(result["mean"]["accuracy"])


def test_sample_seeds_differ_per_rank_micro_batch_and_step_and_are_the_same_in_a_resumed_run(small_run):
    cfg, _ = small_run
    family = families.for_config(cfg)
    keys = [(step, micro, rank) for step in range(4) for micro in range(3) for rank in range(2)]
    seeds = [family.micro_batch_inputs(step=s, micro=m, rank=r)["sample_seed"] for s, m, r in keys]
    assert len(set(seeds)) == len(keys) and all(0 <= seed < 2**63 for seed in seeds)
    resumed = families.for_config(cfg)  # a new process builds its family anew
    assert [resumed.micro_batch_inputs(step=s, micro=m, rank=r)["sample_seed"] for s, m, r in keys] == seeds
    other = families.for_config(config.load(CONFIGS / "electra_small.yaml", ["seed=1"]))
    assert other.micro_batch_inputs(step=0, micro=0, rank=0)["sample_seed"] != seeds[0]


def test_the_losses_are_global_batch_means_however_the_batch_is_split():
    """Two micro-batches with the loader's scales (micro-batches / masked tokens, micro-batches / real tokens of the
    global batch), averaged as DeepSpeed averages them, give the loss of the whole batch at once."""
    from models.electra.model import ElectraPair, preset
    from pretrain.families.electra import ElectraPretrainingLoss

    torch.manual_seed(0)
    objective = ElectraPretrainingLoss(ElectraPair(preset("electra_tiny", vocab_size=120,
                                                               hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0)))
    ids = torch.randint(5, 120, (4, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:], mask[2, 9:] = 0, 0
    chosen = [torch.tensor([1, 3]), torch.tensor([2]), torch.tensor([0, 4, 7, 8]), torch.tensor([6])]
    rows = [{"input_ids": ids[i:i + 1].clone(), "token_type_ids": torch.zeros_like(ids[i:i + 1]),
             "attention_mask": mask[i:i + 1], "masked_positions": chosen[i], "masked_labels": ids[i, chosen[i]]}
            for i in range(4)]
    for row in rows:
        row["input_ids"][0, row["masked_positions"]] = 4

    def batch(part: list[dict], micro_batches: int) -> dict:
        width = part[0]["input_ids"].shape[1]
        positions = torch.cat([r["masked_positions"] + i * width for i, r in enumerate(part)])
        return {"input_ids": torch.cat([r["input_ids"] for r in part]),
                "token_type_ids": torch.cat([r["token_type_ids"] for r in part]),
                "attention_mask": torch.cat([r["attention_mask"] for r in part]), "masked_positions": positions,
                "masked_labels": torch.cat([r["masked_labels"] for r in part]),
                "mlm_loss_scale": torch.tensor(micro_batches / 8), "token_loss_scale": torch.tensor(
                    micro_batches / float(mask.sum())), "next_sentence_labels": torch.zeros(len(part))}

    # Sampling draws per micro-batch, so compare at a generator that always samples token 4 ([MASK] here): the
    # discriminator then sees the same input in both splits. Its losses stay of the size of the generator's.
    with torch.no_grad():
        objective.model.generator.generator_lm_head.bias.zero_()[4] = 30.0
    whole, _ = objective(**batch(rows, 1), sample_seed=1)
    halves = [objective(**batch(rows[:2], 2), sample_seed=2)[0], objective(**batch(rows[2:], 2), sample_seed=3)[0]]
    torch.testing.assert_close(sum(halves) / 2, whole, rtol=1e-5, atol=1e-6)


def test_what_the_family_cannot_train_is_refused():
    with pytest.raises(ValueError, match=r"model.preset 'base' is not an ELECTRA preset; choose one of electra_base"):
        families.for_config(config.load(CONFIGS / "electra_small.yaml", ["model.preset=base"]))
    with pytest.raises(ValueError, match=r"model.padding_free is not implemented for model.family electra"):
        families.for_config(config.load(CONFIGS / "electra_small.yaml", ["model.padding_free=true"]))


def test_document_attention_trains(one_rank, synthetic_dataset, tmp_path):
    """Packed rows with documents kept apart: the loader's document_ids and position_ids reach both networks."""
    dataset = synthetic_dataset(600, kind="full_sentences", masking="dynamic", document_tokens=40)
    overrides = {**TINY_RUN, "data.path": dataset, "output_dir": tmp_path / "run", "objective.attention": "document",
                 "checkpoint.export_hf": "false", "train.max_steps": 2, "schedule.total_steps": 2}
    cfg = config.load(CONFIGS / "electra_small.yaml", [f"{k}={v}" for k, v in overrides.items()])
    assert train.run(cfg, one_rank, resume=False) == 0
    assert all(math.isfinite(r["disc_loss"]) for r in _records(tmp_path / "run"))


def test_a_resumed_run_on_two_ranks_repeats_every_loss_bitwise(synthetic_dataset, tmp_path):
    """Dropout on and bf16 at ZeRO 1 (micro-batches of 4 rows: quick where bf16 is emulated): the ranks' RNG states,
    the loader and the sampling seeds must all resume. Two 2-rank launches are what the claim is about."""
    dataset = synthetic_dataset(600, kind="full_sentences", masking="dynamic", document_tokens=60)
    common = {"model.family": "electra", "model.preset": "electra_tiny", "objective.masking": "dynamic",
              "objective.sentence_objective": "none", "zero.stage": 1, "train.precision": "bf16",
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
        assert all(record[k] == want[record["step"]][k] for k in ELECTRA_METRICS), (record, want[record["step"]])


def test_memory_plan_counts_the_pair(synthetic_dataset):
    from pretrain import memory

    cfg = config.load(CONFIGS / "electra_base.yaml")
    pair = families.for_config(cfg).new_model(vocab_size=30528, pad_token_id=0)
    estimate = memory.estimate_for_run(cfg, world_size=8, vocab_size=Manifest.read(_dataset(synthetic_dataset))
                                       .tokenizer.vocab_size)
    assert estimate.parameters == sum(p.numel() for p in pair.parameters())
