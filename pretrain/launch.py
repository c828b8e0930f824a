"""Rank discovery for every way the job can be started, as pure functions of the environment.

* ``deepspeed`` and ``torchrun`` export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
* ``srun`` exports SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the node list; the master is the
  first node of the step (or job) and the port is derived from the job id unless MASTER_PORT is set.
* ``mpirun``/``mpiexec`` (Open MPI, MPICH, Intel MPI): ranks from mpi4py; rank 0's host name is
  broadcast as the master address.
* Nothing at all: a single process on this machine.

The result is written back as the RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* variables torch.distributed
reads, so the rest of the program has one way to look at it.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str

    def export(self, environ: dict | None = None) -> None:
        environ = os.environ if environ is None else environ
        environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
                       MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed node list: ``gpu[01-03,07],login1`` -> gpu01 gpu02 gpu03 gpu07 login1."""
    hosts, depth, token = [], 0, ""
    for char in hostlist + ",":
        if char == "," and depth == 0:
            if token:
                hosts.extend(_expand_one(token))
            token = ""
            continue
        depth += (char == "[") - (char == "]")
        token += char
    return hosts


def _expand_one(token: str) -> list[str]:
    match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", token)
    if not match:
        return [token]
    prefix, ranges, suffix = match.groups()
    names = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            names.extend(f"{prefix}{number:0{width}d}{rest}" for rest in _expand_one(suffix))
    return names


def from_environment(environ: dict | None = None, mpi_comm=None) -> Rendezvous:
    """Discover this process's place in the job; ``mpi_comm`` is used (and only needed) under mpirun."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "deepspeed" if "DEEPSPEED_LAUNCHER" in env or "CROSS_RANK" in env else "torchrun"
        return Rendezvous(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                          env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", DEFAULT_PORT)), launcher)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1")
        job = int(env.get("SLURM_JOB_ID", "0") or 0)
        port = int(env.get("MASTER_PORT") or 20000 + job % 20000)
        return Rendezvous(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                          env.get("MASTER_ADDR") or nodes[0], port, "srun")
    if any(key in env for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")):
        if mpi_comm is None:
            from mpi4py import MPI

            mpi_comm = MPI.COMM_WORLD
        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        local_rank = _mpi_local_rank(env, mpi_comm)
        master = mpi_comm.bcast(env.get("MASTER_ADDR") or _own_address() if rank == 0 else None, root=0)
        return Rendezvous(rank, size, local_rank, master, int(env.get("MASTER_PORT", DEFAULT_PORT)), "mpi")
    return Rendezvous(0, 1, 0, env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT") or _free_port()),
                      "single")


def _mpi_local_rank(env, comm) -> int:
    for key in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"):
        if key in env:
            return int(env[key])
    from mpi4py import MPI

    return comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()


def _own_address() -> str:
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
