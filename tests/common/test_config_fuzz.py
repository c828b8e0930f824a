"""Fuzzing the strict YAML config loader (common.configlib) through each stage's config: every mutated shipped
config, damaged config file or --set value gives a typed config or one ConfigError line, never another exception."""
import pathlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import site
from common import configlib, preprocess_config
from common.configlib import ConfigError
from finetune import config as finetune_config
from finetune.glue import GLUE_TASKS
from pretrain import config as pretrain_config
from tests.fuzz_documents import FUZZ, damaged_bytes, listing, mutated

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load_finetune(path, overrides=()):
    cfg = finetune_config.load(path, overrides)
    for task in GLUE_TASKS:  # per-task settings are configs too, read when the task runs
        finetune_config.task_training(cfg.glue, task)
    return cfg


# The stage -> its loader; a cluster site wraps ConfigError in its own SiteError (a ValueError with the same line).
LOADERS = {"preprocess": preprocess_config.load, "pretrain": pretrain_config.load, "finetune": _load_finetune,
           "cluster": site.load}
EXPECTED = (ConfigError, site.SiteError)
SHIPPED = {stage: sorted((ROOT / "configs" / stage).glob("*.yaml")) for stage in LOADERS}


def _load_or_refuse(stage: str, directory: pathlib.Path, data: bytes, overrides=()) -> None:
    """Load ``data`` as ``stage``'s config file; a refusal must be one line of our own error type, and nothing
    may be written beside the file."""
    path = directory / "config.yaml"
    path.write_bytes(data)
    try:
        LOADERS[stage](str(path), overrides)
    except EXPECTED as error:
        assert "\n" not in str(error) and str(error).strip(), repr(error)
    assert listing(directory) == ["config.yaml"]


def _yaml_bytes(document) -> bytes:
    return yaml.safe_dump(document, allow_unicode=True).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("stage", sorted(LOADERS))
def test_mutated_shipped_configs_load_or_are_refused_in_one_line(stage, tmp_path_factory):
    documents = [yaml.safe_load(path.read_text()) for path in SHIPPED[stage]]
    directory = tmp_path_factory.mktemp(stage)

    @settings(FUZZ, max_examples=100)
    @given(st.sampled_from(documents).flatmap(mutated))
    def check(document):
        _load_or_refuse(stage, directory, _yaml_bytes(document))

    check()


@pytest.mark.parametrize("stage", sorted(LOADERS))
def test_damaged_config_files_are_refused_in_one_line(stage, tmp_path_factory):
    originals = [path.read_bytes() for path in SHIPPED[stage]]
    directory = tmp_path_factory.mktemp(stage)

    @settings(FUZZ, max_examples=100)
    @given(st.sampled_from(originals).flatmap(damaged_bytes))
    def check(data):
        _load_or_refuse(stage, directory, data)

    check()


# --set values are YAML too, from a command line that may come from a job template.
ODD_OVERRIDE_VALUES = ("[", "{a: [", "*alias", "&anchor 1", "!!python/object/apply:os.system ['true']", "\x07",
                       "\udcff", "1e999", "-.inf", "[[[[[[[[]]]]]]]]", "null", "{}", "''")


@pytest.mark.parametrize("stage", ["preprocess", "pretrain"])
def test_odd_override_values_are_refused_in_one_line(stage, tmp_path_factory):
    directory = tmp_path_factory.mktemp(stage)
    base = SHIPPED[stage][0].read_bytes()
    keys = {"preprocess": ("seed", "instances.max_seq_length", "sources"),
            "pretrain": ("seed", "model.hidden_size", "optimizer.betas", "train")}[stage]

    @settings(FUZZ, max_examples=100)
    @given(st.sampled_from(keys), st.sampled_from(ODD_OVERRIDE_VALUES))
    def check(key, value):
        _load_or_refuse(stage, directory, base, (f"{key}={value}",))

    check()


# ---- regressions: each a bug the fuzzing found, kept as a plain test

def _refusal(tmp_path, data: bytes, overrides=(), loader=pretrain_config.load) -> str:
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as caught:
        loader(str(path), overrides)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_config_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    message = _refusal(tmp_path, b"seed: 1\n# caf\xe9\n")
    assert str(tmp_path / "config.yaml") in message and "not UTF-8" in message


def test_a_config_nested_thousands_deep_is_refused_not_a_recursion_error(tmp_path):
    for data in (b"seed: " + b"[" * 5000, b"seed:\n" + b"- " * 3000 + b"x\n"):
        message = _refusal(tmp_path, data)
        assert "nested more than 50 levels" in message


def test_unknown_keys_that_are_numbers_or_null_are_named_not_a_type_error(tmp_path):
    message = _refusal(tmp_path, b"1: x\nnull: y\nzz: z\n")
    assert "unknown key '1'" in message


def test_unprintable_or_malformed_override_values_are_config_errors(tmp_path):
    assert "--set seed" in _refusal(tmp_path, b"", ("seed=\x07",))
    assert "--set seed" in _refusal(tmp_path, b"", ("seed=[",))
    assert "--set seed" in _refusal(tmp_path, b"", ("seed=!!python/object/apply:os.system ['true']",))


def test_an_override_below_a_value_that_is_not_a_section_is_refused(tmp_path):
    message = _refusal(tmp_path, b"model: 5\n", ("model.hidden_size=8",))
    assert "'model' is 5 in the config, not a section" in message


def test_a_directory_given_as_the_config_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config"):
        pretrain_config.load(str(tmp_path))


def test_glue_per_task_settings_are_checked_when_the_config_is_loaded(tmp_path):
    message = _refusal(tmp_path, b"glue:\n  per_task:\n    rte: 5\n", loader=finetune_config.load)
    assert "glue.per_task.rte: expected a mapping" in message
    message = _refusal(tmp_path, b"glue:\n  per_task:\n    rte: {lr: fast}\n", loader=finetune_config.load)
    assert "lr: expected a number" in message


def test_parse_yaml_turns_every_yaml_error_into_a_config_error():
    for text in ("a: [", "\x07", "a: !!python/name:os.system", "{" + "a: b, " * 3):
        with pytest.raises(ConfigError, match="^<source>: "):
            configlib.parse_yaml(text, "<source>")


def test_an_empty_mapping_or_list_setting_written_as_null_is_refused_by_name(tmp_path):
    """``env:`` with nothing after it is null in YAML; a bare ``dict`` field was not type-checked at all."""
    path = tmp_path / "site.yaml"
    path.write_bytes(SHIPPED["cluster"][0].read_bytes() + b"\nenv:\n")
    with pytest.raises(site.SiteError, match=r"env: expected a mapping, got None") as caught:
        site.load(str(path))
    assert "\n" not in str(caught.value)


def test_a_misspelt_glue_task_under_per_task_is_refused_naming_the_close_one(tmp_path):
    message = _refusal(tmp_path, b"glue:\n  per_task:\n    rtee: {lr: 3.0e-5}\n", loader=finetune_config.load)
    assert "glue.per_task: unknown GLUE task 'rtee' (did you mean 'rte'?); known tasks: cola, sst2" in message
    assert "\n" not in message
    assert "unknown GLUE task 'SST-2'" in _refusal(tmp_path, b"glue:\n  per_task:\n    SST-2: {}\n",
                                                   loader=finetune_config.load)
