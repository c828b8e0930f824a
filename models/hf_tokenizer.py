"""The tokenizer files of a Hugging Face directory, written from ours (``common.tokenizer``), so that
``transformers.AutoTokenizer`` gives the ids our stages gave, for every model family.

- WordPiece: BERT's ``vocab.txt`` and a ``tokenizer_config.json`` naming ``BertTokenizer`` (``ElectraTokenizer``
  for ELECTRA) with our lowercasing.
- A Hugging Face ``tokenizer.json`` (``common.tokenizer_hf``): the file itself, as it came, with a
  ``tokenizer_config.json`` naming the generic ``PreTrainedTokenizerFast`` and BERT's special tokens.
- SentencePiece: a ``tokenizers`` ``tokenizer.json`` built from the model itself: its pieces and scores (a unigram
  model with byte fallback), its own normalisation rules (the model's precompiled character map: nmt_nfkc,
  with case folding where trained so), SentencePiece's whitespace handling (trimmed, runs collapsed, "▁" before
  every word), and BERT's [CLS] a [SEP] b [SEP] around it. Its
  ``tokenizer_config.json`` names the generic ``PreTrainedTokenizerFast``, which reads only these two files, so
  no family's own SentencePiece preprocessing (ALBERT's lowercasing and quote rewriting) is applied on top.

Both kinds set ``split_special_tokens``: our stages never read a special token from text (a literal "[MASK]" in a
document is five characters, not the mask), and neither does the tokenizer a user loads.

Tests check the ids against ours on real text of every task (``tests/models/test_hf_tokenizer.py``).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from common.tokenizer import META_FILE, SENTENCEPIECE_FILE, SPECIAL_TOKENS, WORDPIECE_FILE
from common.tokenizer_hf import FILE_NAME as HF_SAVED_FILE
from common.tokenizer_hf import KIND as HF_KIND

HF_TOKENIZER_FILE = "tokenizer.json"  # transformers' fast tokenizer; ours lives in the tokenizer/ subdirectory
_SPECIAL_NAMES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")  # in SPECIAL_TOKENS' order


def unwritable_reason(tokenizer_dir: str | Path) -> str | None:
    """Why ``write_tokenizer_files`` cannot write ``transformers``' files for the tokenizer saved in
    ``tokenizer_dir``, or None when it can."""
    tokenizer_dir = Path(tokenizer_dir)
    kind = json.loads((tokenizer_dir / META_FILE).read_text()).get("kind")
    if kind in ("wordpiece", HF_KIND):
        return None
    if kind != "sentencepiece":
        return f"its tokenizer kind {kind!r} is unknown"
    proto = _model_proto((tokenizer_dir / SENTENCEPIECE_FILE).read_bytes())
    if proto.trainer_spec.model_type != proto.trainer_spec.UNIGRAM:
        return ("its SentencePiece model is not unigram (the vocabulary job's default), whose merges a "
                "transformers tokenizer would need rebuilt: retrain the vocabulary as unigram")
    return None


def write_tokenizer_files(tokenizer_dir: str | Path, directory: str | Path, *, max_length: int,
                          tokenizer_class: str = "BertTokenizer") -> bool:
    """Write into ``directory`` the ``transformers`` tokenizer files of the tokenizer saved in ``tokenizer_dir``
    (``Tokenizer.save()``): ``vocab.txt`` for WordPiece (read as ``tokenizer_class``), ``tokenizer.json`` for
    SentencePiece and Hugging Face files; with a ``tokenizer_config.json`` whose ``model_max_length`` is
    ``max_length``. False, writing nothing, where ``unwritable_reason`` gives a reason (a pretraining export then carries only ours)."""
    tokenizer_dir, directory = Path(tokenizer_dir), Path(directory)
    if unwritable_reason(tokenizer_dir) is not None:
        return False
    meta = json.loads((tokenizer_dir / META_FILE).read_text())
    if meta["kind"] == "wordpiece":
        shutil.copyfile(tokenizer_dir / WORDPIECE_FILE, directory / WORDPIECE_FILE)
        lower = bool(meta.get("lowercase", True))
        settings = {"tokenizer_class": tokenizer_class, "do_lower_case": lower,
                    "strip_accents": None if lower else False, "split_special_tokens": True}
    else:
        if meta["kind"] == HF_KIND:
            shutil.copyfile(tokenizer_dir / HF_SAVED_FILE, directory / HF_TOKENIZER_FILE)
        else:
            fast = sentencepiece_as_fast_tokenizer((tokenizer_dir / SENTENCEPIECE_FILE).read_bytes())
            fast.save(str(directory / HF_TOKENIZER_FILE))
        # token_type_ids too, as BertTokenizer gives them: the generic class gives only ids and the mask.
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "split_special_tokens": True,
                    "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
                    **dict(zip(_SPECIAL_NAMES, SPECIAL_TOKENS))}
    settings["model_max_length"] = max_length
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return True


def sentencepiece_as_fast_tokenizer(model_bytes: bytes):
    """A ``tokenizers.Tokenizer`` that encodes as the SentencePiece model ``model_bytes`` does (one trained by
    ``preprocess.vocab.train_sentencepiece``: BERT's special tokens at ids 0-4, byte fallback), with BERT's
    special-token template."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    proto = _model_proto(model_bytes)
    kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
    # SentencePiece never reads a control, unused or unknown piece from text ("[UNK]" in text is five characters);
    # a score far below any piece's keeps them out of the unigram lattice here too.
    never = min(piece.score for piece in proto.pieces) - 1e6
    vocab = [(piece.piece, never if piece.type in (kinds.CONTROL, kinds.UNUSED, kinds.UNKNOWN) else piece.score)
             for piece in proto.pieces]
    unk_id = next(i for i, piece in enumerate(proto.pieces) if piece.type == kinds.UNKNOWN)
    if proto.trainer_spec.model_type != proto.trainer_spec.UNIGRAM:
        raise ValueError("not a SentencePiece unigram model (unwritable_reason)")
    fast = Tokenizer(models.Unigram(vocab, unk_id=unk_id, byte_fallback=proto.trainer_spec.byte_fallback))
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    fast.normalizer = normalizers.Sequence(steps)
    scheme = "always" if spec.add_dummy_prefix else "never"
    fast.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=True)
    fast.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581",
                                                                                    prepend_scheme=scheme)])
    fast.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    cls, sep = (fast.token_to_id(token) for token in SPECIAL_TOKENS[2:4])
    fast.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast.encode_special_tokens = True
    return fast


def _model_proto(model_bytes: bytes):
    """The SentencePiece model's protocol buffer (its pieces, scores, trainer and normaliser settings)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_bytes)
    return proto


__all__ = ["HF_TOKENIZER_FILE", "sentencepiece_as_fast_tokenizer", "unwritable_reason", "write_tokenizer_files"]
