"""Tokenizers for BERT pretraining: SentencePiece (trained here), WordPiece (a BERT ``vocab.txt``) and a Hugging
Face ``tokenizer.json`` (``common.tokenizer_hf``), behind one interface (``common.tokenizer_base.Tokenizer``), and
``load_tokenizer``, which loads any of them from a path or URI.
"""
from __future__ import annotations

import json
import os

import numpy as np
import sentencepiece as spm
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from common import storage
from common.errors import InputError, storage_failure
from common.tokenizer_base import (
    _BRACKETED_TOKEN,
    META_FILE,
    SENTENCEPIECE_FILE,
    SPECIAL_TOKENS,
    WORDPIECE_FILE,
    Tokenizer,
    TokenizersLibraryCalls,
    _local_path,
    keep_batches_on_this_thread,
)
from common.tokenizer_hf import HuggingFaceTokenizer, is_huggingface_file

_ACCEPTED = ("a directory written by Tokenizer.save() (it holds tokenizer.json), a SentencePiece .model file, a "
             "WordPiece vocab.txt file, or a Hugging Face tokenizer.json (or the directory that holds it)")


def _single_text_encoder(sp: spm.SentencePieceProcessor):
    """text -> ids through the binding's own one-text call, or None where this sentencepiece version has none.

    Its list call starts and joins a thread per call, even with num_threads=1: on a machine whose cores are all
    busy, each start waits for a core, leaving pool workers idle (bench/results/preprocess-*.json). Per text, the
    binding call (skipping ``Encode``'s argument handling) costs the same CPU as the list call.
    """
    native = getattr(getattr(sp, "_processor", None), "_EncodeAsIds", None)
    if native is None:
        return None
    options = (sp._enable_sampling, sp._nbest_size, sp._alpha, sp._add_bos, sp._add_eos, sp._reverse)
    return lambda text: native(text, *options)


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model whose pad/unk pieces and control symbols are the BERT special tokens."""

    kind = "sentencepiece"
    file_name = SENTENCEPIECE_FILE

    def _load(self, payload: bytes) -> list[str]:
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(payload)
        except Exception as error:  # the library raises RuntimeError/OSError/ValueError by version
            raise InputError(f"{self._source}: not a readable SentencePiece model ({str(error).strip()}); the file "
                             "is truncated or not a .model: copy it again, or point tokenizer.path at a valid "
                             ".model file, or retrain it") from None
        # Lowercasing is part of the model's normalizer ("nmt_nfkc_cf" case-folds), not a setting.
        self.lowercase = self._sp.Normalize("ABC") == self._sp.Normalize("abc")
        self._encode_one = _single_text_encoder(self._sp)
        return [self._sp.IdToPiece(i) for i in range(self._sp.GetPieceSize())]

    def _missing_fix(self) -> str:
        return ("train the model with common.tokenizer.train_sentencepiece (which reserves them at ids 0-4) "
                "or add them as pad/unk pieces and control_symbols")

    def _continuation_flags(self) -> np.ndarray:
        sp = self._sp
        return np.array([not (sp.IsControl(i) or sp.IsUnknown(i))
                         and (sp.IsByte(i) or not piece.startswith("\u2581"))
                         for i, piece in enumerate(self._tokens)], dtype=bool)

    def _replaceable_flags(self) -> np.ndarray:
        sp = self._sp
        return np.array([not (sp.IsControl(i) or sp.IsUnknown(i) or sp.IsUnused(i))
                         for i in range(self.vocab_size)], dtype=bool)

    def encode(self, text: str) -> list[int]:
        return self._sp.Encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._encode_one is not None:
            return [self._encode_one(text) for text in texts]
        return self._sp.Encode(texts if isinstance(texts, list) else list(texts), out_type=int, num_threads=1)

    def decode(self, ids) -> str:
        return self._sp.Decode([int(i) for i in ids])

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        pieces = self._sp.Encode(text, return_type="proto").pieces
        # SentencePiece reports UTF-8 byte offsets into the input; convert them to character offsets.
        char_at = np.zeros(len(text.encode("utf-8")) + 1, dtype=np.int64)
        position = 0
        for index, char in enumerate(text):
            width = len(char.encode("utf-8"))
            char_at[position:position + width] = index
            position += width
        char_at[position] = len(text)
        spans = []
        for piece in pieces:
            start, end = int(char_at[piece.begin]), int(char_at[piece.end])
            while start < end and text[start].isspace():  # the "▁" word-boundary marker covers a space
                start += 1
            spans.append((start, end))
        return [p.id for p in pieces], spans


class WordPieceTokenizer(TokenizersLibraryCalls, Tokenizer):
    """A BERT ``vocab.txt`` with BERT's normalizer and pre-tokenizer (Hugging Face ``tokenizers``)."""

    kind = "wordpiece"
    file_name = WORDPIECE_FILE

    def _load(self, payload: bytes) -> list[str]:
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(f"{self._source}: a WordPiece vocab.txt must be UTF-8 ({error}); "
                             f"re-save it as UTF-8") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the final newline ends the last token; it does not start an empty one
        tokens = [line.rstrip("\r") for line in lines]
        vocab = {token: i for i, token in enumerate(tokens)}  # a repeated token keeps its last line
        if len(vocab) < len(tokens):
            token = next(token for i, token in enumerate(tokens) if vocab[token] != i)
            raise InputError(f"{self._source}: token {token!r} appears twice (lines {tokens.index(token) + 1} and "
                             f"{vocab[token] + 1}); a vocab.txt needs one token per line, each once")
        self._hf = _HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=200))
        # As google-research/bert: accents are stripped exactly when lowercasing (uncased models).
        self._hf.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=self.lowercase, lowercase=self.lowercase)
        self._hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._hf.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        # encode_batch_fast skips the character offsets we never use; older releases lack it.
        self._hf_encode_batch = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)
        return tokens

    def _missing_fix(self) -> str:
        return ("add the missing token(s) as lines of vocab.txt (bert-base vocabularies have [PAD] at 0 and "
                "[UNK] [CLS] [SEP] [MASK] at 100-103) or use a BERT vocab.txt")

    def _continuation_flags(self) -> np.ndarray:
        return np.array([token.startswith("##") and len(token) > 2 for token in self._tokens], dtype=bool)

    def _replaceable_flags(self) -> np.ndarray:
        return np.array([not _BRACKETED_TOKEN.match(token) for token in self._tokens], dtype=bool)

    def with_tokens(self, tokens: list[str]) -> "WordPieceTokenizer":
        """The same tokenizer with ``tokens`` as its vocabulary (token i at id i)."""
        return WordPieceTokenizer(("\n".join(tokens) + "\n").encode("utf-8"), self.lowercase, self._source)


