"""Training a vocabulary: a sample of cleaned sentences from the corpus, and SentencePiece trained on it."""
from __future__ import annotations

import io
from typing import Iterable, Iterator

import sentencepiece as spm

from common.hashing import rng_for
from common.preprocess_config import InputSourceConfig, MultilingualConfig, SourceConfig
from common.tokenizer import SPECIAL_TOKENS, SentencePieceTokenizer
from preprocess import languages, readers, text
from preprocess.records import RawDocument

_MIN_SENTENCEPIECE_VOCAB = len(SPECIAL_TOKENS) + 256 + 1  # specials + byte-fallback pieces + one more


def _documents(files: list[tuple[str, str]], cfg: SourceConfig,
               inputs: tuple[InputSourceConfig, ...]) -> Iterator[tuple[RawDocument, tuple[str, ...]]]:
    """(raw document, its cleaned sentences) of every document of ``files`` ((key, uri): ``preprocess.readers``;
    ``inputs``: the config's sources that the keys name) that is read; rejected records are passed over."""
    for key, uri in files:
        spec = readers.spec_of(key, inputs)
        limits = readers.source_config(spec, cfg)
        for item in readers.reader_of(key).read(uri, None, spec, limits, {}):
            if isinstance(item, RawDocument):
                yield item, getattr(text.to_document(item, limits), "sentences", ())


def sample_sentences(files: list[tuple[str, str]], cfg: SourceConfig, max_sentences: int, seed: int,
                     inputs: tuple[InputSourceConfig, ...] = ()) -> list[str]:
    """A uniform, reproducible sample (reservoir) of up to ``max_sentences`` cleaned sentences."""
    rng = rng_for(seed, "vocab-sample")
    reservoir: list[str] = []
    seen = 0
    for _, sentences in _documents(files, cfg, inputs):
        for sentence in sentences:
            seen += 1
            if len(reservoir) < max_sentences:
                reservoir.append(sentence)
            else:
                slot = rng.randrange(seen)
                if slot < max_sentences:
                    reservoir[slot] = sentence
    return reservoir


def sample_sentences_by_language(files: list[tuple[str, str]], cfg: SourceConfig, multilingual: MultilingualConfig,
                                 max_sentences: int, seed: int,
                                 inputs: tuple[InputSourceConfig, ...] = ()) -> tuple[list[str], dict[str, dict]]:
    """A sample of cleaned sentences whose languages are mixed as the dataset's rows are: language i gets a share
    q_i ∝ p_i^alpha of the sample (``languages.sample_quotas``), drawn from a uniform reservoir of its own sentences,
    and repeated when it has fewer sentences than its share (mBERT's smoothing of its WordPiece training data).

    p_i is each language's share of characters (``multilingual.basis: tokens``: there are no tokens before the
    vocabulary) or of sentences. The sample has ``min(max_sentences, sentences read)`` sentences; memory holds up to
    ``max_sentences`` sentences per language.

    Returns:
        The sentences (in a seeded order) and, per language, the sentences read, the size p was taken from and the
        sentences sampled.
    """
    reservoirs: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for item, sentences in _documents(files, cfg, inputs):
        if not sentences:
            continue
        language = languages.language_for(item.doc_id, item.source, multilingual)
        reservoir = reservoirs.setdefault(language, [])
        rng = rng_for(seed, "vocab-sample", language, seen.get(language, 0))  # keyed: no shared state
        for sentence in sentences:
            seen[language] = seen.get(language, 0) + 1
            sizes[language] = sizes.get(language, 0) + (len(sentence) if multilingual.basis == "tokens" else 1)
            if len(reservoir) < max_sentences:
                reservoir.append(sentence)
            else:
                slot = rng.randrange(seen[language])
                if slot < max_sentences:
                    reservoir[slot] = sentence
    quotas = languages.sample_quotas(sizes, multilingual.alpha, min(max_sentences, sum(seen.values())))
    sample: list[str] = []
    for language in sorted(quotas):
        sample.extend(_take(reservoirs[language], quotas[language], rng_for(seed, "vocab-take", language)))
    rng_for(seed, "vocab-order").shuffle(sample)
    mix = {language: {"sentences": seen[language], "size": sizes[language], "sampled": quotas[language]}
           for language in sorted(quotas)}
    return sample, mix


def _take(pool: list[str], count: int, rng) -> list[str]:
    """``count`` items of ``pool``: a sample without repetition, or the whole pool repeated, then a sample."""
    whole, rest = divmod(count, len(pool))
    return pool * whole + rng.sample(pool, rest)


def train_sentencepiece(sentences: Iterable[str], vocab_size: int, output_dir: str, *, lowercase: bool = False,
                        model_type: str = "unigram", seed: int = 12345, character_coverage: float = 0.9999,
                        max_sentence_length: int = 16384, input_sentence_size: int = 0,
                        extra_options: dict | None = None) -> SentencePieceTokenizer:
    """Trains a SentencePiece model with the BERT special tokens at ids 0-4 and saves it.

    Training runs on one thread with a fixed seed, so the same sentences give the same model bytes.

    Args:
        sentences: Training text, one sentence per item (blank items are skipped).
        vocab_size: Number of pieces, including the 5 special tokens and 256 byte-fallback pieces.
        output_dir: Local directory or URI prefix to save ``spm.model`` and ``tokenizer.json`` into.
        lowercase: Case-fold text ("nmt_nfkc_cf" normalizer) instead of plain NFKC ("nmt_nfkc").
        model_type: "unigram" (default) or "bpe".
        seed: Seeds SentencePiece's generator (used when sampling ``input_sentence_size`` sentences).
        character_coverage: Share of characters covered by pieces; the rest fall back to bytes.
        max_sentence_length: Longer sentences (in bytes) are skipped by the trainer.
        input_sentence_size: Sample at most this many sentences (0: use all).
        extra_options: More SentencePieceTrainer options, overriding the ones above.

    Returns:
        The trained tokenizer (already saved to ``output_dir``).

    Raises:
        ValueError: ``vocab_size`` is too small, or training failed (e.g. too little text for the size).
    """
    if vocab_size < _MIN_SENTENCEPIECE_VOCAB:
        raise ValueError(f"vocab_size must be at least {_MIN_SENTENCEPIECE_VOCAB} (5 special tokens + 256 "
                         f"byte-fallback pieces + text pieces), got {vocab_size}")
    options = dict(
        model_type=model_type, vocab_size=vocab_size,
        pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
        # Control symbols (unlike user-defined ones) are never produced from text, so a literal
        # "[MASK]" in a document cannot turn into the mask id. They take ids 2, 3, 4 in this order.
        control_symbols=list(SPECIAL_TOKENS[2:]),
        byte_fallback=True, character_coverage=character_coverage,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        max_sentence_length=max_sentence_length, input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True, num_threads=1, minloglevel=2,
    )
    options.update(extra_options or {})
    spm.set_random_generator_seed(seed)
    nonblank = (sentence for sentence in sentences if sentence and not sentence.isspace())
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.Train(sentence_iterator=nonblank, model_writer=model, **options)
    except RuntimeError as error:
        raise ValueError(f"SentencePiece training failed: {error} (with vocab_size={vocab_size}: if the vocabulary "
                         f"is too large for the text, lower vocab_size or pass more sentences)") from None
    tokenizer = SentencePieceTokenizer(model.getvalue(), lowercase=lowercase, source=f"trained for {output_dir}")
    tokenizer.save(output_dir)
    return tokenizer
