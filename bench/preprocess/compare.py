"""The preprocessing benchmark's comparison with another tree: how a change measured at scale.

``python -m bench.preprocess.scale --against REF`` runs this tree's pipeline and REF's (a git commit, exported with
``git archive``, or a directory holding ``preprocess/``, ``common/`` and ``configs/``) in alternating pairs, for
each mode, and records the median of the pairs' relative differences in CPU, wall time and peak memory.
"""
from __future__ import annotations

import io
import shutil
import statistics
import tarfile
from pathlib import Path

from bench.preprocess.inputs import describe_inputs
from bench.preprocess.runs import MODES, Setting, run_pipeline
from bench.record import REPO

# What a run of the pipeline imports from a tree (``common/`` holds the contracts it shares with the other stages).
TREE = ("preprocess", "common", "configs")


def reference_tree(ref: str, work: Path) -> tuple[Path, str]:
    """A directory with the pipeline's code and configs: ``ref`` itself, or a git commit's ``TREE`` (those of its
    paths the commit has) exported under work/."""
    if Path(ref).is_dir():
        return Path(ref).resolve(), str(Path(ref).resolve())
    commit = _git("rev-parse", ref).decode().strip()
    paths = [path for path in TREE if path in _git("ls-tree", "--name-only", commit).decode().split()]
    target = work / "trees" / commit[:12]
    if not all((target / path).is_dir() for path in paths):
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(_git("archive", commit, *paths))) as tar:
            tar.extractall(target, filter="data")
    return target, commit


def _git(*args: str) -> bytes:
    from common import processes  # here: a docstore_load child imports this module on an older tree's ``common``
    return processes.run(["git", *args], cwd=REPO, capture_output=True, check=True, timeout=300).stdout


def pair_order(index: int, reference: Path) -> list[tuple[str, Path]]:
    """The runs of pair ``index``: the reference first in even pairs, this tree first in odd ones."""
    runs = [("reference", reference), ("this_tree", REPO)]
    return runs if index % 2 == 0 else runs[::-1]


def compare(setting: Setting, ref: str, pairs: int, say, extra_args: list[str] = ()) -> dict:
    """Paired runs of this tree and of ``ref`` (each with ``extra_args`` too), alternating, each pair in the other
    order than the one before (a run that comes second is not always the same tree's); the median of the pairs'
    differences."""
    tree, described = reference_tree(ref, setting.work)
    out: dict = {"reference": described, "pairs": pairs, "input_bytes": describe_inputs(setting.inputs)["bytes"],
                 "extra_args": list(extra_args)}
    for mode, mode_args in MODES.items():
        args = [*mode_args, *extra_args]
        rows = []
        for i in range(pairs):
            pair = {}
            for name, where in pair_order(i, tree):
                r = run_pipeline(setting, setting.work / "out" / f"compare-{name}", args,
                                 setting.logs / f"compare-{mode}-{name}-{i}.log", tree=where)
                pair[name] = {k: r[k] for k in ("cpu_s", "wall_s", "peak_tree_rss_bytes", "shard_sha256", "contended")}
            rows.append(pair)
            say(f"compare {mode} #{i + 1}: reference {pair['reference']['cpu_s']:.2f} CPU-s "
                f"{pair['reference']['wall_s']:.2f} s, this tree {pair['this_tree']['cpu_s']:.2f} CPU-s "
                f"{pair['this_tree']['wall_s']:.2f} s")
        out[mode] = {
            f"{key}_change": round(statistics.median(p["this_tree"][key] / p["reference"][key] - 1 for p in rows), 4)
            for key in ("cpu_s", "wall_s", "peak_tree_rss_bytes")}
        out[mode]["shards_identical"] = len({tuple(p[n]["shard_sha256"]) for p in rows for n in p}) == 1
        out[mode]["pairs"] = rows
    return out
