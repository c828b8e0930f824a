"""bench.pretrain.gpu, the script a scarce GPU session runs, smoke-run on CPU with the tiny preset: it must not be
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
    command = [sys.executable, "-m", "bench.pretrain.gpu", "--preset", "tiny", "--micro128", "2", "--micro512", "1",
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


def test_the_mixed_precision_paths_and_lamb_run_and_are_recorded(tmp_path):
    """DeepSpeed's torch_autocast mode (fp32 weights, bf16 autocast forward) and our foreach LAMB at ZeRO 0: the
    GPU grid's item-5 variants, which a GPU session compares against DeepSpeed's bf16 optimizer."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    found = {}
    for name, options in (("autocast", ["--mixed", "torch-autocast"]), ("lamb", ["--optimizer", "lamb"])):
        command = [sys.executable, "-m", "bench.pretrain.gpu", "--preset", "tiny", "--micro128", "2", "--accumulation",
                   "2", "--steps", "1", "--warmup", "1", "--phases", "128", "--modes", "padded", *options,
                   "--results", str(tmp_path / name)]
        result = processes.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        (found[name],) = json.loads(next((tmp_path / name).glob("pretrain-gpu-*.json")).read_text())["phases"]
        assert found[name]["sequences_per_s"] > 0
    assert (found["autocast"]["mixed_precision"], found["autocast"]["precision"]) == ("torch-autocast", "bf16")
    assert (found["lamb"]["optimizer"], found["lamb"]["precision"]) == ("LAMB (foreach)", "fp32")  # fp16 on a GPU


def _grid(tmp_path, *options: str) -> dict:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "bench.pretrain.gpu_grid", "--preset", "tiny", "--micro128", "2", "--micro512",
               "1", "--accumulation", "2", "--steps", "1", "--warmup", "1", "--results", str(tmp_path), *options]
    result = processes.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(next(tmp_path.glob("pretrain-gpu-grid-*.json")).read_text())


def test_the_grid_runs_each_variant_apart_then_the_best_again_and_records_each_outcome(tmp_path):
    """Flash attention takes no padding mask (nor does it on a GPU): its failure is recorded with its reason and the
    grid goes on. One phase (--phases 128) keeps it to three runs; both phases' figures are the first test's."""
    grid = _grid(tmp_path, "--variants", "eager,flash", "--phases", "128", "--budget", "900", "--timeout", "150")
    runs = {(run["variant"], run["seq"]): run for run in grid["runs"]}
    assert {key for key in runs if not key[0].startswith("final")} == {("eager", 128), ("flash", 128)}
    assert runs[("eager", 128)]["status"] == "ok" and runs[("eager", 128)]["sequences_per_s"] > 0
    assert runs[("flash", 128)]["status"].startswith("failed (exit 1): RuntimeError: No available kernel")
    finals = [run for (variant, _), run in runs.items() if variant.startswith("final: eager")]
    assert [run["seq"] for run in finals] == [128] and finals[0]["status"] == "ok"


def test_the_grid_refuses_a_phase_it_does_not_know(tmp_path):
    result = processes.run([sys.executable, "-m", "bench.pretrain.gpu_grid", "--phases", "128,256", "--results",
                            str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--phases: comma-separated, of 128, 512" in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_variant_past_its_timeout_is_recorded_and_the_grid_goes_on_within_its_budget(tmp_path):
    # Budget 7.5 s with 1-s timeouts and room kept for two final runs: the first variant always starts (the budget
    # counts from after set-up, however loaded the machine), and after five runs of at least 1 s each under 1 s is
    # left, so the sixth is never run.
    grid = _grid(tmp_path, "--variants", "eager,regional,padding-free", "--budget", "7.5", "--timeout", "1")
    statuses = [(run["variant"], run["seq"], run["status"]) for run in grid["runs"]]
    assert statuses[0] == ("eager", 128, "timeout")  # killed with its whole session, recorded, and on to the next
    assert any(status.startswith("not run: the budget") for *_, status in statuses), statuses
    assert grid["wall_s"] < 60
