"""The held-out selection's pure parts: a count is the same documents however the keys were cut into buckets and
parts, a share is a threshold on a seeded key, and the config refuses what cannot work, naming the key."""
from __future__ import annotations

import numpy as np
import pytest

from common import configlib
from common.errors import ConfigError, InputError
from common.hashing import stable_hash64
from common.preprocess_config import HeldoutConfig, HeldoutSourceConfig, PreprocessConfig
from preprocess import docstore, heldout

IDS = [f"wiki:enwiki:{i}" for i in range(400)] + [f"book:b{i % 7}.txt:{i:04d}" for i in range(300)]
CFG = HeldoutConfig(wikipedia=HeldoutSourceConfig(documents=25), books=HeldoutSourceConfig(share=0.1))


def _chosen(counts: dict, seed: int = 7) -> set[str]:
    limits = heldout.thresholds(CFG, counts)
    return {d for d, held in zip(IDS, heldout.is_heldout(limits, seed, IDS)) if held}


@pytest.mark.parametrize("cuts", [1, 3, 64])
def test_a_count_holds_out_the_same_documents_however_the_corpus_is_cut(cuts):
    where = np.random.default_rng(cuts).integers(0, cuts, len(IDS))
    buckets = [[IDS[i] for i in np.flatnonzero(where == b)] for b in range(cuts)]
    parts = [heldout.trim_counts(docstore.add_counts([heldout.bucket_counts(CFG, 7, ids) for ids in buckets[p::2]]),
                                 CFG) for p in range(2)]
    assert all(len(p.get("heldout_keys", {}).get("wikipedia", [])) <= 25 for p in parts)  # each part keeps at most N
    chosen = _chosen(docstore.add_counts(parts))
    smallest = sorted(IDS[:400], key=lambda d: heldout.heldout_key(7, d))[:25]
    assert {d for d in chosen if d.startswith("wiki:")} == set(smallest)
    assert chosen == _chosen(docstore.add_counts([heldout.bucket_counts(CFG, 7, IDS)]))


def test_the_config_inputs_sources_are_counted_and_never_held_out_yet():
    ids = IDS + [f"web:crawl.jsonl:{i * 80}" for i in range(50)]
    counts = heldout.bucket_counts(CFG, 7, ids)
    assert counts["heldout_sources"]["web"] == 50 and "web" not in counts["heldout_keys"]
    limits = heldout.thresholds(CFG, counts)
    assert "web" not in limits and not heldout.is_heldout(limits, 7, ids)[len(IDS):].any()
    assert heldout.is_heldout(limits, 7, ids)[:len(IDS)].any()


def test_a_share_is_a_threshold_on_the_seeded_key():
    chosen = {d for d in _chosen({}) if d.startswith("book:")}
    assert chosen == {d for d in IDS[400:] if stable_hash64(7, "heldout", d) < 0.1 * 2**64}
    assert 10 < len(chosen) < 50
    assert chosen != {d for d in _chosen({}, seed=8) if d.startswith("book:")}


def test_a_count_of_every_document_is_refused():
    counts = {"heldout_sources": {"wikipedia": 25}, "heldout_keys": {"wikipedia": list(range(25))}}
    with pytest.raises(InputError, match="heldout.wikipedia.documents is 25 .* leaves no training documents"):
        heldout.thresholds(CFG, counts)


@pytest.mark.parametrize("section, message", [
    ({"books": {"share": 1.0}}, r"heldout.books.share is 1.0: .* leaves no training documents; set heldout.books.share"
                                r" below 1"),
    ({"wikipedia": {"share": 0.1, "documents": 3}}, "choose a count or a share"),
    ({"books": {"count": 3}}, "unknown key 'count'"),
])
def test_the_config_refuses_what_cannot_work(section, message):
    with pytest.raises(ConfigError, match=message):
        configlib.from_dict(PreprocessConfig, {"heldout": section}, "run.yaml")


def test_no_section_means_no_split_and_the_same_resolved_config():
    assert not PreprocessConfig().heldout.enabled
    assert "heldout" not in configlib.to_dict(PreprocessConfig())  # datasets and jobs without a split as before
    split = configlib.from_dict(PreprocessConfig, {"heldout": {"books": {"documents": 2}}})
    assert split.heldout.enabled and configlib.to_dict(split)["heldout"]["books"] == {"documents": 2, "share": 0.0}
    assert configlib.from_dict(PreprocessConfig, configlib.to_dict(split)) == split
