"""The tokenizer interface every stage uses (``Tokenizer``), BERT's special tokens and the saved layout.

A ``Tokenizer`` exposes the fixed BERT special tokens, the per-id tables the masking step needs
(``is_continuation`` for whole-word masking, ``replacement_ids`` for the "random token" replacement) and an
``identity`` that the pretraining stage checks against the data. Objects pickle as their file's bytes, so Beam can
ship them to workers. The kinds live in ``common.tokenizer`` (SentencePiece, WordPiece) and
``common.tokenizer_hf`` (a Hugging Face ``tokenizer.json``); ``common.tokenizer.load_tokenizer`` loads any of them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np

from common import storage
from common.errors import InputError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
META_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "spm.model"
WORDPIECE_FILE = "vocab.txt"
# "[unused0]", "[PAD]", ...: reserved slots, never a sensible random replacement.
_BRACKETED_TOKEN = re.compile(r"^\[[^\[\]]+\]$")


class Tokenizer:
    """Common interface and per-id tables; subclasses wrap one tokenization library.

    Attributes:
        kind: "sentencepiece" or "wordpiece".
        vocab_size: Number of ids.
        lowercase: Whether text is lowercased (and, for WordPiece, accent-stripped) before splitting.
        pad_id, unk_id, cls_id, sep_id, mask_id: Ids of the BERT special tokens.
        special_ids: {"[PAD]": pad_id, ...} for the five special tokens.
        is_continuation: Bool per id: True where the token continues a word (whole-word masking).
        replacement_ids: Int32 ids eligible as the BERT "random token" replacement.
    """

    kind = ""
    file_name = ""

    def __init__(self, payload: bytes, lowercase: bool, source: str):
        """Builds the tokenizer from its file contents.

        Args:
            payload: The model bytes (SentencePiece) or the vocab.txt bytes (WordPiece).
            lowercase: Whether to lowercase; SentencePiece ignores it (its model decides).
            source: Where the payload came from, for error messages.

        Raises:
            InputError: The payload is unreadable or lacks a BERT special token.
        """
        self._payload = bytes(payload)
        self._source = source
        self.lowercase = bool(lowercase)
        self._tokens = self._load(self._payload)
        self._token_ids = {token: i for i, token in enumerate(self._tokens)}
        self.vocab_size = len(self._tokens)
        missing = [token for token in SPECIAL_TOKENS if token not in self._token_ids]
        if missing:
            raise InputError(f"{source}: the {self.kind} vocabulary lacks the BERT special token(s) "
                             f"{', '.join(missing)}; {self._missing_fix()}")
        self.special_ids = {token: self._token_ids[token] for token in SPECIAL_TOKENS}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.special_ids[token] for token in SPECIAL_TOKENS)
        special = np.zeros(self.vocab_size, dtype=bool)
        special[list(self.special_ids.values())] = True
        self.is_continuation = self._continuation_flags() & ~special
        self.replacement_ids = np.flatnonzero(self._replaceable_flags() & ~special).astype(np.int32)
        self._vocab_sha256 = hashlib.sha256("\n".join(self._tokens).encode("utf-8")).hexdigest()

    # Subclasses provide _load(payload) -> tokens (building the library object), _missing_fix() -> str,
    # and _continuation_flags() / _replaceable_flags() -> bool arrays over the ids.

    def encode(self, text: str) -> list[int]:
        """Returns the ids of ``text``, without special tokens."""
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Returns ``[encode(t) for t in texts]``, on the calling thread only, with less overhead."""
        raise NotImplementedError

    def decode(self, ids) -> str:
        """Returns the text of ``ids`` (a sequence or numpy array of ints)."""
        raise NotImplementedError

    def words(self, text: str) -> list[str]:
        """The normalised words ``text`` is split into before the vocabulary's model cuts them (WordPiece kinds)."""
        raise NotImplementedError(f"a {self.kind} tokenizer does not split text into words before its model")

    def with_tokens(self, tokens: list[str]) -> "Tokenizer":
        """The same tokenizer with ``tokens`` as its vocabulary, token i at id i (WordPiece kinds)."""
        raise NotImplementedError(f"a {self.kind} vocabulary cannot be changed token by token")

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Returns the ids of ``text`` and, per id, its (start, end) character span in ``text``.

        Finetuning maps predictions back to the original text with these (SQuAD answers, CoNLL words).
        """
        raise NotImplementedError

    def id_to_token(self, i: int) -> str:
        return self._tokens[i]

    def token_to_id(self, token: str) -> int | None:
        return self._token_ids.get(token)

    def identity(self) -> dict:
        """What must agree between the tokenizer that made the data and the one that reads it."""
        return {"kind": self.kind, "vocab_size": self.vocab_size, "lowercase": self.lowercase,
                "special_ids": dict(self.special_ids), "vocab_sha256": self._vocab_sha256}

    def save(self, directory: str) -> None:
        """Writes the model file and ``tokenizer.json`` into a local directory or a URI prefix.

        The meta file goes last, so an interrupted save does not look like a complete one.
        """
        directory = str(directory)
        local = _local_path(directory)
        if local is not None:
            os.makedirs(local, exist_ok=True)
            directory = local
        _write_bytes(storage.join(directory, self.file_name), self._payload)
        meta = {**self.identity(), "file": self.file_name}
        _write_bytes(storage.join(directory, META_FILE), (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())

    def __getstate__(self) -> dict:
        # Only the file bytes travel: small, and independent of the libraries' own pickling support.
        return {"payload": self._payload, "lowercase": self.lowercase, "source": self._source}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["payload"], state["lowercase"], state["source"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
                f"source={self._source!r})")

class TokenizersLibraryCalls:
    """What the kinds built on Hugging Face's ``tokenizers`` library share (WordPiece, a ``tokenizer.json``): the
    library object in ``self._hf``, its batch call in ``self._hf_encode_batch``; no special tokens added."""

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # On the calling thread in the preprocessing job's workers (keep_batches_on_this_thread).
        return [encoding.ids for encoding in self._hf_encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        encoding = self._hf.encode(text, add_special_tokens=False)
        return encoding.ids, [tuple(span) for span in encoding.offsets]

    def words(self, text: str) -> list[str]:
        """The normalised words ``text`` is split into before the model cuts them (the library object's own
        normalizer and pre-tokenizer: for BERT, whitespace and punctuation after lowercasing where uncased)."""
        normalizer, pre_tokenizer = self._hf.normalizer, self._hf.pre_tokenizer
        normalised = normalizer.normalize_str(text) if normalizer is not None else text
        return [w for w, _ in pre_tokenizer.pre_tokenize_str(normalised)] if pre_tokenizer else normalised.split()


def keep_batches_on_this_thread() -> None:
    """Batch encoding on the calling thread from now on, in this process and the ones it starts: for the
    preprocessing job, whose workers already run one process per core, which Hugging Face's Rust thread pool would
    oversubscribe. The library reads the variable on every call; a user's own setting wins. Other stages keep the
    library's default."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

def _local_path(path: str) -> str | None:
    """The local filesystem path for a plain path or file:// URI; None for a remote URI."""
    return storage.local_path(path) if storage.is_local(path) else None


def _write_bytes(path: str, data: bytes) -> None:
    with storage.open_file(path, "wb") as handle:
        handle.write(data)
