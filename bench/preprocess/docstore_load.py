"""Loading document-store buckets, as the instance stage does, against another version of ``preprocess/docstore.py``.

    python -m bench.preprocess.docstore_load --against REF [--buckets 256] [--parts 1 2] [--rounds 9]

The store is synthetic in the real format (``docstore.documents_table`` files, one per part and bucket): the
benchmark corpus's shape, about 12 documents of some 5,000 tokens in about 15 sentences per bucket. Every bucket is
loaded once per round with this tree's ``load_bucket`` and with REF's (a git commit, exported as
``bench.preprocess.compare`` exports it), alternating, each pass in a child process on its tree's modules; measured
are the CPU time (``time.process_time``) and minor page faults of each pass, medians over the rounds. With several
parts a bucket merges several files, as after a run on several workers. Adds ``docstore_load`` to
``comparisons`` in ``bench/results/preprocess-<machine>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import record
from bench.preprocess.compare import reference_tree
from bench.processes import child_env
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


def one_pass(work: str, buckets: int) -> dict:
    """CPU seconds and minor page faults of loading every bucket once with this process's ``preprocess.docstore``
    and reading every document's tokens; and which docstore.py that was."""
    cpu, faults = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for bucket in range(buckets):
        loaded = docstore.load_bucket(work, bucket)
        for rank in range(len(loaded)):
            loaded.document(rank)
        int(loaded.tokens.sum())
    return {"cpu_s": time.process_time() - cpu,
            "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, "module": docstore.__file__}


def pass_in(tree: Path, work: str, buckets: int) -> dict:
    """``one_pass`` in a child whose ``preprocess`` and ``common`` are ``tree``'s (this checkout's ``bench``)."""
    from common import processes  # here: the child imports this module on ``tree``'s (maybe older) ``common``

    env = child_env(tree)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(record.REPO)])
    out = processes.run([sys.executable, "-m", "bench.preprocess.docstore_load", "--one-pass", work, str(buckets)], cwd=tree,
                        env=env, check=True, capture_output=True, text=True, timeout=1800).stdout
    result = json.loads(out)
    if not Path(result["module"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the pass for {tree} loaded {result['module']}, not that tree's docstore.py")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.docstore_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", help="git commit of the reference docstore.py")
    parser.add_argument("--buckets", type=int, default=256)
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    parser.add_argument("--one-pass", nargs=2, metavar=("STORE", "BUCKETS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_pass:   # a child of pass_in
        print(json.dumps(one_pass(args.one_pass[0], int(args.one_pass[1]))))
        return 0
    if not args.against:
        parser.error("--against REF is required")
    out = {"reference": args.against, "buckets": args.buckets, "rounds": args.rounds, "date": record.utc_now(),
           "command": record.command_line(), "versions": record.versions(record.DISTRIBUTIONS["preprocess"],
                                                                         ("preprocess",))}
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"reference": reference_tree(args.against, Path(scratch))[0], "this_tree": record.REPO}
        for parts in args.parts:
            work = f"{scratch}/store{parts}"
            documents = write_store(work, args.buckets, parts)
            passes = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    passes[name].append(pass_in(tree, work, args.buckets))
            medians = {name: {"cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 4),
                              "minor_faults": int(statistics.median(r["minor_faults"] for r in runs))}
                       for name, runs in passes.items()}
            change = medians["this_tree"]["cpu_s"] / medians["reference"]["cpu_s"] - 1
            out[f"parts_{parts}"] = {"documents": documents, **medians, "cpu_s_change": round(change, 3)}
            print(f"{parts} part(s), {documents} documents in {args.buckets} buckets: reference "
                  f"{medians['reference']['cpu_s']:.3f} CPU-s, this tree {medians['this_tree']['cpu_s']:.3f} CPU-s "
                  f"({change:+.1%}); minor faults {medians['reference']['minor_faults']} -> "
                  f"{medians['this_tree']['minor_faults']}", flush=True)
    record.add_comparison(args.results, "preprocess", "docstore_load", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
