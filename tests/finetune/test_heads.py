"""The task heads (on the encoder's padding-free mode) against transformers' BERT task models."""
import pytest
import torch

from finetune.heads import SequenceClassifier, SpanExtractor, TokenClassifier, pad_batch
from models.bert.model import BertConfig, BertForPreTraining
from tests.finetune.head_parity import assert_trains_like

CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _encoder():
    torch.manual_seed(0)
    return BertForPreTraining(CONFIG).bert


def _batch(lengths=(5, 17, 9, 3)):
    generator = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(1, CONFIG.vocab_size, (n,), generator=generator).tolist(),
             "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2)} for n in lengths]
    return pad_batch(rows, CONFIG.pad_token_id)


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
    assert_trains_like(ours, theirs, batch, targets, head)
