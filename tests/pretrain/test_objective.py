"""The sentence objective: NSP and SOP train the same two-way head on the rows' labels and are logged under their
own names; ``none`` trains no pair loss (the head and pooler get no gradient) and logs no pair metric."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models.bert.hf import load_pretrained
from models.bert.model import BertConfig, BertForPreTraining
from pretrain import config, loop, train
from pretrain.families.bert import BertFamily
from pretrain.families.bert_loss import STAT_NAMES, PretrainingLoss
from pretrain.monitor import format_line
from tests.pretrain.launching import TINY, settings

CONFIG = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def _batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (4, 16), generator=generator)
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
            "masked_positions": torch.tensor([1, 20, 35, 50]), "masked_labels": torch.tensor([7, 8, 9, 10]),
            "next_sentence_labels": torch.tensor([0, 1, 1, 0]), "mlm_loss_scale": torch.tensor(0.25)}


@pytest.mark.parametrize("objective", ["nsp", "sop", "none"])
def test_the_pair_loss_is_trained_only_when_the_objective_has_one(objective):
    torch.manual_seed(0)
    model = BertForPreTraining(CONFIG).eval()  # no dropout: the loss is recomputed below
    batch = _batch()
    loss, stats = PretrainingLoss(model, objective)(**batch)
    loss.backward()
    s = dict(zip(STAT_NAMES, stats.tolist()))
    with torch.no_grad():
        mlm, pair = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                          batch["masked_positions"])
    mlm_loss = F.cross_entropy(mlm, batch["masked_labels"], reduction="sum") * 0.25
    untouched = ["cls.seq_relationship.weight", "cls.seq_relationship.bias", "bert.pooler.dense.weight"]
    grads = {name: p.grad for name, p in model.named_parameters()}
    if objective == "none":
        assert loss.item() == pytest.approx(mlm_loss.item(), rel=1e-6)
        assert s["pair_sequences"] == s["pair_loss_sum"] == s["pair_correct"] == 0 and s["sequences"] == 4
        assert all(grads[name] is None for name in untouched)
    else:
        pair_loss = F.cross_entropy(pair, batch["next_sentence_labels"])
        assert loss.item() == pytest.approx((mlm_loss + pair_loss).item(), rel=1e-6)
        assert s["pair_sequences"] == 4 and s["pair_loss_sum"] == pytest.approx(4 * pair_loss.item(), rel=1e-5)
        assert all(grads[name].abs().sum() > 0 for name in untouched)
    with pytest.raises(ValueError, match="choose nsp, sop or none"):
        PretrainingLoss(model, "mlm_only")


def _record(objective):
    stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64)
    values = {"mlm_loss_sum": 20.0, "mlm_tokens": 10.0, "mlm_correct": 1.0, "sequences": 4.0, "tokens": 64.0}
    if objective != "none":
        values.update(pair_loss_sum=2.0, pair_correct=3.0, pair_sequences=4.0)
    for name, value in values.items():
        stats[STAT_NAMES.index(name)] = value
    family = BertFamily.from_config(config.load(TINY, [f"objective.sentence_objective={objective}"]))
    return loop.metrics(stats, family, step=1, lr=1e-3, grad_norm=1.0, loss_scale=1.0, skipped=0, elapsed=1.0,
                        consumed=4, flops_per_token=1.0, peak_tflops=None, world=1)


def test_records_name_the_pair_objective_and_leave_it_out_when_there_is_none():
    nsp, sop, none = _record("nsp"), _record("sop"), _record("none")
    assert (nsp["nsp_loss"], nsp["nsp_accuracy"], nsp["loss"]) == (0.5, 0.75, 2.5)
    assert (sop["sop_loss"], sop["sop_accuracy"]) == (0.5, 0.75) and "nsp_loss" not in sop
    assert none["loss"] == none["mlm_loss"] == 2.0
    assert not [key for key in none if key.startswith(("nsp", "sop", "pair"))]
    assert "sop 0.5000 (acc 0.750)" in format_line(sop) and "nsp" not in format_line(sop)
    assert "nsp" not in format_line(none) and "sop" not in format_line(none)


def test_without_a_pair_objective_the_head_is_left_to_weight_decay(one_rank, synthetic_dataset, tmp_path):
    """A RoBERTa-style run: packed rows, no pair loss. The exported pair head and pooler are their initial
    values times the decoupled weight decay of each step (DeepSpeed steps every parameter; none had a gradient)."""
    dataset = synthetic_dataset(2_000, kind="full_sentences", masking="dynamic", document_tokens=60)
    out = tmp_path / "run"
    cfg = config.load(TINY, [a for a in settings(dataset, out, steps=4, **{
        "objective.masking": "dynamic", "objective.sentence_objective": "none", "checkpoint.export_hf": "true",
        "train.precision": "fp32", "zero.stage": 0}) if a != "--set"])
    torch.manual_seed(cfg.seed)
    from common.manifest import Manifest

    initial = train.build_model(cfg, Manifest.read(dataset)).state_dict()
    assert train.run(cfg, one_rank, resume=False) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(not [k for k in r if k.startswith(("nsp", "sop"))] and r["loss"] == r["mlm_loss"] for r in records)
    final = load_pretrained(out / "hf")[0].state_dict()
    decay = np.prod([1 - r["lr"] * cfg.optimizer.weight_decay for r in records])
    for name in ("cls.seq_relationship.weight", "bert.pooler.dense.weight"):
        torch.testing.assert_close(final[name], initial[name] * decay, rtol=1e-5, atol=1e-7)
    for name in ("cls.seq_relationship.bias", "bert.pooler.dense.bias"):  # no decay on biases
        assert torch.equal(final[name], initial[name])
    assert not torch.allclose(final["bert.encoder.layer.0.attention.self.query.weight"],
                              initial["bert.encoder.layer.0.attention.self.query.weight"] * decay, atol=1e-4)


def test_the_mfu_estimate_counts_the_mlm_head_on_the_share_of_tokens_it_predicted():
    stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64)
    stats[STAT_NAMES.index("mlm_tokens")], stats[STAT_NAMES.index("tokens")] = 300.0, 1000.0
    assert loop.masked_fraction(stats, STAT_NAMES) == 0.3  # a 30% recipe's head does twice the FLOPs of BERT's 15%
