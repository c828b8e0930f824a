"""Our BERT against transformers' BertForPreTraining, and on a real checkpoint no one here wrote."""
from __future__ import annotations

import pytest
import torch
import transformers

from common.errors import CheckpointError
from models.bert import hf as bert_hf
from models.bert.model import BertForPreTraining, preset


def _tiny_hf_model(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64)
    return transformers.BertForPreTraining(cfg).eval()


def _inputs(batch=3, length=20, vocab=300):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (batch, length), generator=gen)
    types = torch.zeros_like(ids)
    types[:, length // 2:] = 1
    mask = torch.ones_like(ids)
    mask[0, -5:] = 0  # a padded row
    return ids, types, mask


def test_logits_match_transformers_bert_for_pretraining(tmp_path):
    hf = _tiny_hf_model()
    hf.save_pretrained(tmp_path)
    ours, fresh = bert_hf.load_pretrained(tmp_path)
    assert fresh == []
    ours.eval()
    ids, types, mask = _inputs()
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
        mlm, nsp = ours(ids, types, mask)
        flat = torch.tensor([3, 17, 25, 41])
        mlm_gathered, _ = ours(ids, types, mask, masked_positions=flat)
    torch.testing.assert_close(mlm[mask.bool()], expected.prediction_logits[mask.bool()], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nsp, expected.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mlm_gathered, expected.prediction_logits.reshape(-1, 300)[flat], atol=1e-5, rtol=1e-5)


def test_export_loads_in_transformers_with_the_same_outputs(tmp_path):
    torch.manual_seed(3)
    ours = BertForPreTraining(preset("tiny", vocab_size=300, max_position_embeddings=64)).eval()
    bert_hf.export(ours, tmp_path)
    for cls in (transformers.BertForPreTraining, transformers.AutoModel):
        loaded = cls.from_pretrained(tmp_path).eval()
        ids, types, mask = _inputs()
        with torch.no_grad():
            out = loaded(input_ids=ids, token_type_ids=types, attention_mask=mask)
            mlm, nsp = ours(ids, types, mask)
            hidden, _ = ours.bert(ids, types, mask)
        if cls is transformers.AutoModel:
            torch.testing.assert_close(out.last_hidden_state, hidden, atol=1e-5, rtol=1e-5)
        else:
            torch.testing.assert_close(out.prediction_logits, mlm, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.seq_relationship_logits, nsp, atol=1e-5, rtol=1e-5)


def test_real_minilm_checkpoint_reproduces_transformers_hidden_states(minilm_dir):
    directory = minilm_dir
    ours, fresh = bert_hf.load_pretrained(directory)
    assert fresh and all(name.startswith("cls.") for name in fresh)  # encoder-only checkpoint: heads are new
    reference = transformers.BertModel.from_pretrained(directory).eval()
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=True)
    batch = tokenizer(["Anarchism is a political philosophy.", "The river rises in the northern hills and "
                       "flows south through three towns."], padding=True, return_tensors="pt")
    ours.eval()
    with torch.no_grad():
        expected = reference(**batch).last_hidden_state
        hidden, _ = ours.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(hidden[keep], expected[keep], atol=1e-5, rtol=1e-5)


def test_not_a_checkpoint_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        bert_hf.load_pretrained(tmp_path)
