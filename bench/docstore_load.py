"""Loading document-store buckets, as the instance stage does, against another version of ``preprocess/docstore.py``.

    python -m bench.docstore_load --against REF [--buckets 256] [--parts 1 2] [--rounds 5]

The store is synthetic in the real format (``docstore.documents_table`` files, one per part and bucket): the
benchmark corpus's shape, about 12 documents of some 5,000 tokens in about 15 sentences per bucket. Every bucket is
loaded once per round with this tree's ``load_bucket`` and with REF's (a git commit), alternating; measured are
the CPU time (``time.process_time``) and minor page faults of each pass, medians over the rounds. With several
parts a bucket merges several files, as after a run on several workers. Adds ``docstore_load`` to
``comparisons`` in ``bench/results/preprocess-<machine>.json``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import record
from common.hashing import document_hash
from preprocess import docstore


def write_store(work: str, buckets: int, parts: int, seed: int = 0) -> int:
    """A store of about 12 documents per bucket, each document in one of ``parts`` files; returns their count."""
    rng = np.random.default_rng(seed)
    bits = (buckets - 1).bit_length()
    by_file: dict[tuple[int, int], list] = {}
    for count in range(buckets * 12):
        doc_id = f"wiki:synthetic:{count}"
        lengths = rng.integers(50, 650, size=int(rng.integers(5, 25))).astype(np.uint32)
        tokens = rng.integers(5, 8000, size=int(lengths.sum())).astype(np.uint16)
        doc_hash = document_hash(doc_id)
        key = (docstore.bucket_of(doc_hash, bits), count % parts)
        by_file.setdefault(key, []).append((doc_hash, doc_id, "synthetic.xml", tokens.tobytes(), lengths.tobytes()))
    for (bucket, part), docs in by_file.items():
        docstore.write_table(f"{work}/docs/b{bucket:06d}/p{part:04d}.arrow", docstore.documents_table(docs, 8000))
    return buckets * 12


def module_at(ref: str, scratch: Path):
    """``preprocess/docstore.py`` as of git commit ``ref``, imported under another name."""
    source = subprocess.run(["git", "show", f"{ref}:preprocess/docstore.py"], cwd=record.REPO, check=True,
                            capture_output=True, text=True).stdout
    path = scratch / "docstore_reference.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("docstore_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def one_pass(module, work: str, buckets: int) -> tuple[float, int]:
    """(CPU seconds, minor page faults) of loading every bucket once and reading every document's tokens."""
    cpu, faults = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for bucket in range(buckets):
        loaded = module.load_bucket(work, bucket)
        for rank in range(len(loaded)):
            loaded.document(rank)
        int(loaded.tokens.sum())
    return time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docstore_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="git commit of the reference docstore.py")
    parser.add_argument("--buckets", type=int, default=256)
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    out = {"reference": args.against, "buckets": args.buckets, "rounds": args.rounds, "date": record.utc_now(),
           "command": record.command_line(), "versions": record.versions(record.DISTRIBUTIONS["preprocess"],
                                                                         ("preprocess",))}
    with tempfile.TemporaryDirectory() as scratch:
        reference = module_at(args.against, Path(scratch))
        for parts in args.parts:
            work = f"{scratch}/store{parts}"
            documents = write_store(work, args.buckets, parts)
            passes = {"reference": [], "this_tree": []}
            for _ in range(args.rounds):
                for name, module in (("reference", reference), ("this_tree", docstore)):
                    passes[name].append(one_pass(module, work, args.buckets))
            medians = {name: {"cpu_s": round(statistics.median(c for c, _ in runs), 4),
                              "minor_faults": int(statistics.median(f for _, f in runs))}
                       for name, runs in passes.items()}
            change = medians["this_tree"]["cpu_s"] / medians["reference"]["cpu_s"] - 1
            out[f"parts_{parts}"] = {"documents": documents, **medians, "cpu_s_change": round(change, 3)}
            print(f"{parts} part(s), {documents} documents in {args.buckets} buckets: reference "
                  f"{medians['reference']['cpu_s']:.3f} CPU-s, this tree {medians['this_tree']['cpu_s']:.3f} CPU-s "
                  f"({change:+.1%}); minor faults {medians['reference']['minor_faults']} -> "
                  f"{medians['this_tree']['minor_faults']}", flush=True)
    machine = record.machine_info()
    out_file = record.results_file(args.results, "preprocess", machine)
    results = json.loads(out_file.read_text()) if out_file.exists() else {}
    results.setdefault("comparisons", {})["docstore_load"] = out
    record.write_json(out_file, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
