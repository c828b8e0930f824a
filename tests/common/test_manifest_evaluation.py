"""The manifest's optional ``evaluation`` (a held-out split): read typed when present, None when absent (every dataset
made before the split, or without one), refused in one line naming the file when damaged; the split reads as a
manifest of its own, with stored (static) masks whatever the training rows' masking."""
import copy

import pytest

from common.errors import DatasetFormatError
from common.manifest import Manifest, ShardEntry
from tests.common.test_manifest_fuzz import MANIFEST

EVALUATION = {"rows": 122, "tokens": 12272, "documents": 7, "masking": "static", "sources": {"books": 2},
              "shards": [{"name": "eval/shard-00000-of-00001.arrow", "rows": 122, "bytes": 36082, "sha256": "ab" * 32,
                          "tokens": 12272}]}


def test_a_manifest_without_evaluation_has_no_split(tmp_path):
    manifest = Manifest.parse(copy.deepcopy(MANIFEST), tmp_path / "manifest.json")
    assert manifest.evaluation is None and manifest.evaluation_split() is None


def test_the_split_reads_as_a_manifest_of_its_own(tmp_path):
    document = {**copy.deepcopy(MANIFEST), "evaluation": EVALUATION}
    document["objective"] = {**document.get("objective", {}), "masking": "dynamic"}
    manifest = Manifest.parse(document, tmp_path / "manifest.json")
    split = manifest.evaluation_split()
    assert manifest.evaluation.documents == 7 and manifest.objective.masking == "dynamic"
    assert split.rows == 122 and split.objective.masking == "static" and split.evaluation is None
    assert split.shards == (ShardEntry(name="eval/shard-00000-of-00001.arrow", rows=122, bytes=36082,
                                       sha256="ab" * 32, tokens=12272),)
    assert split.tokenizer == manifest.tokenizer and split.rows != manifest.rows
    split.check_totals()


@pytest.mark.parametrize("evaluation, message", [
    ({k: v for k, v in EVALUATION.items() if k != "shards"}, "no 'shards' field"),
    ({**EVALUATION, "rows": "many"}, "wrong type"),
    (["eval"], "wrong type"),
])
def test_a_damaged_evaluation_field_is_refused_in_one_line(tmp_path, evaluation, message):
    with pytest.raises(DatasetFormatError, match=message) as error:
        Manifest.parse({**copy.deepcopy(MANIFEST), "evaluation": evaluation}, tmp_path / "manifest.json")
    assert str(tmp_path / "manifest.json") in str(error.value) and "\n" not in str(error.value)
