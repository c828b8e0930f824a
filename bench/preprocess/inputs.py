"""The preprocessing benchmark's input: the shared data, copies of it with distinct document ids, and a tokenizer.

The shared data is small enough that the interpreter's start-up and imports would be a large share of a run, so
``bench.preprocess.scale`` measures on several copies of it. A copy must hold new documents, not duplicates the pipeline
could recognise: books are copied under new file names, dumps are recompressed with a new ``<dbname>`` (a
document's id includes both).
"""
from __future__ import annotations

import bz2
import glob
import json
import os
import shutil
import sys
from pathlib import Path

from bench.processes import run_measured

VOCAB_SIZE = 8000   # the benchmark's own SentencePiece tokenizer, trained on its input
WIKI_DBNAME = b"<dbname>enwiki</dbname>"


def real_inputs(data: Path) -> dict:
    """The dumps (``wikipedia/*.bz2``) and books (``books/*.txt``) under ``data``; exits naming --data without them."""
    wiki = sorted(glob.glob(str(data / "wikipedia" / "*.bz2")))
    books = sorted(glob.glob(str(data / "books" / "*.txt")))
    if not wiki or not books:
        sys.exit(f"no real data under {data} (expected wikipedia/*.bz2 and books/*.txt); pass --data")
    return {"wiki": wiki, "books": books}


def describe_inputs(inputs: dict) -> dict:
    """Each input file's kind, name and size, and their totals (the results' ``input``)."""
    files = [{"kind": kind, "name": os.path.basename(f), "bytes": os.path.getsize(f)}
             for kind, key in (("wiki", "wiki"), ("book", "books")) for f in inputs[key]]
    return {"files": files, "file_count": len(files), "bytes": sum(f["bytes"] for f in files)}


def sized_files(inputs: dict, keys: tuple[str, ...] = ("wiki", "books")) -> list[tuple[str, str, int]]:
    """(kind, uri, size in bytes as stored) of the files of ``inputs`` under ``keys``, as ``preprocess.executors.part_budget``
    takes them."""
    return [("wiki" if key == "wiki" else "book", uri, os.path.getsize(uri)) for key in keys for uri in inputs[key]]


def make_copies(inputs: dict, work: Path, copies: int) -> dict:
    """``copies`` copies of the inputs whose document ids differ (copy 1 is the originals), made once under
    ``work/input-copies``: books under new file names, dumps with a new <dbname>, recompressed."""
    root = work / "input-copies"
    out = {"wiki": list(inputs["wiki"]), "books": list(inputs["books"])}
    for copy in range(2, copies + 1):
        for path in inputs["books"]:
            stem, ext = os.path.splitext(os.path.basename(path))
            out["books"].append(str(_copy_book(Path(path), root / "books" / f"{stem}.copy{copy}{ext}")))
        for path in inputs["wiki"]:
            stem = os.path.basename(path)[:-len(".bz2")]
            out["wiki"].append(str(_copy_dump(Path(path), root / "wikipedia" / f"{stem}.copy{copy}.bz2", copy)))
    return out


def _copy_book(source: Path, target: Path) -> Path:
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return target


def _copy_dump(source: Path, target: Path, copy: int) -> Path:
    """The dump recompressed with ``<dbname>enwiki_copyN</dbname>``, written whole (renamed into place) or not at
    all."""
    if target.exists():
        return target
    with bz2.open(source, "rb") as handle:
        data = handle.read()
    if data.count(WIKI_DBNAME) != 1:
        sys.exit(f"{source}: expected one {WIKI_DBNAME.decode()}, found {data.count(WIKI_DBNAME)}; "
                 "pass --data with unaltered dumps")
    data = data.replace(WIKI_DBNAME, WIKI_DBNAME.replace(b"enwiki", f"enwiki_copy{copy}".encode()))
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    temporary.write_bytes(bz2.compress(data, 9))
    temporary.rename(target)
    return target


def prepare_tokenizer(inputs: dict, work: Path) -> tuple[Path, dict]:
    """A lowercase SentencePiece tokenizer of ``VOCAB_SIZE`` trained on ``inputs`` by ``python -m preprocess
    tokenizer train`` under ``work/tokenizer``; reused while the inputs' names and sizes are the same."""
    target = work / "tokenizer"
    stamp = {"vocab_size": VOCAB_SIZE, "lowercase": True,
             "inputs": [[os.path.basename(f), os.path.getsize(f)] for f in inputs["wiki"] + inputs["books"]]}
    stamp_file = work / "tokenizer.stamp.json"
    if (target / "tokenizer.json").exists() and stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return target, {"reused": True}
    shutil.rmtree(target, ignore_errors=True)
    cmd = [sys.executable, "-m", "preprocess", "tokenizer", "train", "--wikipedia", *inputs["wiki"],
           "--books", *inputs["books"], "--vocab-size", str(VOCAB_SIZE), "--lowercase", "--output", str(target)]
    result = run_measured(cmd, work / "logs" / "tokenizer-train.log")
    stamp_file.write_text(json.dumps(stamp))
    return target, {"reused": False, "wall_s": result["wall_s"], "cpu_s": result["cpu_s"]}
