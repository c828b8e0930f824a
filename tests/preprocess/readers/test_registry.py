"""preprocess.readers: one registry of formats behind one interface, and the config's ``inputs:`` section."""
from __future__ import annotations

import json

import pytest

from common import configlib
from common import preprocess_config as config_module
from common.configlib import ConfigError
from common.errors import InputError
from common.preprocess_config import INPUT_FORMATS, InputSourceConfig, SourceConfig
from preprocess import readers
from tests.preprocess.conftest import REPO_ROOT


def test_every_config_format_has_a_reader_with_the_whole_interface():
    assert set(readers.FORMATS) == {"wikipedia", "books", *INPUT_FORMATS}
    for reader in readers.FORMATS.values():
        for method in ("clean", "files", "label", "splittable", "pieces", "read", "memory_class", "cost_per_byte"):
            assert callable(getattr(reader, method)), (reader, method)
        assert readers.cleaner(reader.kind) is not None
    assert readers.reader_of("wiki") is readers.FORMATS["wikipedia"]
    assert readers.reader_of("jsonl:web") is readers.FORMATS["jsonl"]


def test_a_documents_source_is_its_ids_first_field():
    assert [readers.source_of(i) for i in ("wiki:enwiki:12", "book:emma.txt:00001", "web:crawl.jsonl:0")] == [
        "wikipedia", "books", "web"]
    assert readers.id_language("wiki:bgwiki:1") == "bg" and readers.id_language("web:x:1") is None


def _load(tmp_path, text: str, overrides=()):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return config_module.load(path, list(overrides))


@pytest.mark.parametrize("inputs, message", [
    ([{"name": "web", "format": "csv", "paths": ["a"]}], r"inputs\[0\]: format 'csv' is not an input format; use one"),
    ([{"name": "books", "format": "jsonl", "paths": ["a"]}], r"inputs\[0\]: name 'books' is a built-in source"),
    ([{"name": "web", "format": "jsonl", "paths": []}], r"inputs\[0\]: paths is empty"),
    ([{"name": "a:b", "format": "jsonl", "paths": ["a"]}], r"inputs\[0\]: name 'a:b' may hold only"),
    ([{"name": "web", "format": "jsonl", "paths": ["a"]}, {"name": "web", "format": "parquet", "paths": ["b"]}],
     r"inputs\[1\].name 'web' is the name of inputs\[0\] too"),
    ([{"name": "web", "format": "jsonl", "paths": ["a"], "field": "x"}], r"inputs\[0\]: unknown key 'field'"),
    ([{"name": "web", "format": "jsonl", "paths": ["a"], "document": "file"}], r"document applies to format text"),
    ([{"name": "web", "format": "text", "paths": ["a"], "min_sentences": 0}], r"min_sentences must be >= 1"),
])
def test_bad_sources_are_refused_in_one_line_naming_the_key(tmp_path, inputs, message):
    with pytest.raises(ConfigError, match=message) as raised:
        _load(tmp_path, json.dumps({"inputs": inputs}))
    assert "\n" not in str(raised.value)


def test_the_resolved_config_has_no_inputs_section_while_it_is_empty(tmp_path):
    assert "inputs" not in configlib.to_dict(config_module.PreprocessConfig())
    cfg = _load(tmp_path, "inputs:\n- {name: web, format: jsonl, paths: [crawl/], id_field: url, min_chars: 10}\n")
    assert cfg.inputs == [InputSourceConfig(name="web", format="jsonl", paths=["crawl/"], id_field="url",
                                            min_chars=10)]
    assert configlib.to_dict(cfg)["inputs"][0]["id_field"] == "url"
    limits = readers.source_config(cfg.inputs[0], SourceConfig())
    assert (limits.min_document_chars, limits.min_document_sentences) == (10, SourceConfig().min_document_sentences)


def test_input_files_carry_their_sources_key_and_refuse_clashing_names(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "part.jsonl").write_text("{}\n")
    one = InputSourceConfig(name="web", format="jsonl", paths=[str(tmp_path / "a")])
    two = InputSourceConfig(name="more", format="jsonl", paths=[str(tmp_path / "b")])
    assert readers.input_files({}, [one, two]) == [("jsonl:web", str(tmp_path / "a" / "part.jsonl")),
                                                   ("jsonl:more", str(tmp_path / "b" / "part.jsonl"))]
    both = InputSourceConfig(name="web", format="jsonl", paths=[str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(InputError, match=r"inputs 'web': files share a name \(part.jsonl\)"):
        readers.input_files({}, [both])


def test_the_documented_example_of_each_format_is_a_valid_config():
    text = (REPO_ROOT / "docs" / "preprocessing.md").read_text()
    block = next(b.split("```", 1)[0] for b in text.split("```yaml\n")[1:] if b.startswith("inputs:"))
    cfg = configlib.from_dict(config_module.PreprocessConfig, configlib.parse_yaml(block, "docs/preprocessing.md"))
    assert sorted(spec.format for spec in cfg.inputs) == sorted(INPUT_FORMATS)
