"""``compile`` in finetuning (``TrainingConfig.compile``, ``pretrain.compiling``): the compiled task model takes the
eager model's steps, plain and under DeepSpeed, and a GLUE task through ``python -m finetune`` scores the same.

Tolerance: fp32 on CPU, dropout off, 1e-4 relative (the weights after every step also to 1e-4 of each tensor's
largest entry): the compiled kernels sum in another order, so the runs agree to rounding, not to the bit.
Compiling the model (training and evaluation graphs) takes most of these tests' time; it is what they test.
"""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports DeepSpeed
import json

import numpy as np
import pytest
import torch

from finetune import cli
from finetune.heads import SequenceClassifier, pad_batch
from models.bert.model import BertModel, preset
from pretrain import compiling
from tests.conftest import require
from tests.finetune.test_trainer import _train

TOLERANCE = 1e-4


def _assert_same_weights(compiled: dict, eager: dict) -> None:
    assert list(compiled) == list(eager)  # no "_orig_mod." prefix: checkpoints and exports keep their names
    for name, value in eager.items():
        atol = TOLERANCE * max(value.abs().max().item(), 1e-6)
        torch.testing.assert_close(compiled[name], value, rtol=TOLERANCE, atol=atol, msg=name)


@pytest.mark.parametrize("stage", [-1, 1])
def test_a_compiled_model_takes_the_eager_steps(tmp_path, stage, caplog):
    caplog.set_level("INFO", logger="finetune")
    eager_result, eager = _train(tmp_path / "eager", deepspeed_zero_stage=stage)
    result, weights = _train(tmp_path / "compiled", deepspeed_zero_stage=stage, compile=True)
    assert result.steps == eager_result.steps == 12  # widths 8 and 16, a last batch of 0 rows short of 16
    _assert_same_weights(weights, eager)
    assert result.metrics["accuracy"] == eager_result.metrics["accuracy"]
    assert caplog.text.count("model.compile: torch.compile (inductor, dynamic shapes) of SequenceClassifier") == 1


def test_batches_of_new_widths_compile_no_new_graphs():
    """The padding-free encoder (the heads' default) breaks the graph where ``Unpadding`` reads its data-dependent
    sizes, so one forward is a few graphs; with dynamic shapes they are compiled for the first batches and serve every
    later width and batch size."""
    torch.manual_seed(0)
    model = compiling.compile_module(SequenceClassifier(BertModel(preset("tiny", vocab_size=64)), 2, dropout=0.0))
    rng = np.random.default_rng(0)
    widths, counts = set(), []
    for size in (16, 16, 16, 12, 16, 7, 16, 16, 3, 16):
        longest = int(rng.integers(3, 60))
        rows = [{"input_ids": [2, *rng.integers(5, 60, size=int(rng.integers(2, longest + 1))).tolist(), 3],
                 "labels": int(rng.integers(0, 2))} for _ in range(size)]
        for row in rows:
            row["token_type_ids"] = [0] * len(row["input_ids"])
        batch = pad_batch(rows, pad_id=0)
        widths.add(batch["input_ids"].shape[1])
        loss, _ = model(**batch)
        loss.backward()
        counts.append(compiling.graphs_compiled())
    assert len(widths) >= 3 and counts[-1] == counts[1] > 0  # nothing compiled after the second batch


def test_a_glue_task_compiled_scores_what_it_scores_eagerly(minilm_dir, shared_data, tmp_path):
    """SST-2 (64 training examples, four steps of MiniLM, 64 dev examples) through ``python -m finetune``."""
    data = tmp_path / "data"
    (data / "glue").mkdir(parents=True)
    os.symlink(require(shared_data / "glue" / "SST-2", "GLUE SST-2"), data / "glue" / "SST-2")
    settings = ["seeds=[1]", "glue.training.max_train_examples=64", "glue.training.max_eval_examples=64",
                "glue.training.epochs=1", "glue.training.batch_size=16", "glue.training.lr=1e-4",
                "glue.training.dropout=0.0", "glue.training.precision=fp32"]
    reports = {}
    for switch in ("false", "true"):
        out = tmp_path / f"out-{switch}"
        argv = ["glue", "--checkpoint", str(minilm_dir), "--data", str(data), "--output", str(out), "--tasks", "sst2",
                *[a for s in [*settings, f"glue.training.compile={switch}"] for a in ("--set", s)]]
        assert cli.main(argv) == 0
        reports[switch] = json.loads((out / "report.json").read_text())["results"][0]
    eager, compiled = (reports[s]["runs"][0] for s in ("false", "true"))
    np.testing.assert_allclose(compiled["metrics"]["accuracy"], eager["metrics"]["accuracy"], rtol=TOLERANCE)
    losses = {s: [json.loads(line)["loss"] for line in (tmp_path / f"out-{s}" / "logs" / "sst2-seed1.jsonl")
                  .read_text().splitlines() if '"loss"' in line] for s in ("false", "true")}
    assert len(losses["false"]) == 1  # the last step's
    np.testing.assert_allclose(losses["true"], losses["false"], rtol=TOLERANCE)