_KINDS = {cls.kind: cls for cls in (SentencePieceTokenizer, WordPieceTokenizer, HuggingFaceTokenizer)}


def load_tokenizer(path: str, lowercase: bool = True) -> Tokenizer:
    """Loads a tokenizer from a saved directory, a SentencePiece ``.model``, a WordPiece ``vocab.txt`` or a Hugging
    Face ``tokenizer.json``.

    Args:
        path: Local path or smart_open URI (s3://..., gs://...). A directory (or URI prefix without a
            ``.model``/``.txt``/``.json`` name) must hold a ``tokenizer.json``: ours, as written by ``save()``, or
            a Hugging Face one (a directory written by ``save_pretrained``).
        lowercase: For a bare ``vocab.txt`` only (bert-*-uncased: True). A saved directory records
            its own setting, and a SentencePiece model carries its normalizer.

    Raises:
        InputError: The path is missing or unreadable, is not a tokenizer, or lacks a special token.
    """
    path = str(path)
    local = _local_path(path)
    if local is not None:
        if not os.path.exists(local):
            raise InputError(f"{path}: tokenizer path does not exist; set tokenizer.path to {_ACCEPTED}")
        is_directory = os.path.isdir(local)
        path = local
    else:
        # Object stores have no directories: a name without a tokenizer file suffix is a prefix.
        is_directory = not path.rstrip("/").endswith((".model", ".txt", ".json")) or path.endswith("/")
    name = os.path.basename(path.rstrip("/"))
    if is_directory:
        return _load_saved(path.rstrip("/"))
    if name == META_FILE:
        return _load_saved(path[: -len(META_FILE)].rstrip("/") or ".")
    if name.endswith(".json"):
        payload = _read_bytes(path)
        if is_huggingface_file(payload):
            return HuggingFaceTokenizer(payload, lowercase=False, source=path)
        raise InputError(f"{path}: not a Hugging Face tokenizer file (it has no model); set tokenizer.path to "
                         f"{_ACCEPTED}")
    if name.endswith(".model"):
        return SentencePieceTokenizer(_read_bytes(path), lowercase=False, source=path)
    if name.endswith(".txt"):
        return WordPieceTokenizer(_read_bytes(path), lowercase=lowercase, source=path)
    raise InputError(f"{path}: unrecognised tokenizer file (expected a .model or vocab.txt name); "
                     f"set tokenizer.path to {_ACCEPTED}")


