"""Local servers the tests start on 127.0.0.1: an S3-compatible store (moto) and a Dask cluster."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from common import processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(check, what: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up within {timeout} s")


def _start(argv: list[str], **popen_arguments) -> subprocess.Popen:
    """A server in a session of its own, so that ``_stop`` reaches all it started (a Dask nanny's worker)."""
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            **popen_arguments)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server shuts down in order), then SIGKILL to whatever is left of its session."""
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=15)
    processes.stop(proc)


@contextlib.contextmanager
def moto_s3_server():
    """Yield the environment variables that point boto3 and smart_open at a local moto server."""
    port = free_port()
    proc = _start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)])
    try:
        endpoint = f"http://127.0.0.1:{port}"
        _wait_for(lambda: urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).status == 200, "moto server")
        yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_SESSION_TOKEN": "testing"}
    finally:
        _stop(proc)


@contextlib.contextmanager
def dask_cluster(workers: int, cwd: str, env: dict):
    """A Dask scheduler and ``workers`` single-threaded worker processes, as separate programs."""
    port, dashboard = free_port(), free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = _start(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                        "--dashboard-address", f"127.0.0.1:{dashboard}"], cwd=cwd, env=env)
    worker_procs = []
    try:
        _wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None, "dask scheduler")
        for _ in range(workers):
            worker_procs.append(_start(
                ["dask", "worker", address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"],
                cwd=cwd, env=env))
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(workers, timeout=60)
        yield address
    finally:
        for proc in worker_procs:
            _stop(proc)
        _stop(scheduler)


def env_with_repo(repo_root: str) -> dict:
    return {**os.environ, "PYTHONPATH": repo_root}


def dask_pids(client) -> dict[str, int]:
    """Each Dask worker's address and process id (the worker, not its nanny: killing it is a worker dying)."""
    return client.run(os.getpid)


def kill_busy_dask_worker(client, spare: set[int], done, timeout: float = 300) -> int | None:
    """SIGKILL the first worker seen running a task (the scheduler lists a task in progress on it) whose pid is
    not in ``spare``; returns its pid, or None once ``done()`` is true (the run ended first)."""
    deadline = time.time() + timeout
    while not done():
        if time.time() > deadline:
            raise RuntimeError(f"no Dask worker ran a task within {timeout} s")
        with contextlib.suppress(Exception):  # a worker that is coming up or going away answers nothing
            busy = {worker for worker, tasks in client.processing().items() if tasks}
            for worker, pid in dask_pids(client).items():
                if worker in busy and pid not in spare:
                    os.kill(pid, signal.SIGKILL)
                    return pid
        time.sleep(0.1)
    return None
