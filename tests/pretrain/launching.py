"""Start ``pretrain/run.py`` the ways users do (deepspeed, torchrun, mpiexec, srun, plain python) on CPU."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys

from common import processes

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN = str(REPO / "pretrain" / "run.py")
TINY = str(REPO / "configs" / "pretrain" / "tiny.yaml")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env


def command(launcher: str, nprocs: int, args: list[str], port: int) -> list[str]:
    script = [RUN, "--config", TINY, *args]
    if launcher == "python":
        return [sys.executable, *script]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nprocs),
                "--master_addr", "127.0.0.1", "--master_port", str(port), *script]
    if launcher == "deepspeed":
        return ["deepspeed", "--num_gpus", str(nprocs), "--master_port", str(port), *script]
    if launcher == "mpiexec":
        return ["mpiexec", "-n", str(nprocs), sys.executable, *script]
    raise ValueError(launcher)


def launch(launcher: str, nprocs: int, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run to completion; ``srun`` is imitated by starting the tasks with the variables Slurm sets."""
    port = free_port()
    if launcher == "srun":
        with contextlib.ExitStack() as running:  # each task's session is killed on leaving, a late one's too
            procs = [running.enter_context(processes.started(
                [sys.executable, RUN, "--config", TINY, *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=environment(SLURM_PROCID=str(r), SLURM_NTASKS=str(nprocs),
                                                          SLURM_LOCALID=str(r), SLURM_STEP_ID="0",
                                                          SLURM_JOB_ID=str(port), SLURM_STEP_NODELIST="localhost",
                                                          MASTER_PORT=str(port))))
                     for r in range(nprocs)]
            outputs = [p.communicate(timeout=timeout)[0] for p in procs]
        return subprocess.CompletedProcess(procs[0].args, max(p.returncode for p in procs), "\n".join(outputs), "")
    return processes.run(command(launcher, nprocs, args, port), cwd=REPO, text=True, timeout=timeout,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment(MASTER_PORT=str(port)))


def losses(run_dir: pathlib.Path) -> dict[int, float]:
    """The loss of every logged step (the last record of a step wins, as after a resume); evaluation records, which
    hold ``eval/`` figures, are not training steps."""
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}


def settings(dataset, out, *, steps: int, **more) -> list[str]:
    values = {"data.path": dataset, "output_dir": out, "train.max_steps": steps, "schedule.total_steps": steps,
              "schedule.warmup_steps": 1, "logging.log_every": 1, "logging.tensorboard": "false",
              "checkpoint.export_hf": "false", **more}
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
