"""``bench.fingerprints``: the comparison that tells a move (same outputs) from a change."""
from bench.fingerprints import differences


def test_every_difference_is_named_by_its_place_and_equal_fingerprints_have_none():
    before = {"demo": {"losses": [8.0, 7.5], "model.safetensors": {"hf/model.safetensors": "aa"}}, "tokenizer": {}}
    assert differences(before, before) == []
    after = {"demo": {"losses": [8.0, 7.25], "model.safetensors": {"hf/model.safetensors": "bb"}},
             "albert": {"losses": []}}
    assert differences(before, after) == [
        "albert: None -> {'losses': []}",
        "demo.losses[1]: 7.5 -> 7.25",
        "demo.model.safetensors.hf/model.safetensors: 'aa' -> 'bb'",
        "tokenizer: {} -> None",
    ]
    assert differences({"losses": [1.0]}, {"losses": [1.0, 2.0]}) == ["losses: [1.0] -> [1.0, 2.0]"]
