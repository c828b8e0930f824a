"""Fuzzing a Hugging Face config.json as our code reads it (models.hf_io.read_config, for BERT, ALBERT and
ELECTRA): every mutated or damaged file gives the family's config or one CheckpointError line naming the file."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import CheckpointError
from models.albert.hf import load_albert_config
from models.bert.hf import load_config
from models.electra.hf import load_config as load_electra_config
from pretrain.checkpoints import is_complete_run_export
from tests.fuzz_documents import FUZZ, damaged_bytes, listing, mutated

# config.json as transformers writes it for a small model of each family, with keys our configs do not model.
BERT = {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": 30, "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 16,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "initializer_range": 0.02, "pad_token_id": 0,
        "position_embedding_type": "absolute", "transformers_version": "4.40.0", "torch_dtype": "float32",
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}
FAMILIES = {
    "bert": (BERT, load_config),
    "albert": ({**BERT, "model_type": "albert", "embedding_size": 4, "num_hidden_groups": 1, "inner_group_num": 1,
                "hidden_act": "gelu_new", "classifier_dropout_prob": 0.1}, load_albert_config),
    "electra": ({**BERT, "model_type": "electra", "embedding_size": 4}, load_electra_config),
}


def _read(directory, data: bytes, loader):
    """``loader`` on a directory holding ``data`` as config.json; None when refused in one line naming it."""
    (directory / "config.json").write_bytes(data)
    try:
        return loader(directory)
    except CheckpointError as error:
        assert "\n" not in str(error) and "config.json" in str(error), repr(error)
        return None
    finally:
        is_complete_run_export(directory)  # reads config.json too (no weights here: False, never an error)
        assert listing(directory) == ["config.json"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_sample_config_is_read(family, tmp_path):
    document, loader = FAMILIES[family]
    assert _read(tmp_path, json.dumps(document).encode(), loader).hidden_size == 8


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mutated_configs_are_read_or_refused_in_one_line(family, tmp_path):
    document, loader = FAMILIES[family]

    @settings(FUZZ, max_examples=150)
    @given(st.one_of(mutated(document).map(lambda changed: json.dumps(changed).encode()),
                     damaged_bytes(json.dumps(document, indent=1).encode())))
    def check(data):
        _read(tmp_path, data, loader)

    check()


# ---- regressions: each a bug the fuzzing found, kept as a plain test

def _refusal(tmp_path, data: bytes) -> str:
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(CheckpointError) as caught:
        load_config(tmp_path)
    assert str(tmp_path / "config.json") in str(caught.value) and "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize("data", [b"{\"vocab_size\": 3", b"\xff\xfe", b"[" * 100_000])
def test_a_config_that_is_not_json_is_refused_naming_the_file(tmp_path, data):
    assert "not valid JSON" in _refusal(tmp_path, data)


def test_a_config_that_is_not_a_json_object_is_refused_naming_the_file(tmp_path):
    assert "a JSON list, not an object" in _refusal(tmp_path, b"[1, 2]")


@pytest.mark.parametrize("field, value, expected", [
    ("hidden_size", {"x": 8}, "hidden_size: expected an integer"),
    ("hidden_size", "768", "hidden_size: expected an integer"),
    ("vocab_size", None, "vocab_size: expected an integer"),
    ("hidden_act", 3, "hidden_act: expected a string"),
    ("num_attention_heads", 0, "num_attention_heads is 0; it must be at least 1"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(tmp_path, field, value, expected):
    assert expected in _refusal(tmp_path, json.dumps({**BERT, field: value}).encode())
