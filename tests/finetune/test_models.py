"""The heads' encoder pass on real tokens only (finetune.models.encode) against the padded encoder and transformers."""
import pytest
import torch

from finetune.models import SequenceClassifier, SpanExtractor, TokenClassifier, encode, pad_batch
from pretrain.model import BertConfig, BertForPreTraining

CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _encoder():
    torch.manual_seed(0)
    return BertForPreTraining(CONFIG).bert


def _batch(lengths=(5, 17, 9, 3)):
    generator = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(1, CONFIG.vocab_size, (n,), generator=generator).tolist(),
             "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2)} for n in lengths]
    return pad_batch(rows, CONFIG.pad_token_id)


@pytest.mark.parametrize("training", [False, True])
def test_encode_equals_the_padded_encoder_on_real_tokens(training):
    bert, batch = _encoder(), _batch()
    bert.train(training)
    real = batch["attention_mask"].bool()
    torch.manual_seed(7)
    hidden, pooled = bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    state_after_padded = torch.get_rng_state()
    torch.manual_seed(7)  # in training, dropout must draw the same masks in both...
    packed_hidden, packed_pooled = encode(bert, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    torch.testing.assert_close(packed_hidden[real], hidden[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_pooled, pooled, rtol=1e-5, atol=1e-5)
    assert torch.all(packed_hidden[~real] == 0)
    assert torch.equal(torch.get_rng_state(), state_after_padded)  # ...and leave the random stream where it would be


def test_encode_gives_the_padded_encoder_gradients():
    bert, batch = _encoder(), _batch()
    real = batch["attention_mask"].bool()
    weights = torch.randn(CONFIG.hidden_size)
    grads = []
    for run in (lambda: bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]),
                lambda: encode(bert, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])):
        torch.manual_seed(3)
        hidden, pooled = run()
        ((hidden[real] @ weights).sum() + pooled.square().sum()).backward()
        grads.append({n: p.grad.clone() for n, p in bert.named_parameters() if p.grad is not None})
        bert.zero_grad(set_to_none=True)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(bert.parameters()))
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)


def test_without_a_mask_the_plain_encoder_runs():
    bert, batch = _encoder(), _batch(lengths=(6, 6))
    bert.eval()
    expected = bert(batch["input_ids"], batch["token_type_ids"], None)
    got = encode(bert, batch["input_ids"], batch["token_type_ids"], None)
    torch.testing.assert_close(got[0], expected[0])


@pytest.mark.parametrize("head", ["sequence", "token", "span"])
def test_heads_train_like_transformers_with_the_same_random_state(head, tmp_path):
    """Same weights, same seed, dropout on: the same loss and logits as transformers' BERT task models."""
    import transformers  # a dev dependency: a missing install fails here, it is never skipped
    bert, batch = _encoder(), _batch()
    if head == "sequence":
        ours, kind, extra = SequenceClassifier(bert, 3), transformers.BertForSequenceClassification, {"num_labels": 3}
        targets = {"labels": torch.tensor([0, 2, 1, 1])}
    elif head == "token":
        ours, kind, extra = TokenClassifier(bert, 5), transformers.BertForTokenClassification, {"num_labels": 5}
        labels = torch.randint(0, 5, batch["input_ids"].shape, generator=torch.Generator().manual_seed(2))
        targets = {"labels": labels.masked_fill(batch["attention_mask"] == 0, -100)}
    else:
        ours, kind, extra = SpanExtractor(bert), transformers.BertForQuestionAnswering, {"num_labels": 2}
        targets = {"start_positions": torch.tensor([1, 4, 2, 0]), "end_positions": torch.tensor([3, 9, 2, 0])}
    config = transformers.BertConfig(**{k: getattr(CONFIG, k) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")},
        attn_implementation="sdpa", **extra)
    theirs = kind(config)
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    # transformers' token and span models have no pooler; ours keeps the checkpoint's (unused by those heads)
    assert not missing and all(k.startswith("bert.pooler.") for k in unexpected) and (head == "sequence") == (not unexpected)
    ours.train()
    theirs.train()
    torch.manual_seed(11)
    loss, logits = ours(**batch, **targets)
    torch.manual_seed(11)
    out = theirs(**batch, **targets)
    real = batch["attention_mask"].bool()
    if head == "span":  # ours sets padding's logits to -1e4 (never an answer), so compare real positions and no loss
        torch.testing.assert_close(logits[0][real], out.start_logits[real], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(logits[1][real], out.end_logits[real], rtol=1e-4, atol=1e-5)
    else:
        got, expected = (logits[real], out.logits[real]) if head == "token" else (logits, out.logits)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(loss, out.loss, rtol=1e-4, atol=1e-6)
