"""The manifest's optional ``languages`` (multilingual datasets): read typed when present, None when absent (every
monolingual dataset, as before), refused in one line naming the file when damaged."""
import copy

import pytest

from common.errors import DatasetFormatError
from common.manifest import LanguageEntry, Manifest
from tests.common.test_manifest_fuzz import MANIFEST

LANGUAGES = {
    "bg": {"documents": 1, "sentences": 81, "tokens": 4772, "share": 0.006, "sampled_share": 0.027, "rate": 4.5,
           "rows": 795, "instance_tokens": 109756},
    "en": {"documents": 106, "sentences": 21670, "tokens": 780547, "share": 0.994, "sampled_share": 0.973,
           "rate": 0.98, "rows": 39294},
}


def test_a_monolingual_manifest_has_no_languages(tmp_path):
    assert Manifest.parse(copy.deepcopy(MANIFEST), tmp_path / "manifest.json").languages is None


def test_a_multilingual_manifest_reads_each_language_typed(tmp_path):
    manifest = Manifest.parse({**copy.deepcopy(MANIFEST), "languages": LANGUAGES}, tmp_path / "manifest.json")
    assert manifest.languages == {
        "bg": LanguageEntry(documents=1, sentences=81, tokens=4772, share=0.006, sampled_share=0.027, rate=4.5,
                            rows=795),
        "en": LanguageEntry(documents=106, sentences=21670, tokens=780547, share=0.994, sampled_share=0.973, rate=0.98,
                            rows=39294)}


@pytest.mark.parametrize("languages, message", [
    ({"bg": {**LANGUAGES["bg"], "rows": "many"}}, "wrong type"),
    ({"bg": {k: v for k, v in LANGUAGES["bg"].items() if k != "sampled_share"}}, "no 'sampled_share' field"),
    (["bg", "en"], "wrong type"),
])
def test_a_damaged_languages_field_is_refused_in_one_line(tmp_path, languages, message):
    with pytest.raises(DatasetFormatError, match=message) as error:
        Manifest.parse({**copy.deepcopy(MANIFEST), "languages": languages}, tmp_path / "manifest.json")
    assert str(tmp_path / "manifest.json") in str(error.value) and "\n" not in str(error.value)
