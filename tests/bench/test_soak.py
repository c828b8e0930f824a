"""bench.soak's measuring parts: growth is told from a plateau, a tree's files and memory are seen, a log's tail read."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import soak
from common import processes


def _samples(values: list[float]) -> list[dict]:
    return [{"t": float(i), "rss_bytes": v} for i, v in enumerate(values)]


def test_a_steady_leak_is_told_from_a_sawtooth_that_keeps_its_height():
    leak = soak.growth(_samples([100 + i for i in range(100)]), "rss_bytes")
    assert leak["last_half_max"] > leak["first_half_max"] and leak["slope_per_1000"] == pytest.approx(1000)
    # checkpoints written and pruned (keep_last): disk goes up and down to the same height all run long
    saw = soak.growth(_samples([100 + 10 * (i % 5) for i in range(100)]), "rss_bytes")
    assert saw["last_half_max"] == saw["first_half_max"] and abs(saw["slope_per_1000"]) < 50


def test_growth_is_judged_per_unit_of_progress_and_after_the_warm_up():
    samples = _samples([1000] * 10 + [10] * 90)  # a large start-up, then flat: the warm-up is left out
    flat = soak.growth(samples, "rss_bytes", progress=[2 * i for i in range(100)])
    assert flat["first_half_max"] == flat["last_half_max"] == 10 and flat["samples"] == 80
    with pytest.raises(ValueError, match="too short"):
        soak.growth(_samples([1, 2, 3]), "rss_bytes")


def test_the_sampler_sees_the_whole_trees_memory_and_the_output_directory(tmp_path):
    out = tmp_path / "out"
    child = ("import os, sys, time, subprocess\n"
             f"os.makedirs({str(out)!r})\n"
             "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
             "held = []\n"
             "for i in range(12):\n"
             f"    open(os.path.join({str(out)!r}, f'f{{i}}'), 'wb').write(b'x' * 1000)\n"
             "    held.append(bytearray(8 << 20)); time.sleep(0.05)\n"
             "time.sleep(0.5)\n")
    with processes.started([sys.executable, "-c", child], stdout=subprocess.DEVNULL) as proc:
        sampler = soak.Sampler(proc.pid, out, progress=lambda: 7, interval=0.05)
        sampler.start()
        proc.wait(timeout=60)
        sampler.join(timeout=10)
    last = max(sampler.samples, key=lambda s: s["disk_files"])
    assert last["disk_files"] == 12 and last["disk_bytes"] == 12_000 and last["progress"] == 7
    assert max(s["processes"] for s in sampler.samples) == 2  # the child's own child is counted
    rss = [s["rss_bytes"] for s in sampler.samples]
    assert max(rss) - rss[0] > 64 << 20  # the 96 MiB it took on the way were seen


def test_the_last_step_is_read_from_the_tail_of_a_growing_log(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert soak.last_step(metrics) == 0  # before the run writes any
    lines = [json.dumps({"step": step, "loss": 1.0, "pad": "x" * 100}) for step in range(1, 200)]
    metrics.write_text("\n".join(lines) + "\n" + '{"step": 200, "lo')  # a record being written
    assert soak.last_step(metrics) == 199
