"""The finetuning loop: plain AdamW, and DeepSpeed ZeRO (optionally with CPU offload) taking the same steps."""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports DeepSpeed
import dataclasses

import numpy as np
import pytest
import torch

from finetune.config import TrainingConfig
from finetune.heads import SequenceClassifier
from finetune.trainer import finetune
from models.bert.model import BertModel, preset


def _rows(count: int, seed: int) -> list[dict]:
    """A learnable toy task: the label is whether token 7 occurs in the sequence."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        ids = [2, *rng.integers(5, 40, size=int(rng.integers(4, 12))).tolist(), 3]
        rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "labels": int(7 in ids)})
    return rows


def _train(tmp_path, **settings):
    torch.manual_seed(0)
    model = SequenceClassifier(BertModel(preset("tiny", vocab_size=64)), num_labels=2, dropout=0.0)
    for module in model.modules():  # deterministic steps, so that two optimizers can be compared
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for layer in model.bert.encoder.layer:
        layer.attention.self.dropout_p = 0.0
    cfg = dataclasses.replace(TrainingConfig(lr=1e-3, epochs=2, batch_size=16, precision="fp32",
                                             select_best_epoch=False), **settings)
    train, dev = _rows(96, 1), _rows(64, 2)

    def evaluate(m):
        m.eval()
        from finetune.heads import pad_batch

        batch = pad_batch([{k: r[k] for k in ("input_ids", "token_type_ids")} for r in dev], pad_id=0)
        with torch.no_grad():
            predicted = m(**batch).argmax(-1).numpy()
        accuracy = float((predicted == np.array([r["labels"] for r in dev])).mean())
        return {"accuracy": accuracy}, accuracy

    result = finetune(model, train, evaluate, cfg, seed=5, pad_id=0, log_dir=tmp_path / "logs", name="toy")
    return result, {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def test_plain_adamw_learns_the_toy_task(tmp_path):
    result, _ = _train(tmp_path, epochs=6)
    assert result.steps == 36 and [h["epoch"] for h in result.history] == list(range(6))
    assert result.metrics["accuracy"] > 0.8
    assert (tmp_path / "logs" / "toy-seed5.jsonl").read_text().count('"dev"') == 6


def test_bf16_autocast_learns_the_toy_task_too(tmp_path):
    """bf16 on purpose (tiny shapes: quick even where the CPU emulates it)."""
    result, weights = _train(tmp_path, epochs=6, precision="bf16")
    assert result.metrics["accuracy"] > 0.8 and all(bool(torch.isfinite(w).all()) for w in weights.values())


@pytest.mark.parametrize("stage, offload", [(2, False), (1, True)])
def test_deepspeed_zero_takes_the_same_steps_as_plain_adamw(tmp_path, stage, offload):
    plain_result, plain = _train(tmp_path / "plain")
    ds_result, ds = _train(tmp_path / "ds", deepspeed_zero_stage=stage, offload_optimizer=offload)
    assert ds_result.steps == plain_result.steps == 12
    for name, weight in plain.items():
        torch.testing.assert_close(ds[name], weight, rtol=1e-4, atol=1e-5, msg=name)
    assert ds_result.metrics == plain_result.metrics


def test_deepspeed_settings_are_checked():
    with pytest.raises(ValueError, match="ZeRO 3 would shard"):
        TrainingConfig(deepspeed_zero_stage=3)
    with pytest.raises(ValueError, match="offload_optimizer needs deepspeed_zero_stage 1 or 2"):
        TrainingConfig(offload_optimizer=True)


def test_a_task_head_starts_from_the_seed_whatever_the_process_drew_before(minilm_dir, tmp_path, monkeypatch):
    """torch seeds itself at random per process; the suite's first head was built before seeding, so two runs
    with the same seed started from different heads."""
    import pathlib

    from common.tokenizer import load_tokenizer
    from finetune import suite
    from finetune.config import FinetuneConfig

    heads = []

    def capture(model, *args, seed, **kwargs):
        heads.append(model.classifier.weight.detach().clone())
        raise StopIteration  # enough: the head as training would receive it

    monkeypatch.setattr(suite, "finetune", capture)
    tokenizer = load_tokenizer(str(minilm_dir / "vocab.txt"), lowercase=True)
    for noise in (1, 2):
        torch.manual_seed(noise)  # a different generator state before the task, as in another process
        with pytest.raises(StopIteration):
            suite.run_glue(["rte"], pathlib.Path(__file__).resolve().parents[2] / "samples", minilm_dir, tokenizer, FinetuneConfig(seeds=[7]), tmp_path / str(noise))
    assert torch.equal(heads[0], heads[1])
