"""Grow a checkpoint's WordPiece vocabulary with a domain's words before continuing its pretraining.

    python -m pretrain.grow_vocab --model DIR --output OUT --words words.txt
    python -m pretrain.grow_vocab --model DIR --output OUT --corpus docs/ --top 500 [--min-pieces 3] [--min-count 5]

DIR is a Hugging Face directory (config.json, model.safetensors, and a vocab.txt, tokenizer.json or tokenizer/).
New words take BERT's [unusedN] slots first, then ids after the last; every other id keeps its token; each new
word's embedding row (and MLM decoder row and bias) starts as the mean of its old pieces' (``models.vocab_growth``).
OUT is a Hugging Face directory that transformers loads, written whole or not at all, with ``vocab_growth.json``
naming each added word, its id, its old pieces and, from a corpus, its count. Preprocess the domain with OUT's
tokenizer and continue from OUT (``model.init_from``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from common.errors import CheckpointError, InputError, report, storage_failure


def corpus_lines(paths: list[Path]):
    """The lines of the text files under ``paths`` (files or directories, read as UTF-8 with bad bytes replaced)."""
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            with open(file, encoding="utf-8", errors="replace") as handle:
                yield from handle


def grow(model: Path, output: Path, words: list[str] | None, corpus: list[Path], top: int, min_pieces: int,
         min_count: int) -> dict:
    """Grow ``model``'s vocabulary into ``output``; the record written as ``vocab_growth.json``."""
    from models import hf_io, vocab_growth

    tokenizer = hf_io.find_tokenizer(model)
    if tokenizer is None:
        raise CheckpointError(f"{model}: no tokenizer (none of vocab.txt, tokenizer.json, tokenizer/)")
    counts = {}
    if words is None:
        found = vocab_growth.frequent_split_words(tokenizer, corpus_lines(corpus), top, min_pieces, min_count)
        words, counts = [w for w, _, _ in found], {w: c for w, c, _ in found}
    growth = vocab_growth.plan_growth(tokenizer, words)
    try:
        grown_tokenizer = tokenizer.with_tokens(list(growth.tokens))
    except NotImplementedError as error:
        raise InputError(f"{model}: {error}; only WordPiece vocabularies grow") from None
    config = hf_io.read_json_object(model / "config.json")
    state = vocab_growth.grow_weights(hf_io.load_weights(model), growth)
    config["vocab_size"] = growth.new_size
    with tempfile.TemporaryDirectory() as scratch:
        grown_tokenizer.save(scratch)
        hf_io.write_export(output, config, state, scratch, max_length=int(config.get("max_position_embeddings", 512)),
                           tokenizer_class="ElectraTokenizer" if config.get("model_type") == "electra"
                           else "BertTokenizer", note=f"{model} is untouched")
    record = {"model": str(model), "summary": growth.describe(), "old_size": growth.old_size,
              "new_size": growth.new_size, "skipped": list(growth.skipped),
              "words": [{"word": w, "id": i, "old_pieces": [tokenizer.id_to_token(p) for p in pieces],
                         **({"count": counts[w]} if w in counts else {})}
                        for w, i, pieces in zip(growth.words, growth.ids, growth.pieces)]}
    temporary = output / "vocab_growth.json.tmp"
    temporary.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    os.replace(temporary, output / "vocab_growth.json")
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a Hugging Face directory")
    parser.add_argument("--output", type=Path, required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--words", type=Path, help="a file of words, one per line")
    source.add_argument("--corpus", type=Path, nargs="+", help="text files or directories of the domain")
    parser.add_argument("--top", type=int, default=500, help="with --corpus: how many words (default 500)")
    parser.add_argument("--min-pieces", type=int, default=3, help="with --corpus: words cut into this many pieces")
    parser.add_argument("--min-count", type=int, default=5, help="with --corpus: words seen this often")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error too")
    args = parser.parse_args(argv)
    try:
        words = None
        if args.words is not None:
            words = [line.strip() for line in args.words.read_text(encoding="utf-8").splitlines() if line.strip()]
        record = grow(args.model, args.output, words, args.corpus or [], args.top, args.min_pieces, args.min_count)
    except Exception as error:  # noqa: BLE001 - an expected error becomes one line, anything else a traceback
        failure = storage_failure(error, path=args.output)
        if failure is None and not isinstance(error, (CheckpointError, InputError, FileNotFoundError)):
            raise
        report(str(failure or error), error, debug=args.debug)
        return 2
    print(f"{record['summary']}; wrote {args.output} (the words in {args.output / 'vocab_growth.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
