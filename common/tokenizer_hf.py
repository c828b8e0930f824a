"""A Hugging Face ``tokenizer.json`` (the ``tokenizers`` library's file: what ``save_pretrained`` writes for every
fast tokenizer, and all that transformers 5 writes for BERT) as a ``Tokenizer``, with the ids ``AutoTokenizer``
gives for text without special tokens.

The file's normalizer, pre-tokenizer and model are used as they are (WordPiece, byte-level BPE, Unigram); its
truncation, padding and special-token template are not, as our stages add the special tokens themselves. Its
special tokens must be BERT's ([PAD] [UNK] [CLS] [SEP] [MASK]): the families whose tokens are ``<s> </s> <pad>
<mask>`` (RoBERTa, XLM-R) are refused in one line. Whole-word masking follows the model's own word boundaries:
WordPiece's continuing prefix (``##``), and the word-start marks of SentencePiece-style (``▁``) and byte-level
(``Ġ``) vocabularies.
"""
from __future__ import annotations

import json

import numpy as np
from tokenizers import Tokenizer as _HFTokenizer

from common.errors import InputError
from common.tokenizer_base import _BRACKETED_TOKEN, Tokenizer, TokenizersLibraryCalls

KIND = "huggingface"
FILE_NAME = "hf_tokenizer.json"  # in a directory written by Tokenizer.save(), beside our own tokenizer.json
_WORD_START = {"Metaspace": "\u2581", "ByteLevel": "\u0120"}  # pre-tokenizer -> the mark a word's first piece has


def is_huggingface_file(payload: bytes) -> bool:
    """Whether ``payload`` is a ``tokenizers`` JSON file (it has a ``model`` with a ``type``), not our meta file."""
    try:
        spec = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    return isinstance(spec, dict) and isinstance(spec.get("model"), dict) and "kind" not in spec


class HuggingFaceTokenizer(TokenizersLibraryCalls, Tokenizer):
    """A ``tokenizers`` JSON file with BERT's special tokens (``common.tokenizer.load_tokenizer`` chooses it)."""

    kind = KIND
    file_name = FILE_NAME

    def _load(self, payload: bytes) -> list[str]:
        try:
            self._spec = json.loads(payload)
            self._hf = _HFTokenizer.from_str(payload.decode("utf-8"))
        except Exception as error:  # JSON, UTF-8 or the library's own parse errors
            raise InputError(f"{self._source}: not a tokenizer file that the tokenizers library reads "
                             f"({str(error).strip()[:200]}); the file is truncated or damaged: copy it again, or "
                             "save the tokenizer again with save_pretrained") from None
        self._hf.no_truncation()
        self._hf.no_padding()
        self._hf_encode_batch = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)
        size = self._hf.get_vocab_size(with_added_tokens=True)
        tokens = [self._hf.id_to_token(i) for i in range(size)]
        if None in tokens:
            raise InputError(f"{self._source}: id {tokens.index(None)} has no token (ids must run from 0 to "
                             f"{size - 1} without gaps); save the tokenizer again with save_pretrained")
        self.lowercase = _lowercases(self._spec.get("normalizer"))
        self._special = {entry.get("content") for entry in self._spec.get("added_tokens") or ()
                         if isinstance(entry, dict) and entry.get("special")}
        return tokens

    def _missing_fix(self) -> str:
        found = sorted(token for token in self._special if isinstance(token, str))[:8]
        return (f"its special tokens are {', '.join(found) or 'none'}; RoBERTa-style tokenizers (<s>, </s>, <pad>, "
                "<mask>) are not supported yet: use a BERT-style tokenizer (a vocab.txt, or a tokenizer.json with "
                "BERT's special tokens)")

    def _continuation_flags(self) -> np.ndarray:
        model = self._spec["model"]
        if model.get("type") == "WordPiece":
            prefix = model.get("continuing_subword_prefix") or "##"
            return np.array([t.startswith(prefix) and len(t) > len(prefix) for t in self._tokens], dtype=bool)
        mark = _word_start(self._spec.get("pre_tokenizer"))
        if mark is None:
            return np.zeros(len(self._tokens), dtype=bool)  # no word boundaries known: each piece is a word
        return np.array([not t.startswith(mark) and t not in self._special for t in self._tokens], dtype=bool)

    def _replaceable_flags(self) -> np.ndarray:
        return np.array([t not in self._special and not _BRACKETED_TOKEN.match(t) for t in self._tokens], dtype=bool)

    def with_tokens(self, tokens: list[str]) -> "HuggingFaceTokenizer":
        """The same WordPiece file with ``tokens`` as its vocabulary (token i at id i; the added tokens keep theirs)."""
        if self._spec["model"].get("type") != "WordPiece":
            raise InputError(f"{self._source}: only a WordPiece vocabulary can be changed token by token, not a "
                             f"{self._spec['model'].get('type')} one")
        spec = json.loads(json.dumps(self._spec))
        spec["model"]["vocab"] = {token: i for i, token in enumerate(tokens)}
        return HuggingFaceTokenizer(json.dumps(spec, ensure_ascii=False).encode("utf-8"), self.lowercase,
                                    self._source)


def _steps(component) -> list[dict]:
    """A normalizer or pre-tokenizer and, for a Sequence, its steps."""
    if not isinstance(component, dict):
        return []
    inner = component.get("normalizers") or component.get("pretokenizers")
    return [step for part in inner for step in _steps(part)] if isinstance(inner, list) else [component]


def _lowercases(normalizer) -> bool:
    return any(step.get("type") == "Lowercase" or (step.get("type") == "BertNormalizer" and step.get("lowercase"))
               for step in _steps(normalizer))


def _word_start(pre_tokenizer) -> str | None:
    return next((_WORD_START[step["type"]] for step in _steps(pre_tokenizer) if step.get("type") in _WORD_START),
                None)


__all__ = ["FILE_NAME", "KIND", "HuggingFaceTokenizer", "is_huggingface_file"]
