"""The objective section against the dataset's manifest: every mismatch refused in one line naming the manifest
and the fix; the dynamic recipe's unset values taken from the manifest; old checkpoints resume under the defaults."""
import pytest

from common.configlib import ConfigError
from common.manifest import Manifest
from common.masking import MaskingRecipe
from pretrain import config, resume, train
from pretrain.recipe import resolve
from tests.pretrain.launching import TINY, settings


def _objective(**values):
    return config.load(TINY, [f"objective.{k}={v}" for k, v in values.items()]).objective


def test_objective_values_are_checked_by_name():
    assert _objective(masked_lm_prob=0.4, masking="dynamic").masked_lm_prob == 0.4
    for key, value, message in (("masking", "sometimes", "objective.masking is 'sometimes'; choose one of static"),
                                ("attention", "local", "choose one of full, document"),
                                ("mask_unit", "sentence", "choose one of token, whole_word, span, ngram"),
                                ("masked_lm_prob", 1.5, r"masked_lm_prob must be in \(0, 1\)"),
                                ("max_predictions", 0, "max_predictions must be >= 1"),
                                ("mask_token_fraction", 0.95, "must be >= 0 and add up to at most 1"),
                                ("pair_loss", 1, "unknown key 'objective.pair_loss'")):
        with pytest.raises(ConfigError, match=message):
            _objective(**{key: value})


def test_a_pair_dataset_trains_as_it_was_made_and_refuses_other_objectives(synthetic_dataset):
    manifest = Manifest.read(synthetic_dataset(2_000))
    recipe = resolve(_objective(), manifest)
    assert (recipe.sentence_objective, recipe.dynamic_masking, recipe.document_attention) == ("nsp", None, False)
    assert resolve(_objective(mask_unit="token", masked_lm_prob=0.15, max_predictions=20), manifest) == recipe
    with pytest.raises(ConfigError) as error:
        resolve(_objective(masking="dynamic", sentence_objective="sop", attention="document", mask_unit="span"),
                manifest)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{manifest.path} does not match the config's objective: ")
    for part in ("masked static but objective.masking is dynamic: set objective.masking: static",
                 "sentence objective nsp but objective.sentence_objective is sop: set objective.sentence_objective: nsp",
                 "attention document needs packed rows (doc_starts) but its rows are pairs: set objective.attention: "
                 "full", "masks are stored (mask_unit token) but objective.mask_unit is span: remove objective."
                 "mask_unit"):
        assert part in message, part
    with pytest.raises(ConfigError, match="masks are stored \\(mask_token_fraction 0.8\\) but objective.mask_token_"
                                          "fraction is 0.5"):
        resolve(_objective(mask_token_fraction=0.5), manifest)


def test_a_dynamic_dataset_takes_the_configs_recipe_and_the_manifests_for_what_is_unset(synthetic_dataset):
    manifest = Manifest.read(synthetic_dataset(2_000, kind="full_sentences", masking="dynamic", mask_unit="span",
                                               masked_lm_prob=0.2, max_seq_length=128))
    none = {"sentence_objective": "none", "masking": "dynamic"}
    recipe = resolve(_objective(**none), manifest)
    assert recipe.dynamic_masking == MaskingRecipe(mode="span", rate=0.2, max_predictions=26)  # ceil(0.2 x 128)
    assert recipe.packed and recipe.sentence_objective == "none" and not recipe.document_attention
    chosen = resolve(_objective(**none, mask_unit="token", masked_lm_prob=0.4, max_predictions=30,
                                attention="document"), manifest)
    assert chosen.dynamic_masking == MaskingRecipe(mode="token", rate=0.4, max_predictions=30)
    assert chosen.document_attention
    assert "dynamic token masking of 0.4 of the tokens (at most 30 a row; [MASK] 0.8, random 0.1)" in chosen.describe()
    split = resolve(_objective(**none, mask_token_fraction=1.0, random_token_fraction=0.0), manifest)
    assert (split.dynamic_masking.mask_fraction, split.dynamic_masking.random_fraction) == (1.0, 0.0)
    with pytest.raises(ConfigError, match="masked dynamic but objective.masking is static.*instances.masking: static"):
        resolve(_objective(sentence_objective="none"), manifest)
    with pytest.raises(ConfigError, match="full_sentences with sentence objective none but objective.sentence_"
                                          "objective is nsp"):
        resolve(_objective(masking="dynamic"), manifest)


def test_a_run_is_refused_before_anything_is_written(one_rank, synthetic_dataset, tmp_path):
    dataset, out = synthetic_dataset(2_000), tmp_path / "run"
    cfg = config.load(TINY, [a for a in settings(dataset, out, steps=2, **{"objective.masking": "dynamic"})
                             if a != "--set"])
    with pytest.raises(ConfigError, match=f"{dataset / 'manifest.json'} does not match the config's objective"):
        train.run(cfg, one_rank, resume=False)
    assert not (out / "config.yaml").exists()


def test_checkpoints_from_before_the_objective_section_resume_under_its_defaults():
    before = resume.flatten({"seed": 1, "data": {"path": "a"}})
    now = resume.flatten({"seed": 1, "data": {"path": "a"},
                          "objective": config.configlib.to_dict(config.ObjectiveConfig())})
    assert resume.compare(before, now) == ([], [])
    dynamic = {**now, "objective.masking": "dynamic"}
    assert [str(d) for d in resume.compare(before, dynamic)[0]] == ["objective.masking: static -> dynamic"]
