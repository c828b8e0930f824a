"""Sampling cleaned sentences from the corpus to train a vocabulary."""
from __future__ import annotations

from preprocess import books, sources, text
from preprocess.config import SourceConfig
from preprocess.hashing import rng_for
from preprocess.records import RawDocument


def sample_sentences(files: list[tuple[str, str]], cfg: SourceConfig, max_sentences: int, seed: int) -> list[str]:
    """A uniform, reproducible sample (reservoir) of up to ``max_sentences`` cleaned sentences."""
    rng = rng_for(seed, "vocab-sample")
    reservoir: list[str] = []
    seen = 0
    for kind, uri in files:
        reader = sources.iter_wikipedia if kind == "wiki" else books.iter_book
        for item in reader(uri, cfg):
            if not isinstance(item, RawDocument):
                continue
            document = text.to_document(item, cfg)
            for sentence in getattr(document, "sentences", ()):
                seen += 1
                if len(reservoir) < max_sentences:
                    reservoir.append(sentence)
                else:
                    slot = rng.randrange(seen)
                    if slot < max_sentences:
                        reservoir[slot] = sentence
    return reservoir
