"""The preprocessing benchmark's Dask section: the pipeline on Beam's DaskRunner against a local cluster.

A scheduler and single-threaded workers on 127.0.0.1 are started for the run (nothing listens beyond this
machine); the CPU is summed over the scheduler, the workers (their nannies and worker processes, reaped by
``bench.processes.stop_and_reap``) and the driver's process tree. The shards must equal the in-memory run's.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil

from bench.cpu import CONTENDED_LOAD
from bench.preprocess.runs import Setting, run_pipeline
from bench.processes import child_env, free_port, stop_and_reap
from bench.record import REPO

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"


def dask_run(setting: Setting, workers: int = 2) -> dict:
    """The pipeline on Beam's DaskRunner against a scheduler and ``workers`` single-threaded workers, all on
    127.0.0.1 and started for this run; CPU summed over scheduler, workers (with their nannies) and driver."""
    logs = setting.logs
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    started = time.perf_counter()
    cluster = [_spawn(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                       "--dashboard-address", f"127.0.0.1:{free_port()}"], logs / "dask-scheduler.log")]
    try:
        from distributed import Client

        for i in range(workers):
            cluster.append(_spawn(["dask", "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                                   "--no-dashboard"], logs / f"dask-worker{i}.log"))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        ready = time.perf_counter() - started
        cluster_before = cluster_cpu_s(cluster)
        r = run_pipeline(setting, setting.work / "out" / "dask",
                         ["--runner", DASK_RUNNER, "--dask_client_address", address], logs / "dask-driver.log")
        # The run measures the cluster's CPU as other processes' load: what is left beyond it is contention.
        beyond = max(0.0, r["foreign_cpu_s"] - (cluster_cpu_s(cluster) - cluster_before)) / r["wall_s"]
    finally:
        cluster_cpu = [stop_and_reap(proc) for proc in cluster]
    return {"workers": workers, "address": "127.0.0.1 only", "cluster_start_wall_s": round(ready, 3),
            "driver_wall_s": r["wall_s"], "driver_cpu_s": r["cpu_s"],
            "scheduler_cpu_s": round(cluster_cpu[0], 3), "workers_cpu_s": [round(c, 3) for c in cluster_cpu[1:]],
            "cpu_s": round(r["cpu_s"] + sum(cluster_cpu), 3), "peak_driver_tree_rss_bytes": r["peak_tree_rss_bytes"],
            "shard_sha256": r["shard_sha256"], "foreign_load_cores_beyond_cluster": round(beyond, 3),
            "contended": beyond > CONTENDED_LOAD, "run": r}


def cluster_cpu_s(cluster: list[subprocess.Popen]) -> float:
    """CPU so far of the cluster's processes and their live descendants (nannies' worker processes)."""
    total = 0.0
    for proc in cluster:
        try:
            root = psutil.Process(proc.pid)
            members = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for member in members:
            try:
                times = member.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen:
    """A member of the cluster in a session of its own (so that stopping it reaches its whole tree)."""
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
