"""The GPU step's whole grid in one call: each variant of ``bench.pretrain.gpu`` in its own process with a timeout,
within one time budget, then the best variant of each phase again on the real loader with a short profile.

    python -m bench.pretrain.gpu_grid [--budget 480] [--data128 DIR --data512 DIR] [--results DIR]
    DS_ACCELERATOR=cpu python -m bench.pretrain.gpu_grid --preset tiny --budget 120 --variants eager,regional

A GPU session here is 15 minutes, all tries together: the grid must finish, and what it finished must be kept, even
when a variant hangs or a compile runs long. So every variant runs as a child process in its own session, killed
whole at its timeout (``common.processes``); variants run in the order below (most telling first) while the budget
leaves room for one more timeout; each outcome (figures, or why not) is recorded as soon as it is known. Variants
use in-memory full-length rows (the loader's cost out of the comparison); the final figure of each phase reruns the
best variant on ``--data128``/``--data512`` (the synthetic 100M-row dataset in the real shard format) through the
real loader, with ``--profile-steps``. Writes ``pretrain-gpu-grid-<device>.json``; prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import record
from bench.processes import free_port
from common import processes

# name -> what it changes against the eager padded baseline (bench.pretrain.gpu's options)
VARIANTS = {
    "eager": ["--modes", "padded"],
    "regional": ["--modes", "padded+compile"],
    "padding-free": ["--modes", "padding-free"],
    "whole": ["--modes", "padded+compile-whole"],
    "flash": ["--modes", "padded", "--sdpa", "flash"],
    "efficient": ["--modes", "padded", "--sdpa", "efficient"],
    "cudnn": ["--modes", "padded", "--sdpa", "cudnn"],
    "torch-adamw": ["--modes", "padded", "--torch-adam"],
    "regional+checkpointing": ["--modes", "padded+compile", "--checkpointing"],
    "regional+cudagraphs": ["--modes", "padded+compile+cudagraphs"],
    "padding-free+regional": ["--modes", "padding-free+compile"],
    "torch-autocast": ["--modes", "padded", "--mixed", "torch-autocast"],
    "lamb": ["--modes", "padded", "--optimizer", "lamb"],
}
PHASES = (128, 512)


def run_variant(name: str, seq: int, args, work: Path, timeout: float, *, real_loader: bool = False) -> dict:
    """One variant at one sequence length in a child process: its phase's figures, or why there are none. With
    ``real_loader``, on ``--data<seq>`` through the loader and with a short profile."""
    out = work / f"{name}-seq{seq}{'-final' if real_loader else ''}"
    command = [sys.executable, "-m", "bench.pretrain.gpu", "--preset", args.preset, "--phases", str(seq),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--accumulation", str(args.accumulation),
               "--micro128", str(args.micro128), "--micro512", str(args.micro512), "--results", str(out),
               *VARIANTS[name]]
    data = args.data128 if seq == 128 else args.data512
    if real_loader and data:
        command += [f"--data{seq}", data, "--profile-steps", str(args.profile_steps)]
    env = {**os.environ, "MASTER_PORT": str(free_port())}
    began = time.perf_counter()
    try:
        result = processes.run(command, cwd=record.REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": round(timeout, 1), "wall_s": round(time.perf_counter() - began, 1)}
    wall = round(time.perf_counter() - began, 1)
    if result.returncode != 0:
        output = result.stdout + result.stderr
        errors = [line.split("]:", 1)[-1].strip() for line in output.splitlines() if "Error" in line]
        return {"status": f"failed (exit {result.returncode})" + (f": {errors[-1][:200]}" if errors else ""),
                "wall_s": wall, "output_tail": output[-1500:]}
    found = json.loads(next(out.glob("pretrain-gpu-*.json")).read_text())
    return {"status": "ok", "wall_s": wall, **found["phases"][0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.gpu_grid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=480, help="seconds for the variants and the final runs (the set-up before them not counted)")
    parser.add_argument("--timeout", type=float, default=90, help="seconds one variant at one length may take")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--phases", default=",".join(map(str, PHASES)), help="sequence lengths, of 128 and 512")
    parser.add_argument("--preset", default="large")
    parser.add_argument("--micro128", type=int, default=256)
    parser.add_argument("--micro512", type=int, default=64)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--data128")
    parser.add_argument("--data512")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    chosen = args.variants.split(",")
    if set(chosen) - set(VARIANTS):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    phases = [int(seq) for seq in args.phases.split(",") if seq.strip().isdigit()]
    if not phases or set(phases) - set(PHASES) or len(phases) != len(args.phases.split(",")):
        parser.error(f"--phases: comma-separated, of {', '.join(map(str, PHASES))}")
    set_up = time.perf_counter()
    grid = {"benchmark": "pretrain-gpu-grid", "date": record.utc_now(), "command": record.command_line(),
            "preset": args.preset, "machine": record.machine_info(),
            "versions": record.versions(("torch", "deepspeed"), ("pretrain", "bench")), "runs": []}
    device = "cpu"
    try:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    path = args.results / ("pretrain-gpu-grid-" + "".join(c if c.isalnum() else "-" for c in device.lower()) + ".json")
    # The budget counts from here: the set-up above (torch's import, the versions) is not a variant's time, and
    # counting it made which variants run depend on how loaded the machine was when the grid began.
    started = time.perf_counter()
    grid["setup_s"] = round(started - set_up, 1)
    with tempfile.TemporaryDirectory(prefix="gpu-grid-") as work:
        for name, seq in [(name, seq) for name in chosen for seq in phases]:
            left = args.budget - (time.perf_counter() - started) - len(phases) * args.timeout
            run = {"variant": name, "seq": seq}
            if left < args.timeout:
                run["status"] = "not run: the budget keeps room for the final runs"
            else:
                run.update(run_variant(name, seq, args, Path(work), args.timeout))
            grid["runs"].append(run)
            record.write_json(path, grid)  # what is known so far survives a session that ends here
            print(f"seq {seq} {name}: {run['status']}" + (f", MFU {run['mfu']:.3f}" if run.get("mfu") else ""),
                  flush=True)
        for seq in phases:
            done = [r for r in grid["runs"] if r["seq"] == seq and r.get("status") == "ok"]
            if not done:
                continue
            best = max(done, key=lambda r: r.get("mfu") or r["sequences_per_s"])
            left = args.budget - (time.perf_counter() - started)
            where = "on the real loader" if (args.data128 if seq == 128 else args.data512) else "again (no --data)"
            run = {"variant": f"final: {best['variant']} {where}", "seq": seq}
            run.update(run_variant(best["variant"], seq, args, Path(work), min(args.timeout, max(left, 1)),
                                   real_loader=True))
            grid["runs"].append(run)
            record.write_json(path, grid)
    grid["wall_s"] = round(time.perf_counter() - set_up, 1)
    record.write_json(path, grid)
    print(f"\n{'variant':<40} {'seq':>4} {'seq/s':>9} {'MFU':>6} {'compile s':>9} {'GiB':>6}  status")
    for run in grid["runs"]:
        mfu = f"{run['mfu']:.3f}" if run.get("mfu") else "-"
        figures = (f"{run['sequences_per_s']:>9,.1f} {mfu:>6} "
                   f"{run['compile_s'] if run.get('compile_s') is not None else '-':>9} "
                   f"{run['max_memory_gib'] or 0:>6.1f}") if run.get("status") == "ok" else f"{'':>33}"
        print(f"{run['variant']:<40} {run['seq']:>4} {figures}  {run['status']}")
    print(f"wrote {record.shown(path)} in {grid['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
