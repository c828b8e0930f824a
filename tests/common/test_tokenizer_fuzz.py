"""Fuzzing the tokenizer files (common.tokenizer): a vocab.txt, our tokenizer.json and a SentencePiece spm.model,
mutated or damaged, load into a tokenizer that encodes, or are refused in one InputError line naming the file."""
import hashlib
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import tokenizer as tok
from common.errors import InputError
from preprocess import vocab
from tests.fuzz_documents import FUZZ, damaged_bytes, listing, mutated

VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", ",", ".", "hello", "caf",
         "##e", "\u00e9"]
VOCAB_BYTES = ("\n".join(VOCAB) + "\n").encode()
META = {"kind": "wordpiece", "vocab_size": len(VOCAB), "lowercase": True, "file": "vocab.txt",
        "special_ids": {"[PAD]": 0, "[UNK]": 2, "[CLS]": 3, "[SEP]": 4, "[MASK]": 5},
        "vocab_sha256": hashlib.sha256("\n".join(VOCAB).encode()).hexdigest()}
TEXTS = ("hello the cats, caf\u00e9.", "", "\u202e\u0301 \U0010ffff \x00", "x" * 300)


def _load_and_use(path: str):
    """The tokenizer at ``path``, used as the pipeline uses it; None when refused (in one line naming ``path``)."""
    try:
        tokenizer = tok.load_tokenizer(path)
    except InputError as error:
        assert "\n" not in error.message and str(path).split("/")[-1] in error.message, error.message
        return None
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert all(0 <= i < tokenizer.vocab_size for i in ids)
        tokenizer.decode(ids)
        tokenizer.encode_with_offsets(text)
    return tokenizer


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> bytes:
    """A small SentencePiece model's bytes (trained on pseudo-words in a fraction of a second)."""
    rng = random.Random(7)
    words = ["".join(rng.choice(["ka", "lo", "mi", "ran", "te", "sto"]) for _ in range(rng.randint(1, 3)))
             for _ in range(300)]
    sentences = [" ".join(rng.choice(words) for _ in range(8)) + "." for _ in range(400)]
    directory = tmp_path_factory.mktemp("spm")
    vocab.train_sentencepiece(iter(sentences), vocab_size=300, output_dir=str(directory))
    return (directory / tok.SENTENCEPIECE_FILE).read_bytes()


def test_vocab_files_of_odd_lines_load_or_are_refused_in_one_line(tmp_path):
    lines = st.lists(st.one_of(st.sampled_from(VOCAB), st.text(max_size=6)), max_size=30)

    @settings(FUZZ, max_examples=150)
    @given(lines, st.sampled_from(["\n", "\r\n", "\r", "\t", "\x85"]), st.sampled_from([b"", b"\xff", b"\xc3"]))
    def check(tokens, separator, tail):
        path = tmp_path / "vocab.txt"
        path.write_bytes(separator.join(tokens).encode("utf-8", "surrogatepass") + tail)
        _load_and_use(str(path))

    check()


def test_damaged_vocab_files_load_or_are_refused_in_one_line(tmp_path):
    @settings(FUZZ, max_examples=150)
    @given(damaged_bytes(VOCAB_BYTES))
    def check(data):
        path = tmp_path / "vocab.txt"
        path.write_bytes(data)
        _load_and_use(str(path))

    check()


def test_mutated_tokenizer_meta_files_load_or_are_refused_in_one_line(tmp_path):
    directory = tmp_path / "tokenizer"
    directory.mkdir()
    (directory / "vocab.txt").write_bytes(VOCAB_BYTES)

    @settings(FUZZ, max_examples=150)
    @given(st.one_of(mutated(META).map(lambda meta: json.dumps(meta).encode()),
                     damaged_bytes(json.dumps(META).encode())))
    def check(data):
        (directory / tok.META_FILE).write_bytes(data)
        _load_and_use(str(directory))
        assert listing(tmp_path) == ["tokenizer", "tokenizer/tokenizer.json", "tokenizer/vocab.txt"]

    check()


def test_damaged_sentencepiece_models_load_or_are_refused_in_one_line(tmp_path, spm_model):
    flips = st.lists(st.tuples(st.integers(0, len(spm_model) - 1), st.integers(0, 255)), max_size=4)

    @FUZZ
    @given(st.one_of(damaged_bytes(spm_model),
                     flips.map(lambda edits: _flipped(spm_model, edits))))
    def check(data):
        path = tmp_path / "spm.model"
        path.write_bytes(data)
        _load_and_use(str(path))

    check()


def _flipped(data: bytes, edits) -> bytes:
    changed = bytearray(data)
    for offset, value in edits:
        changed[offset] = value
    return bytes(changed)


# ---- regressions: each a bug the fuzzing found, kept as a plain test

def _saved(tmp_path, meta) -> str:
    directory = tmp_path / "tokenizer"
    directory.mkdir(exist_ok=True)
    (directory / "vocab.txt").write_bytes(VOCAB_BYTES)
    (directory / tok.META_FILE).write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return str(directory)


def test_a_meta_file_naming_a_file_outside_its_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere.txt").write_bytes(VOCAB_BYTES)
    with pytest.raises(InputError, match="not a tokenizer meta file written by Tokenizer.save"):
        tok.load_tokenizer(_saved(tmp_path, {**META, "file": "../elsewhere.txt"}))


@pytest.mark.parametrize("kind", [{"name": "wordpiece"}, ["wordpiece"], 7])
def test_a_meta_file_whose_kind_is_not_a_string_is_refused(tmp_path, kind):
    with pytest.raises(InputError, match="not a tokenizer meta file"):
        tok.load_tokenizer(_saved(tmp_path, {**META, "kind": kind}))


def test_a_meta_file_whose_vocab_size_is_not_a_number_is_refused_naming_the_file(tmp_path):
    with pytest.raises(InputError, match=r"vocab\.txt: 15 ids where tokenizer\.json records 'many'"):
        tok.load_tokenizer(_saved(tmp_path, {**META, "vocab_size": "many"}))


def test_a_meta_file_nested_thousands_deep_is_refused_not_a_recursion_error(tmp_path):
    with pytest.raises(InputError, match=r"tokenizer\.json: not valid JSON"):
        tok.load_tokenizer(_saved(tmp_path, "[" * 100_000))
