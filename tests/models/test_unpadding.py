"""The encoder's padding-free mode (real tokens back to back, models.bert.model.Unpadding) against its padded mode."""
from __future__ import annotations

import pytest
import torch

from models.bert.model import BertConfig, BertForPreTraining, Unpadding

CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
LENGTHS = (5, 17, 9, 1, 12)
WIDTH = 24  # padded wider than the longest row, as batches rounded up to a multiple of 8 are


def _encoder(dtype=torch.float32, dropout=False):
    torch.manual_seed(0)
    bert = BertForPreTraining(CONFIG).bert.to(dtype)
    return bert.train(dropout)


def _padded_batch(lengths=LENGTHS, width=WIDTH):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, CONFIG.vocab_size, (len(lengths), width), generator=generator)
    types = (torch.arange(width) >= torch.tensor(lengths)[:, None] // 2).long()
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    return ids * mask, types * mask, mask  # padding is the pad id with type 0, as finetune.heads.pad_batch makes


def _both_modes(bert, ids, types, mask):
    padded = bert(ids, types, mask)
    unpadding = Unpadding.from_attention_mask(mask)
    free = bert(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding)
    return padded, free, unpadding


def _grads(bert, run, weights):
    hidden, pooled = run()
    ((hidden.float() @ weights).sum() + pooled.float().square().sum()).backward()
    grads = {name: p.grad.float().clone() for name, p in bert.named_parameters() if p.grad is not None}
    bert.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_padding_free_forward_equals_padded_forward_on_the_real_tokens(dtype, tolerance):
    bert, (ids, types, mask) = _encoder(dtype), _padded_batch()
    with torch.no_grad():
        (hidden, pooled), (free_hidden, free_pooled), unpadding = _both_modes(bert, ids, types, mask)
    assert free_hidden.shape == (sum(LENGTHS), CONFIG.hidden_size) and free_hidden.dtype == dtype
    torch.testing.assert_close(free_hidden, hidden[mask.bool()], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(unpadding.pad(free_hidden)[mask.bool()], hidden[mask.bool()],
                               rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(free_pooled, pooled, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_padding_free_backward_gives_the_padded_gradients(dtype, tolerance):
    bert, (ids, types, mask) = _encoder(dtype), _padded_batch()
    weights = torch.randn(CONFIG.hidden_size, generator=torch.Generator().manual_seed(2))
    unpadding = Unpadding.from_attention_mask(mask)
    padded = _grads(bert, lambda: (lambda h, p: (h[mask.bool()], p))(*bert(ids, types, mask)), weights)
    free = _grads(bert, lambda: bert(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding), weights)
    assert free.keys() == padded.keys() and len(free) == len(list(bert.parameters()))
    # The key biases' gradients are zero but for rounding: softmax ignores a constant added to all of a row's scores.
    for name in sorted(name for name in padded if not name.endswith("self.key.bias")):
        atol = tolerance * padded[name].abs().max().item()  # within tolerance of the gradient's largest entry
        torch.testing.assert_close(free[name], padded[name], rtol=tolerance, atol=atol, msg=name)


def test_padding_free_dropout_draws_the_padded_masks_and_leaves_the_random_stream_where_padded_would():
    bert, (ids, types, mask) = _encoder(dropout=True), _padded_batch()
    unpadding = Unpadding.from_attention_mask(mask)
    torch.manual_seed(7)
    hidden, pooled = bert(ids, types, mask)
    after_padded = torch.get_rng_state()
    torch.manual_seed(7)
    free_hidden, free_pooled = bert(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding)
    torch.testing.assert_close(free_hidden, hidden[mask.bool()], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(free_pooled, pooled, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.get_rng_state(), after_padded)
    torch.manual_seed(8)  # another draw gives other masks: dropout did act
    assert not torch.allclose(bert(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding)[0], free_hidden)


def test_gradient_checkpointing_recomputes_the_padding_free_layers_exactly():
    bert, (ids, types, mask) = _encoder(dropout=True), _padded_batch()
    unpadding = Unpadding.from_attention_mask(mask)
    weights = torch.randn(CONFIG.hidden_size, generator=torch.Generator().manual_seed(2))
    grads = []
    for checkpointing in (False, True):
        bert.encoder.gradient_checkpointing = checkpointing
        torch.manual_seed(3)
        grads.append(_grads(bert, lambda: bert(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding), weights))
    assert all(torch.equal(grads[0][name], grads[1][name]) for name in grads[0])


def test_an_unpadding_knows_its_rows():
    unpadding = Unpadding.from_attention_mask(_padded_batch(lengths=(3, 1, 4), width=5)[2])
    assert unpadding.cu_seqlens.tolist() == [0, 3, 4, 8] and unpadding.cu_seqlens.dtype == torch.int32
    assert (unpadding.max_seqlen, unpadding.batch, unpadding.length) == (4, 3, 5)
    assert unpadding.index.tolist() == [0, 1, 2, 5, 10, 11, 12, 13]
    assert unpadding.key_mask.shape == (3, 1, 1, 5)
    same = Unpadding.from_lengths(torch.tensor([3, 1, 4]), length=5)
    assert torch.equal(same.index, unpadding.index) and torch.equal(same.key_mask, unpadding.key_mask)
    assert Unpadding.from_lengths(torch.tensor([3, 1, 4])).length == 4
    grid = torch.arange(15.0).view(3, 5, 1)
    assert torch.equal(unpadding.pad(unpadding.unpad(grid)), grid * unpadding.key_mask.view(3, 5, 1))


@pytest.mark.parametrize("rows", [[[0, 1, 1, 0]], [[1, 0, 1, 0]], [[1, 1, 0, 0], [0, 0, 0, 0]]],
                         ids=["left-padded", "a hole", "an empty row"])
def test_unpadding_refuses_masks_that_are_not_right_padded(rows):
    with pytest.raises(ValueError, match="padded on the right"):
        Unpadding.from_attention_mask(torch.tensor(rows))


def test_lengths_beyond_the_padded_width_are_refused():
    with pytest.raises(ValueError, match="padded length 3"):
        Unpadding.from_lengths(torch.tensor([2, 4]), length=3)


def test_a_mask_and_an_unpadding_together_are_refused():
    bert, (ids, types, mask) = _encoder(), _padded_batch()
    unpadding = Unpadding.from_attention_mask(mask)
    with pytest.raises(ValueError, match="not both"):
        bert(unpadding.unpad(ids), unpadding.unpad(types), mask, unpadding=unpadding)


def test_padding_free_mode_reproduces_transformers_on_a_real_checkpoint(minilm_dir):
    import transformers

    from models.bert.hf import load_pretrained

    ours, _ = load_pretrained(minilm_dir)
    reference = transformers.BertModel.from_pretrained(minilm_dir).eval()
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(minilm_dir / "vocab.txt"), do_lower_case=True)
    batch = tokenizer(["Anarchism is a political philosophy.", "The river rises in the northern hills and "
                       "flows south through three towns.", "Yes."], padding=True, return_tensors="pt")
    bert = ours.bert.eval()
    unpadding = Unpadding.from_attention_mask(batch["attention_mask"])
    with torch.no_grad():
        expected = reference(**batch)
        hidden, pooled = bert(unpadding.unpad(batch["input_ids"]), unpadding.unpad(batch["token_type_ids"]), unpadding=unpadding)
    torch.testing.assert_close(hidden, expected.last_hidden_state[batch["attention_mask"].bool()], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, expected.pooler_output, atol=1e-5, rtol=1e-5)
