"""pretrain.weight_decay: biases and every layer norm are spared, whatever the model family calls them."""
import torch

from models.albert.model import AlbertForPreTraining
from models.albert.model import preset as albert_preset
from models.bert.model import BertForPreTraining, preset
from pretrain.weight_decay import parameter_groups


def _spared(model: torch.nn.Module) -> set[str]:
    decayed, spared = parameter_groups(model, 0.01)
    ids = {id(p) for p in spared["params"]}
    assert decayed["weight_decay"] == 0.01 and spared["weight_decay"] == 0.0
    return {name for name, p in model.named_parameters() if id(p) in ids}


def test_bert_spares_biases_and_layernorms_exactly_as_by_name():
    model = BertForPreTraining(preset("tiny", vocab_size=64))
    by_name = {n for n, _ in model.named_parameters() if n.endswith(("bias", "LayerNorm.weight", "LayerNorm.bias"))}
    assert _spared(model) == by_name
    decayed, spared = parameter_groups(model, 0.01)
    order = [id(p) for _, p in model.named_parameters()]
    for group in (decayed, spared):
        positions = [order.index(id(p)) for p in group["params"]]
        assert positions == sorted(positions)  # the optimizer state keeps the order it always had


def test_albert_spares_its_differently_named_layer_norms():
    model = AlbertForPreTraining(albert_preset("albert_tiny", vocab_size=64))
    spared = _spared(model)
    norms = [n for n in spared if "layer_norm" in n.lower() and n.endswith("weight")]
    assert any("full_layer_layer_norm.weight" in n for n in norms)
    assert not any(n.endswith("weight") and "norm" not in n.lower() for n in spared)
