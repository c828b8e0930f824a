"""preprocess.mixture: each source's share of the rows (weights, or epochs), the same mechanism as the multilingual
job's smoothed mix of languages."""
from __future__ import annotations

import numpy as np
import pytest

from common import configlib
from common.errors import InputError
from common.preprocess_config import InputSourceConfig, MixtureConfig, MultilingualConfig, PreprocessConfig
from preprocess import languages, mixture
from preprocess.readers import source_of

COUNTS = {"books": {"documents": 10, "sentences": 500, "tokens": 8000},
          "wikipedia": {"documents": 40, "sentences": 800, "tokens": 12000},
          "web": {"documents": 100, "sentences": 900, "tokens": 20000},
          "empty": {"documents": 0, "sentences": 0, "tokens": 0}}  # a source of dead letters only


def test_weights_become_shares_of_the_tokens_and_rates_that_keep_the_corpus_s_total():
    mix = mixture.source_mix(COUNTS, MixtureConfig(weights={"books": 1, "wikipedia": 1, "web": 2}))
    assert set(mix) == {"books", "wikipedia", "web"}
    assert [mix[name]["share"] for name in ("books", "wikipedia", "web")] == [0.2, 0.3, 0.5]
    assert [mix[name]["requested_share"] for name in ("books", "wikipedia", "web")] == [0.25, 0.25, 0.5]
    assert mix["books"]["rate"] == 1.25 and mix["web"]["rate"] == 1.0
    expected_tokens = sum(COUNTS[name]["tokens"] * entry["rate"] for name, entry in mix.items())
    assert expected_tokens == pytest.approx(sum(entry["tokens"] for entry in COUNTS.values()))


def test_repeat_counts_are_epochs_and_a_source_not_named_is_read_once():
    mix = mixture.source_mix(COUNTS, MixtureConfig(repeat={"books": 3, "web": 0.5}))
    assert {name: entry["rate"] for name, entry in mix.items()} == {"books": 3.0, "wikipedia": 1.0, "web": 0.5}
    assert mix["books"]["requested_share"] == pytest.approx(24000 / (24000 + 12000 + 10000), abs=1e-9)


def test_a_source_read_without_a_weight_or_weighted_without_documents_is_refused_naming_it():
    with pytest.raises(InputError, match=r"no weight for wikipedia.*mixture\.weights\.wikipedia"):
        mixture.check_sources(["book", "wiki", "jsonl:web"], MixtureConfig(weights={"books": 1, "web": 1}))
    with pytest.raises(InputError, match=r"mixture\.weights\.empty: the inputs hold no documents"):
        mixture.source_mix(COUNTS, MixtureConfig(weights={"books": 1, "wikipedia": 1, "web": 1, "empty": 1}))
    with pytest.raises(InputError, match=r"no weight for books, which this run reads"):  # before the run
        mixture.check_sources(["wiki", "book", "jsonl:web"], MixtureConfig(weights={"wikipedia": 1, "web": 1}))
    mixture.check_sources(["wiki", "book"], MixtureConfig(repeat={"books": 2}))


def test_each_document_s_copies_average_its_rate_by_a_draw_of_its_id_alone():
    doc_ids = [f"web:https://example.org/{i}" for i in range(20000)]
    copies = mixture.document_copies(7, doc_ids, source_of, {"web": 0.35}, dupe_factor=5)
    assert set(np.unique(copies)) == {1, 2} and copies.mean() == pytest.approx(1.75, abs=0.02)
    again = mixture.document_copies(7, doc_ids[::-1], source_of, {"web": 0.35}, dupe_factor=5)
    assert (again[::-1] == copies).all()  # order (and so workers and parts) changes nothing
    assert not (mixture.document_copies(8, doc_ids, source_of, {"web": 0.35}, 5) == copies).all()


def test_the_languages_mix_is_the_same_mechanism():
    counts = {"en": {"documents": 90, "sentences": 900, "tokens": 9000},
              "sw": {"documents": 10, "sentences": 100, "tokens": 1000}}
    mix = languages.language_mix(counts, MultilingualConfig(enabled=True, alpha=0.5))
    q = languages.smoothed_shares({"en": 9000, "sw": 1000}, 0.5)
    assert mix == mixture.mix_entries(counts, q, "tokens", "sampled_share")
    doc_ids = [f"wiki:swwiki:{i}" for i in range(50)]
    assert (languages.document_copies(3, doc_ids, {"wiki:swwiki": "sw"}, mix, 5) ==
            mixture.document_copies(3, doc_ids, lambda _: "sw", {"sw": mix["sw"]["rate"]}, 5)).all()


def test_the_config_refuses_an_unknown_source_both_kinds_a_non_positive_value_and_languages_besides():
    web = InputSourceConfig(name="web", format="jsonl", paths=["crawl/"])
    PreprocessConfig(inputs=[web], mixture=MixtureConfig(weights={"web": 2, "books": 1}))
    with pytest.raises(ValueError, match=r"mixture\.weights names 'news', which is no source"):
        PreprocessConfig(inputs=[web], mixture=MixtureConfig(weights={"news": 1}))
    with pytest.raises(ValueError, match="both weights and repeat"):
        MixtureConfig(weights={"web": 1}, repeat={"books": 2})
    for value in (0, -1, True, "half"):
        with pytest.raises(ValueError, match=r"mixture\.repeat\.books is .*above 0"):
            MixtureConfig(repeat={"books": value})
    with pytest.raises(ValueError, match="mixture and multilingual.enabled are both set"):
        PreprocessConfig(mixture=MixtureConfig(repeat={"books": 2}), multilingual=MultilingualConfig(enabled=True))


def test_the_resolved_config_leaves_the_section_out_while_it_is_empty():
    assert "mixture" not in configlib.to_dict(PreprocessConfig())
    assert configlib.to_dict(PreprocessConfig(mixture=MixtureConfig(repeat={"books": 2})))["mixture"] == {
        "weights": {}, "repeat": {"books": 2}}
