"""Fuzzing a dataset's manifest.json (common.manifest): every mutated or damaged manifest is read, with its shard and
tokenizer paths inside the dataset directory, or refused in one DatasetFormatError line naming the file."""
import json

import pytest
from hypothesis import given, settings

from common.errors import DatasetFormatError
from common.manifest import Manifest, ModelRequirements
from tests.fuzz_documents import FUZZ, damaged_bytes, listing, mutated

SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
# A manifest as the preprocessing run writes it (fields a reader checks; statistics and provenance left out).
MANIFEST = {
    "format": "bert-instances", "format_version": 2, "rows": 10, "max_seq_length": 128,
    "tokenizer": {"dir": "tokenizer", "kind": "wordpiece", "vocab_size": 30, "lowercase": True,
                  "special_ids": SPECIAL_IDS, "vocab_sha256": "ab" * 32},
    "shards": [{"name": "shard-00000-of-00002.arrow", "rows": 6, "bytes": 100, "sha256": "cd" * 32, "tokens": 50},
               {"name": "shard-00001-of-00002.arrow", "rows": 4}],
    "objective": {"kind": "pairs", "sentence_objective": "nsp", "masking": "static", "mask_unit": "token",
                  "masked_lm_prob": 0.15, "max_predictions_per_seq": 20},
}
MODEL = ModelRequirements(vocab_size=30, max_seq_length=128, special_ids=SPECIAL_IDS, vocab_sha256="ab" * 32)


def _read_everything(directory) -> Manifest | None:
    """What a reader of the dataset does with its manifest; None when it is refused (in one line)."""
    try:
        manifest = Manifest.read(directory)
        manifest.check_totals()
        paths = [manifest.shard_path(entry) for entry in manifest.shards] + [manifest.tokenizer_path()]
        manifest.check_fits(MODEL)
    except DatasetFormatError as error:
        assert "\n" not in str(error), repr(error)
        return None
    root = directory.resolve()
    assert all(path.resolve().is_relative_to(root) for path in paths)
    return manifest


def _write(directory, data: bytes):
    (directory / "manifest.json").write_bytes(data)
    return directory


def test_the_sample_manifest_is_read(tmp_path):
    assert _read_everything(_write(tmp_path, json.dumps(MANIFEST).encode())).rows == 10


def test_mutated_manifests_are_read_or_refused_in_one_line(tmp_path):
    @settings(FUZZ, max_examples=300)
    @given(mutated(MANIFEST))
    def check(document):
        _read_everything(_write(tmp_path, json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")))
        assert listing(tmp_path) == ["manifest.json"]

    check()


def test_damaged_manifest_files_are_refused_in_one_line(tmp_path):
    @settings(FUZZ, max_examples=200)
    @given(damaged_bytes(json.dumps(MANIFEST, indent=1).encode()))
    def check(data):
        _read_everything(_write(tmp_path, data))

    check()


# ---- regressions: each a bug the fuzzing found, kept as a plain test

@pytest.mark.parametrize("document", ["null", "[]", '"manifest"', "3"])
def test_a_manifest_that_is_not_a_json_object_is_refused_naming_the_file(tmp_path, document):
    with pytest.raises(DatasetFormatError, match=r"manifest\.json: a JSON \w+, not the manifest's object"):
        Manifest.read(_write(tmp_path, document.encode()))


def test_a_manifest_nested_thousands_deep_is_refused_not_a_recursion_error(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"manifest\.json: not readable JSON"):
        Manifest.read(_write(tmp_path, b"[" * 100_000))


@pytest.mark.parametrize("field", ["rows", "max_seq_length"])
def test_an_infinite_count_is_refused_not_an_overflow_error(tmp_path, field):
    text = json.dumps({**MANIFEST, field: 0}).replace(f'"{field}": 0', f'"{field}": Infinity')
    with pytest.raises(DatasetFormatError, match="a field has the wrong type"):
        Manifest.read(_write(tmp_path, text.encode()))


def test_an_infinite_shard_size_is_refused_not_an_overflow_error(tmp_path):
    text = json.dumps(MANIFEST).replace('"bytes": 100', '"bytes": 1e999')
    with pytest.raises(DatasetFormatError, match="a field has the wrong type"):
        Manifest.read(_write(tmp_path, text.encode()))
