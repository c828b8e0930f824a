"""bench.pretrain_gpu, the script a scarce GPU session runs, smoke-run on CPU with the tiny preset: it must not be
the GPU's minutes that find it broken."""
import json
import os
import sys

from bench.processes import free_port
from common import processes
from tests.pretrain.launching import REPO


def test_the_gpu_benchmark_runs_both_phases_and_records_every_figure(tmp_path):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "bench.pretrain_gpu", "--preset", "tiny", "--micro128", "2", "--micro512", "1",
               "--accumulation", "2", "--steps", "1", "--warmup", "1", "--modes", "padded,padding-free",
               "--results", str(tmp_path)]
    result = processes.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = json.loads(next(tmp_path.glob("pretrain-gpu-*.json")).read_text())
    phases = {(p["seq"], p["mode"]): p for p in found["phases"]}
    assert set(phases) == {(seq, mode) for seq in (128, 512) for mode in ("padded", "padding-free")}
    for (seq, _), phase in phases.items():
        assert phase["accumulation"] == 2 and phase["micro_batch"] == (2 if seq == 128 else 1)
        assert phase["sequences_per_s"] > 0 and phase["tokens_per_s"] > 0 and phase["step_s"] > 0
