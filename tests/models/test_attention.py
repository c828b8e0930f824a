"""models.attention: the padding-free kernel's choice, its segments, and the variable-length path's plumbing.

The variable-length kernel itself (``torch.nn.attention.varlen.varlen_attn``, flash attention) runs on CUDA only,
so here it is replaced by SDPA run on each segment alone: what is tested is everything around it (the unpadded
query/key/value layout, one segment per row or per document, the output's layout and gradients), against the
padded step, at test_padding_free.py's tolerance.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models import attention
from models.attention import Unpadding
from models.bert import model as model_module
from models.bert.model import BertConfig, BertForPreTraining
from tests.pretrain.test_padding_free import SEQ, _assert_same_step, _micro_batches, _objectives


def _segment_by_segment(q, k, v, starts, longest):
    """The kernel's contract on CPU: each segment of the unpadded (N, heads, size) tensors attends to itself only."""
    assert starts.dtype == torch.int32 and int((starts[1:] - starts[:-1]).max()) == longest
    out = []
    for first, stop in zip(starts[:-1].tolist(), starts[1:].tolist()):
        part = lambda t: t[first:stop].transpose(0, 1)[None]  # noqa: E731 - (1, heads, L, size)
        out.append(F.scaled_dot_product_attention(part(q), part(k), part(v))[0].transpose(0, 1))
    return torch.cat(out)


@pytest.fixture
def varlen_on_cpu(monkeypatch):
    monkeypatch.setattr(model_module, "varlen_attention", _segment_by_segment)


def test_the_kernel_is_chosen_by_device_dropout_and_torch():
    assert attention.choose(torch.device("cpu"), 0.0)[0] == "sdpa-padded-grid"
    kernel, why = attention.choose(torch.device("cuda"), 0.1)
    assert kernel == "sdpa-padded-grid" and "attention_probs_dropout_prob=0" in why
    expected = "varlen" if attention.varlen_available() else "sdpa-padded-grid"
    assert attention.choose(torch.device("cuda"), 0.0)[0] == expected
    model = BertForPreTraining(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                          intermediate_size=32, attention_probs_dropout_prob=0.0))
    assert attention.use(model, "varlen") == 3
    assert attention.configure(model, torch.device("cpu"))[0] == "sdpa-padded-grid"
    assert {m.unpadded_kernel for m in model.modules() if hasattr(m, "unpadded_kernel")} == {"sdpa-padded-grid"}
    with pytest.raises(ValueError, match="choose one of"):
        attention.use(model, "flash")


def test_segments_are_rows_or_the_documents_within_them():
    unpadding = Unpadding.from_lengths(torch.tensor([5, 3]), 6)
    assert unpadding.segment_starts.tolist() == [0, 5, 8] and unpadding.longest_segment == 5
    documents = unpadding.within_documents(torch.tensor([0, 0, 1, 1, 1, 0, 1, 1]))
    assert documents.segment_starts.tolist() == [0, 2, 5, 6, 8] and documents.longest_segment == 3
    # A document id repeated by the next row is still another segment: rows never attend to each other.
    assert unpadding.within_documents(torch.zeros(8, dtype=torch.long)).segment_starts.tolist() == [0, 5, 8]


def test_the_varlen_path_gives_the_padded_losses_and_gradients(synthetic_dataset, varlen_on_cpu):
    dataset = synthetic_dataset(300, max_seq_length=SEQ, max_predictions=10)
    data, batches = _micro_batches(dataset)
    padded, free = _objectives(data, "nsp")
    assert attention.use(free.model, "varlen") == 2
    for batch in batches:
        _assert_same_step(padded, free, batch)


def test_the_varlen_path_keeps_packed_documents_apart(synthetic_dataset, varlen_on_cpu):
    dataset = synthetic_dataset(300, max_seq_length=SEQ, max_predictions=10, kind="full_sentences",
                                document_tokens=20)
    data, batches = _micro_batches(dataset, documents=True)
    assert any(int(b["document_ids"].max()) > 0 for b in batches)
    padded, free = _objectives(data, "none")
    attention.use(free.model, "varlen")
    for batch in batches:
        _assert_same_step(padded, free, batch)


def test_the_varlen_kernel_refuses_attention_dropout(synthetic_dataset, varlen_on_cpu):
    data, batches = _micro_batches(synthetic_dataset(100, max_seq_length=SEQ, max_predictions=10))
    _, free = _objectives(data, "nsp", dropout=0.1)
    attention.use(free.model, "varlen")
    with pytest.raises(ValueError, match="no dropout"):
        free(**batches[0])
