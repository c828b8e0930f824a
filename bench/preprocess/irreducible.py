"""The irreducible work of preprocessing, done standalone: read + clean + split + tokenize, nothing else.

    python -m bench.preprocess.irreducible --config CONFIG --tokenizer DIR [--wiki DUMP...] [--books BOOK...]

Decompresses and parses the dumps, reads the books and the config's ``inputs:`` sources (JSON lines, ...), cleans
the wikitext, splits sentences and tokenizes, with
the pipeline's own functions (the readers of ``preprocess.readers``, ``text.to_document``,
``encode_batch``) and nothing more: no Apache Beam, no instances, no output. It imports only what that work
needs, so the CPU of this whole process (interpreter, imports, tokenizer load, work) is what a standalone
program doing the work costs; ``bench.preprocess.scale`` runs it as a child and compares the pipeline's whole
process tree with it. Prints one JSON line: counts and the CPU of the work itself, by phase.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time


def measure(wiki: list[str], books_: list[str], tokenizer: str, config_path: str) -> dict:
    """Read + clean + split + tokenize every file in this process, timed per phase (``time.process_time``)."""
    from common import preprocess_config as config
    from common.tokenizer import keep_batches_on_this_thread, load_tokenizer
    from preprocess import readers, text
    from preprocess.records import Rejected

    full = config.load(config_path)
    cfg, inputs = full.sources, tuple(full.inputs)
    keep_batches_on_this_thread()  # as the pipeline's workers encode
    tok = load_tokenizer(tokenizer)
    clock = time.process_time
    read_s = clean_s = tok_s = 0.0
    documents = sentences = tokens = rejected = 0
    files = readers.input_files({"wikipedia": wiki, "books": books_}, inputs)
    gc.collect()
    wall0, cpu0 = time.perf_counter(), clock()
    for key, uri in files:
        spec = readers.spec_of(key, inputs)
        limits = readers.source_config(spec, cfg)
        reader = readers.reader_of(key).read(uri, None, spec, limits, {})
        while True:
            t0 = clock()
            raw = next(reader, None)
            t1 = clock()
            read_s += t1 - t0
            if raw is None:
                break
            if isinstance(raw, Rejected):
                rejected += 1
                continue
            doc = text.to_document(raw, limits)
            t2 = clock()
            clean_s += t2 - t1
            if isinstance(doc, Rejected):
                rejected += 1
                continue
            # As the pipeline's CleanAndTokenize: empty encodings dropped, short documents skipped.
            encoded = [ids for ids in tok.encode_batch(list(doc.sentences)) if ids]
            tok_s += clock() - t2
            if len(encoded) < limits.min_document_sentences:
                rejected += 1
                continue
            documents += 1
            sentences += len(encoded)
            tokens += sum(len(ids) for ids in encoded)
    cpu, wall = clock() - cpu0, time.perf_counter() - wall0
    return {"work_cpu_s": round(cpu, 3), "work_wall_s": round(wall, 3), "read_cpu_s": round(read_s, 3),
            "clean_split_cpu_s": round(clean_s, 3), "tokenize_cpu_s": round(tok_s, 3),
            "documents": documents, "sentences": sentences, "corpus_tokens": tokens, "rejected": rejected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.irreducible", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--wiki", nargs="*", default=[])
    parser.add_argument("--books", nargs="*", default=[])
    args = parser.parse_args(argv)
    result = measure(args.wiki, args.books, args.tokenizer, args.config)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
