"""Finetuning starts from our own DeepSpeed checkpoints (a run directory or one step), not only from HF directories."""
import json
import pathlib

import pytest

from finetune import cli, pretrained
from tests.finetune.glue_sample import ONE_SEED_ONE_EPOCH, sst2_argv
from tests.pretrain.conftest import sample_dataset  # noqa: F401  (the pretraining tests' small dataset)
from tests.pretrain.launching import launch, settings


@pytest.fixture(scope="module")
def zero2_run(sample_dataset, tmp_path_factory) -> pathlib.Path:
    """A tiny pretraining run on 2 ranks with ZeRO 2: checkpoints only (no hf/ export), as after a preemption."""
    out = tmp_path_factory.mktemp("zero2") / "run"
    result = launch("torchrun", 2, settings(sample_dataset, out, steps=4, **{"zero.stage": 2,
                                                                               "checkpoint.every_steps": 2}))
    assert result.returncode == 0, result.stdout[-3000:]
    assert not (out / "hf").exists()
    return out


def test_a_run_directory_resolves_to_its_newest_checkpoint_exported_once(zero2_run, tmp_path):
    exported = pretrained.resolve(zero2_run, tmp_path)
    assert exported.parent == tmp_path and exported.name.endswith("step_00000004")
    assert (exported / "model.safetensors").is_file() and (exported / "config.json").is_file()
    stamp = (exported / "model.safetensors").stat().st_mtime_ns
    assert pretrained.resolve(zero2_run, tmp_path) == exported  # a second call reuses the export
    assert (exported / "model.safetensors").stat().st_mtime_ns == stamp
    tokenizer = pretrained.load_tokenizer_for(exported)  # the run kept its tokenizer
    # The embedding is padded to a multiple of 8 rows; the tokenizer is the dataset's vocabulary.
    assert tokenizer.vocab_size == 30522 <= json.loads((exported / "config.json").read_text())["vocab_size"]
    older = pretrained.resolve(zero2_run / "checkpoints" / "step_00000002", tmp_path)
    assert older.name.endswith("step_00000002")


def test_glue_from_a_zero2_checkpoint_writes_a_report(zero2_run, tmp_path):
    out = tmp_path / "report"
    assert cli.main(sst2_argv(zero2_run, out, *ONE_SEED_ONE_EPOCH)) == 0
    report = json.loads((out / "report.json").read_text())
    (result,) = report["results"]
    assert result["task"] == "sst2" and result["seeds"] == [3]
    assert result["train_examples"] == 224 and result["eval_examples"] == 64
    assert 0.0 <= result["mean"]["accuracy"] <= 1.0
    assert report["checkpoint"] == str(zero2_run)
