"""Our ALBERT (models.albert.model) against transformers' AlbertForPreTraining, its sharing and factorization, and its
Hugging Face export and load (models.albert.hf)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import transformers

from common.errors import CheckpointError
from models.albert import hf as albert_hf
from models.albert.model import AlbertConfig, AlbertForPreTraining, flops_per_token, preset
from models.attention import Unpadding
from models.bert.model import BertConfig
from models.bert.model import flops_per_token as bert_flops_per_token

# Factorized (E 16 < H 64), two groups of two inner layers, each group applied twice: every mapping is exercised.
SIZES = {"vocab_size": 300, "embedding_size": 16, "hidden_size": 64, "num_hidden_layers": 4, "num_hidden_groups": 2,
         "inner_group_num": 2, "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 64}
CONFIG = AlbertConfig(**SIZES)


def _ours(cfg: AlbertConfig = CONFIG, seed: int = 3) -> AlbertForPreTraining:
    torch.manual_seed(seed)
    return AlbertForPreTraining(cfg).eval()


def _hf(seed: int = 0) -> transformers.AlbertForPreTraining:
    torch.manual_seed(seed)
    return transformers.AlbertForPreTraining(transformers.AlbertConfig(**SIZES)).eval()


def _inputs(batch=3, length=20, vocab=300, padded=True):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (batch, length), generator=gen)
    types = torch.zeros_like(ids)
    types[:, length // 2:] = 1
    mask = torch.ones_like(ids)
    if padded:
        mask[0, -5:] = 0
        mask[2, -11:] = 0
    return ids, types, mask


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [True, False], ids=["padding", "no-padding"])
def test_logits_match_transformers_with_the_same_weights(tmp_path, padded):
    hf = _hf()
    hf.save_pretrained(tmp_path)
    ours, fresh = albert_hf.load_albert(tmp_path)
    assert fresh == [] and ours.config == CONFIG
    ours.eval()
    ids, types, mask = _inputs(padded=padded)
    given = mask if padded else None
    flat = torch.tensor([3, 17, 25, 41, 59])
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=given)
        mlm, sop = ours(ids, types, given)
        gathered, _ = ours(ids, types, given, masked_positions=flat)
    real = mask.bool()
    _close(mlm[real], expected.prediction_logits[real])
    _close(sop, expected.sop_logits)
    _close(gathered, expected.prediction_logits.reshape(-1, SIZES["vocab_size"])[flat])
    assert gathered.shape == (len(flat), SIZES["vocab_size"]) and sop.shape == (3, 2)


def test_parameter_names_are_transformers_state_dict_names():
    ours, hf = _ours(), _hf()
    assert list(ours.state_dict()) == list(hf.state_dict())
    assert all(ours.state_dict()[k].shape == v.shape for k, v in hf.state_dict().items())


def test_factorized_embeddings_have_embedding_size_and_the_decoder_is_tied_through_it():
    model = _ours()
    e, h, v = CONFIG.embedding_size, CONFIG.hidden_size, CONFIG.vocab_size
    emb = model.albert.embeddings
    assert emb.word_embeddings.weight.shape == (v, e)
    assert emb.position_embeddings.weight.shape == (CONFIG.max_position_embeddings, e)
    assert emb.token_type_embeddings.weight.shape == (2, e) and emb.LayerNorm.weight.shape == (e,)
    assert model.albert.encoder.embedding_hidden_mapping_in.weight.shape == (h, e)
    assert model.predictions.dense.weight.shape == (e, h) and model.predictions.LayerNorm.weight.shape == (e,)
    assert model.predictions.decoder.weight is emb.word_embeddings.weight
    assert model.predictions.decoder.bias is model.predictions.bias
    assert not emb.word_embeddings.weight[CONFIG.pad_token_id].any()  # the tie kept the zeroed padding row
    # The vocabulary costs V*E once: growing H leaves the embedding tables alone.
    wider = _ours(replace(CONFIG, hidden_size=128, num_attention_heads=4))
    assert wider.albert.embeddings.word_embeddings.weight.shape == (v, e)


def test_one_shared_group_holds_every_layers_parameters():
    shared = replace(CONFIG, num_hidden_groups=1, inner_group_num=1)
    deeper = replace(shared, num_hidden_layers=12)

    def count(model):
        return sum(p.numel() for p in model.parameters())

    model = _ours(shared)
    assert len(model.albert.encoder.albert_layer_groups) == 1
    assert count(model) == count(_ours(deeper))  # depth adds no parameters
    calls = []
    model.albert.encoder.albert_layer_groups[0].register_forward_hook(lambda *_: calls.append(1))
    model(*_inputs())
    assert len(calls) == shared.num_hidden_layers


def test_shared_weights_get_the_sum_of_the_gradients_of_every_application():
    """The shared model equals an unshared one whose every layer holds a copy of the shared weights; the shared
    weights' gradient is the sum of the copies' gradients, so every application contributes."""
    shared_cfg = replace(CONFIG, num_hidden_groups=1, inner_group_num=1)
    shared = _ours(shared_cfg)
    unshared = AlbertForPreTraining(replace(shared_cfg, num_hidden_groups=shared_cfg.num_hidden_layers)).eval()
    group = shared.state_dict()
    state = {k.replace("albert_layer_groups.0.", f"albert_layer_groups.{i}."): v for k, v in group.items()
             for i in range(shared_cfg.num_hidden_layers)}
    unshared.load_state_dict(state)
    ids, types, mask = _inputs()
    target = torch.randn(3, 20, shared_cfg.vocab_size, generator=torch.Generator().manual_seed(2))
    for model in (shared, unshared):
        mlm, sop = model(ids, types, mask)
        ((mlm * target).sum() + sop.square().sum()).backward()
    _close(shared(ids, types, mask)[0], unshared(ids, types, mask)[0])
    groups = unshared.albert.encoder.albert_layer_groups
    for name, param in shared.albert.encoder.albert_layer_groups[0].named_parameters():
        per_application = [dict(g.named_parameters())[name].grad for g in groups]
        assert all(grad is not None and grad.abs().sum() > 0 for grad in per_application), name
        _close(param.grad, torch.stack(per_application).sum(0))


def test_groups_are_applied_in_consecutive_equal_shares():
    encoder = _ours(replace(CONFIG, num_hidden_layers=6, num_hidden_groups=3)).albert.encoder
    assert [encoder.group_of(i) for i in range(6)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="multiple of num_hidden_groups"):
        replace(CONFIG, num_hidden_layers=5, num_hidden_groups=2)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["eval", "dropout"])
def test_padding_free_mode_matches_padded_mode_on_the_real_tokens(dropout):
    """With dropout too: the padding-free mode draws the padded mode's masks (models.bert.model.Unpadding.dropout)."""
    cfg = replace(CONFIG, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    encoder = _ours(cfg).albert.train(dropout > 0)
    ids, types, mask = _inputs()
    unpadding = Unpadding.from_attention_mask(mask)
    with torch.no_grad():
        torch.manual_seed(5)
        hidden, pooled = encoder(ids, types, mask)
        torch.manual_seed(5)
        free, free_pooled = encoder(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding)
    _close(free, unpadding.unpad(hidden))
    _close(free_pooled, pooled)


def test_packed_documents_are_encoded_as_if_each_were_alone_in_padded_and_padding_free_mode():
    """document_ids and position_ids as BERT takes them (the loader's document attention): a document's tokens
    attend to their own document, at positions counted from its start."""
    encoder = _ours().albert
    ids, types, mask = _inputs(padded=False)
    types.zero_()
    cut = 8  # row 0 holds two documents: tokens 0-7 and 8-19; the other rows one each
    documents = torch.zeros_like(ids)
    documents[0, cut:] = 1
    positions = torch.arange(ids.shape[1]).repeat(3, 1)
    positions[0, cut:] -= cut
    with torch.no_grad():
        hidden, _ = encoder(ids, types, mask, position_ids=positions, document_ids=documents)
        alone, _ = encoder(ids[:1, cut:], types[:1, cut:])
        whole, _ = encoder(ids, types, mask)
        unpadding = Unpadding.from_attention_mask(mask)
        free, _ = encoder(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding,
                            position_ids=unpadding.unpad(positions), document_ids=unpadding.unpad(documents))
    _close(hidden[0, cut:], alone[0])
    _close(hidden[1:], whole[1:])  # one document a row: as without the ids
    _close(free, unpadding.unpad(hidden))
    model = _ours()
    with torch.no_grad():  # the pretraining model passes them through (pretrain.families.bert_loss gives them so)
        mlm, _ = model(ids, types, mask, position_ids=positions, document_ids=documents)
    _close(mlm[0, cut:], model.predictions(alone[0]))


def test_gradient_checkpointing_leaves_the_gradients_unchanged():
    grads = []
    for checkpointing in (False, True):
        model = _ours().train()
        model.albert.encoder.gradient_checkpointing = checkpointing
        mlm, sop = model(*_inputs())
        (mlm.square().mean() + sop.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        _close(grads[1][name], grad)


def test_export_loads_in_transformers_with_the_same_outputs(tmp_path):
    ours = _ours()
    albert_hf.export_albert(ours, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "albert" and config["architectures"] == ["AlbertForPreTraining"]
    ids, types, mask = _inputs()
    with torch.no_grad():
        mlm, sop = ours(ids, types, mask)
        hidden, _ = ours.albert(ids, types, mask)
    loaded, info = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    encoder = transformers.AutoModel.from_pretrained(tmp_path / "hf")
    assert isinstance(encoder, transformers.AlbertModel)
    with torch.no_grad():
        out = loaded.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
        encoded = encoder.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()
    _close(out.prediction_logits[real], mlm[real])
    _close(out.sop_logits, sop)
    _close(encoded.last_hidden_state[real], hidden[real])


def test_export_then_load_albert_round_trips(tmp_path, bert_vocab):
    from common.tokenizer import load_tokenizer

    load_tokenizer(str(bert_vocab)).save(str(tmp_path / "tok"))
    ours = _ours()
    albert_hf.export_albert(ours, tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    albert_hf.export_albert(ours, tmp_path / "hf")  # an earlier export is replaced whole
    assert not (tmp_path / "hf.partial").exists() and not (tmp_path / "hf" / "vocab.txt").exists()
    albert_hf.export_albert(ours, tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").tokenize("Unaffable") == \
        transformers.BertTokenizer(str(bert_vocab)).tokenize("Unaffable")
    loaded, fresh = albert_hf.load_albert(tmp_path / "hf")
    assert fresh == [] and loaded.config == ours.config
    assert loaded.predictions.decoder.weight is loaded.albert.embeddings.word_embeddings.weight
    for name, value in ours.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_an_encoder_only_checkpoint_loads_with_fresh_heads(tmp_path):
    hf = _hf()
    hf.albert.save_pretrained(tmp_path)
    ours, fresh = albert_hf.load_albert(tmp_path)
    assert fresh and all(name.startswith(("predictions.", "sop_classifier.")) for name in fresh)
    ids, types, mask = _inputs()
    with torch.no_grad():
        expected = hf.albert(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
        hidden, _ = ours.eval().albert(ids, types, mask)
    _close(hidden[mask.bool()], expected[mask.bool()])


def test_non_finite_weights_are_neither_exported_nor_loaded(tmp_path):
    model = _ours()
    albert_hf.export_albert(model, tmp_path / "good")
    with torch.no_grad():
        model.albert.encoder.albert_layer_groups[1].albert_layers[0].ffn.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="NaN or inf"):
        albert_hf.export_albert(model, tmp_path / "bad")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()
    hf = _hf()
    with torch.no_grad():
        hf.sop_classifier.classifier.bias[0] = float("inf")
    hf.save_pretrained(tmp_path / "hf-bad")
    with pytest.raises(CheckpointError, match="sop_classifier.classifier.bias"):
        albert_hf.load_albert(tmp_path / "hf-bad")


def test_directories_that_are_not_albert_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        albert_hf.load_albert(tmp_path)
    transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=32)).save_pretrained(
        tmp_path / "bert")
    with pytest.raises(CheckpointError, match="'bert' is not 'albert'"):
        albert_hf.load_albert(tmp_path / "bert")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty"):
        albert_hf.export_albert(_ours(), tmp_path / "foreign")


def test_flops_count_every_application_of_the_shared_layers_and_the_projection():
    # With E == H and the vocabulary of BERT, only the E -> H projection is new against BERT's count.
    bert = BertConfig()
    same = AlbertConfig(vocab_size=bert.vocab_size, embedding_size=768)
    assert flops_per_token(same, 128) - bert_flops_per_token(bert, 128) == pytest.approx(3 * 2 * 768 * 768)
    base = preset("albert_base")
    one_layer = flops_per_token(base, 128) - flops_per_token(replace(base, num_hidden_layers=11), 128)
    doubled = flops_per_token(replace(base, inner_group_num=2), 128) - flops_per_token(base, 128)
    assert doubled == pytest.approx(12 * one_layer)  # a second inner layer is 12 more applications
    assert flops_per_token(replace(base, num_hidden_groups=12), 128) == flops_per_token(base, 128)


def test_presets_are_albert_sizes():
    base = preset("albert_base", vocab_size=30000)
    assert (base.embedding_size, base.hidden_size, base.num_hidden_layers, base.num_attention_heads,
            base.intermediate_size, base.num_hidden_groups, base.hidden_act) == (128, 768, 12, 12, 3072, 1, "gelu_new")
    with torch.device("meta"):
        parameters = sum(p.numel() for p in AlbertForPreTraining(base).parameters())
    assert 11_500_000 < parameters < 12_000_000  # the paper's "12M" for ALBERT-base
    assert preset("albert_tiny").embedding_size < preset("albert_tiny").hidden_size
    with pytest.raises(ValueError, match="unknown ALBERT preset"):
        preset("base")