def _load_saved(directory: str) -> Tokenizer:
    """Loads a directory written by ``Tokenizer.save()`` and checks it against its recorded identity, or the
    Hugging Face ``tokenizer.json`` of a directory written by ``save_pretrained``."""
    meta_path = storage.join(directory, META_FILE)
    local = _local_path(directory)
    if local is not None and not os.path.isfile(meta_path):
        present = ", ".join(sorted(_listing(local))[:10]) or "nothing"
        raise InputError(f"{directory}: directory has no {META_FILE} (it holds {present}); point tokenizer.path "
                         f"at the .model or vocab.txt file itself, or at a directory written by Tokenizer.save() or "
                         f"save_pretrained")
    payload = _read_bytes(meta_path)
    if is_huggingface_file(payload):
        return HuggingFaceTokenizer(payload, lowercase=False, source=meta_path)
    try:
        meta = json.loads(payload)
    except (ValueError, RecursionError) as error:  # RecursionError: thousands of nested [
        raise InputError(f"{meta_path}: not valid JSON ({error}); the file is truncated or damaged: copy the "
                         "tokenizer directory again, or re-save the tokenizer") from None
    kind = meta.get("kind") if isinstance(meta, dict) else None
    # save() writes the kind's own file name: any other name (a path leading out of the directory) is not ours.
    if not isinstance(kind, str) or kind not in _KINDS or meta.get("file") != _KINDS[kind].file_name:
        raise InputError(f"{meta_path}: not a tokenizer meta file written by Tokenizer.save(), nor a Hugging "
                         f"Face tokenizer file; point tokenizer.path at the vocab.txt or .model file instead")
    file = storage.join(directory, meta["file"])
    tokenizer = _KINDS[kind](_read_bytes(file), bool(meta.get("lowercase")), source=file)
    recorded = {key: meta.get(key) for key in tokenizer.identity()}
    if recorded["vocab_size"] != tokenizer.vocab_size:
        size = recorded["vocab_size"]
        size = f"{size:,}" if type(size) is int else repr(size)  # a damaged file may hold any JSON value here
        raise InputError(f"{file}: {tokenizer.vocab_size:,} ids where {META_FILE} records {size}; "
                         "the file is truncated or was replaced: copy the tokenizer directory again, or re-save the "
                         "tokenizer")
    if recorded != tokenizer.identity():
        raise InputError(f"{directory}: {meta['file']} does not match {META_FILE} (recorded {recorded}, "
                         f"found {tokenizer.identity()}); the files were mixed up: re-save the tokenizer")
    return tokenizer


def _listing(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError as error:
        raise _unreadable(directory, error) from None


def _read_bytes(path: str) -> bytes:
    try:
        with storage.open_file(path, "rb") as handle:
            return handle.read()
    except Exception as error:  # object stores raise each transport's own errors (OSError, botocore, ...)
        raise _unreadable(path, error) from None


def _unreadable(path: str, error: BaseException) -> InputError:
    failure = storage_failure(error, path=path, doing="reading the tokenizer", writing=False)
    if failure is not None:  # permission denied: say so, and only that
        return InputError(str(failure))
    return InputError(f"{path}: cannot read the tokenizer file ({type(error).__name__}: {error}); check the path "
                      f"and access rights, and that it is {_ACCEPTED}")


# The interface and its constants are re-exported: every stage imports them from here.
__all__ = ["META_FILE", "SENTENCEPIECE_FILE", "SPECIAL_TOKENS", "WORDPIECE_FILE", "HuggingFaceTokenizer",
           "SentencePieceTokenizer", "Tokenizer", "WordPieceTokenizer", "keep_batches_on_this_thread",
           "load_tokenizer"]
