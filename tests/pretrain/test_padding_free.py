"""Padding-free pretraining (``PretrainingLoss(padding_free=True)``, ``model.padding_free``) against the padded
step: the same losses, statistics and gradients, on the loader's real micro-batches of synthetic datasets.

Tolerance (fp32, CPU): 1e-5 relative on the losses, and on each gradient 1e-5 of its largest entry. The two modes
are not equal to the bit: the unpadded GEMMs have other shapes (other blockings) and the query/key/value projections
are one GEMM there, so only summation order differs (tests/models/test_unpadding.py bounds the encoder alone).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.attention import LOADER_FIELDS, unpad_batch
from models.bert.model import BertConfig, BertForPreTraining, Unpadding
from pretrain.data import PretrainingLoader, ShardedInstances
from pretrain.families.bert_loss import STAT_NAMES, PretrainingLoss

TOLERANCE = 1e-5
SEQ = 64


def _config(vocab_size: int, dropout: float) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=SEQ, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)


def _objectives(data: ShardedInstances, sentence: str, dropout: float = 0.0):
    """The padded and the padding-free objective around two models with the same initial weights."""
    vocab = -(-data.manifest.tokenizer.vocab_size // 8) * 8
    made = []
    for padding_free in (False, True):
        torch.manual_seed(0)
        made.append(PretrainingLoss(BertForPreTraining(_config(vocab, dropout)), sentence,
                                         padding_free=padding_free).train())
    return made


def _micro_batches(dataset, steps: int = 1, documents: bool = False, micro_batch: int = 8):
    data = ShardedInstances(dataset)
    loader = PretrainingLoader(data, micro_batch=micro_batch, accumulation=2, world_size=1, rank=0, seed=5,
                               document_attention=documents)
    batches = [{k: torch.from_numpy(np.asarray(v)) for k, v in b.items()} for _ in range(steps)
               for b in loader.next_step()]
    assert any(bool((b["attention_mask"] == 0).any()) for b in batches), "the batches must hold padding"
    return data, batches


def _step(objective: PretrainingLoss, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    torch.manual_seed(11)  # the same dropout masks in both modes (Unpadding.dropout draws the padded ones)
    loss, stats = objective(**batch)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in objective.model.named_parameters() if p.grad is not None}
    objective.zero_grad(set_to_none=True)
    return loss.detach(), stats, grads


def _assert_same_step(padded: PretrainingLoss, free: PretrainingLoss, batch: dict) -> dict:
    loss, stats, grads = _step(padded, batch)
    free_loss, free_stats, free_grads = _step(free, batch)
    torch.testing.assert_close(free_loss, loss, rtol=TOLERANCE, atol=0)
    torch.testing.assert_close(free_stats, stats, rtol=TOLERANCE, atol=TOLERANCE)
    assert free_grads.keys() == grads.keys()
    # The key biases' gradients are zero but for rounding: softmax ignores a constant added to a row's scores.
    for name in sorted(name for name in grads if not name.endswith("self.key.bias")):
        atol = TOLERANCE * grads[name].abs().max().item()
        torch.testing.assert_close(free_grads[name], grads[name], rtol=TOLERANCE, atol=atol, msg=name)
    return grads


@pytest.mark.parametrize("sentence", ["nsp", "sop"])
def test_padding_free_step_gives_the_padded_losses_and_gradients_with_a_pair_head(synthetic_dataset, sentence):
    dataset = synthetic_dataset(400, max_seq_length=SEQ, max_predictions=10, sentence_objective=sentence)
    data, batches = _micro_batches(dataset)
    padded, free = _objectives(data, sentence)
    for batch in batches:
        grads = _assert_same_step(padded, free, batch)
        assert grads["cls.seq_relationship.weight"].abs().max() > 0  # the pair head did train
        assert _step(free, batch)[1][STAT_NAMES.index("pair_sequences")] == len(batch["input_ids"])


def test_padding_free_step_with_no_sentence_objective_leaves_the_pair_head_untouched(synthetic_dataset):
    # Packed rows attending across their documents (objective.attention full), RoBERTa's FULL-SENTENCES.
    dataset = synthetic_dataset(300, max_seq_length=SEQ, max_predictions=10, kind="full_sentences",
                                document_tokens=20)
    data, batches = _micro_batches(dataset)
    padded, free = _objectives(data, "none")
    grads = _assert_same_step(padded, free, batches[0])
    assert not any(name.startswith(("cls.seq_relationship", "bert.pooler")) for name in grads)


def test_padding_free_step_keeps_packed_documents_apart(synthetic_dataset):
    dataset = synthetic_dataset(300, max_seq_length=SEQ, max_predictions=10, kind="full_sentences",
                                document_tokens=20)
    data, batches = _micro_batches(dataset, documents=True)
    assert any(int(b["document_ids"].max()) > 0 for b in batches)  # rows of several documents
    padded, free = _objectives(data, "none")
    for batch in batches:
        _assert_same_step(padded, free, batch)
    # Document attention is in force in both modes: without the document ids the loss is another.
    whole_rows = {k: v for k, v in batches[0].items() if k not in ("document_ids", "position_ids")}
    with torch.no_grad():
        assert abs(free(**whole_rows)[0] - free(**batches[0])[0]) > 1e-4


def test_a_short_training_run_has_the_padded_loss_curve(synthetic_dataset):
    dataset = synthetic_dataset(600, max_seq_length=SEQ, max_predictions=10)
    data, batches = _micro_batches(dataset, steps=2)
    batches = batches + batches  # four steps, each global batch seen twice: the loss must fall within a few steps
    curves = []
    for objective in _objectives(data, "nsp", dropout=0.1):  # dropout on: the padding-free mode draws the same masks
        optimizer = torch.optim.AdamW(objective.parameters(), lr=3e-3, weight_decay=0.01)
        torch.manual_seed(21)
        curve = []
        for first in range(0, len(batches), 2):  # two micro-batches per step, as the loader gave them
            losses = [objective(**batch)[0] for batch in batches[first:first + 2]]
            sum(losses).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            curve.append(float(sum(losses).detach()))
        curves.append(curve)
    padded, free = curves
    assert len(padded) == 4 and padded[2] < padded[0] and padded[3] < padded[1]  # it trained
    np.testing.assert_allclose(free, padded, rtol=1e-4)  # rounding differences grow a little over the steps


def test_masked_positions_map_into_the_unpadded_layout_and_padding_is_refused():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    unpadding = Unpadding.from_attention_mask(mask)
    assert unpadding.positions(torch.tensor([1, 4, 5, 8, 11])).tolist() == [1, 3, 4, 5, 8]
    with pytest.raises(ValueError, match="masked position falls on padding"):
        unpadding.positions(torch.tensor([3]))


def test_the_switch_trains_the_padded_curve_logs_its_kernel_and_may_change_on_resume(one_rank, sample_dataset,
                                                                                     tmp_path, caplog):
    """``model.padding_free`` through ``pretrain.train`` (DeepSpeed, dropout on): the padded run's metrics; a run
    resumed with the switch flipped continues (how a step is computed, not what it computes)."""
    from pretrain import train
    from tests.pretrain.test_training import _cfg

    caplog.set_level("INFO", logger="pretrain")
    curves = {}
    for switch in ("false", "true"):
        out = tmp_path / f"run-{switch}"
        assert train.run(_cfg(sample_dataset, out, 3, **{"model.padding_free": switch}), one_rank, resume=False) == 0
        curves[switch] = [json.loads(line)["mlm_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(curves["false"]) == 3
    np.testing.assert_allclose(curves["true"], curves["false"], rtol=1e-4)
    assert caplog.text.count("padding-free pretraining: attention kernel sdpa-padded-grid (cpu has no") == 1
    resumed = _cfg(sample_dataset, tmp_path / "run-false", 4, **{"model.padding_free": "true"})
    assert train.run(resumed, one_rank, resume=True) == 0
    assert "model.padding_free: false -> true" in caplog.text


class HostReads(TorchDispatchMode):
    """Counts the operators that make the host wait for the device: a tensor read as a Python number
    (``.item()``, ``int()``, ``bool()``) and the operators whose output size depends on the data."""

    READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_consecutive"}

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.READS:
            self.seen.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def _loader_batches(dataset, documents: bool) -> list[dict]:
    loader = PretrainingLoader(ShardedInstances(dataset), micro_batch=8, accumulation=2, world_size=1, rank=0, seed=5,
                               document_attention=documents, padding_free=True)
    return [{k: v if isinstance(v, int) else torch.from_numpy(np.asarray(v)) for k, v in b.items()}
            for b in loader.next_step()]


@pytest.mark.parametrize("documents", [False, True], ids=["rows", "documents"])
def test_the_loaders_unpadding_sizes_are_the_devices_and_the_step_reads_nothing_back(synthetic_dataset, documents):
    """With the sizes the loader computed on the host (``host_unpadding``), the padding-free step equals the one that
    derives them from the attention mask, bit for bit, and neither it nor the padded step reads a tensor back."""
    dataset = synthetic_dataset(300, max_seq_length=SEQ, max_predictions=10, kind="full_sentences",
                                document_tokens=20)
    batches = _loader_batches(dataset, documents)
    padded, free = _objectives(ShardedInstances(dataset), "none")
    for batch in batches:
        plain = {k: v for k, v in batch.items() if k not in LOADER_FIELDS}
        assert set(batch) - set(plain) == set(LOADER_FIELDS[:4]) | ({"segment_starts", "longest_segment"}
                                                                    if documents else set())
        derived = Unpadding.from_attention_mask(plain["attention_mask"])
        if documents:
            derived = derived.within_documents(derived.unpad(plain["document_ids"]))
        loaded, positions = unpad_batch(plain["attention_mask"], plain["masked_positions"],
                                       {k: batch[k] for k in set(batch) - set(plain)})
        loaded = loaded.within_documents(derived.document_ids) if documents else loaded
        assert torch.equal(loaded.index, derived.index) and torch.equal(loaded.cu_seqlens, derived.cu_seqlens)
        assert loaded.max_seqlen == derived.max_seqlen and torch.equal(loaded.key_mask, derived.key_mask)
        assert torch.equal(loaded.segment_starts, derived.segment_starts)
        assert loaded.longest_segment == derived.longest_segment
        assert torch.equal(positions, derived.positions(plain["masked_positions"]))
        with HostReads() as reads:
            loss, _, grads = _step(free, batch)
        assert reads.seen == [], reads.seen
        with HostReads() as reads:
            loss_from_mask, _, grads_from_mask = _step(free, plain)
        assert {"aten::_local_scalar_dense", "aten::nonzero"} <= set(reads.seen)  # the counter sees them
        assert torch.equal(loss, loss_from_mask) and all(torch.equal(grads[k], grads_from_mask[k]) for k in grads)
        with HostReads() as reads:
            _step(padded, plain)
        assert reads.seen == [], reads.seen


def test_host_unpadding_refuses_a_masked_position_on_padding():
    from pretrain.data import host_unpadding

    lengths = np.array([3, 2])
    real = np.array([0, 1, 2, 4, 5])  # rows of width 4: 1 1 1 0 / 1 1 0 0
    assert host_unpadding(real, lengths, np.array([1, 4, 5]))["unpadded_masked_positions"].tolist() == [1, 3, 4]
    with pytest.raises(ValueError, match="masked position falls on padding"):
        host_unpadding(real, lengths, np.array([3]))
