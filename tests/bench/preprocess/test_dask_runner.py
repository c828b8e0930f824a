"""bench.preprocess.dask_runner: the cluster's own CPU, which the run would otherwise count as contention."""
import sys
import time

from bench.preprocess import dask_runner as preprocess_dask
from common import processes

BURN_S = 0.3   # CPU seconds each of the two processes below burns
# A child that burns CPU, then starts a grandchild that burns CPU too, then waits: a nanny and its worker.
BUSY = ("import subprocess, sys, time\n"
        "def burn(seconds):\n"
        "    end = time.process_time() + seconds\n"
        "    while time.process_time() < end: pass\n"
        f"burn({BURN_S})\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time\\nend = time.process_time() + {BURN_S}\\n"
        "while time.process_time() < end: pass\\ntime.sleep(60)'])\n"
        "time.sleep(60)\n")


def test_the_cluster_cpu_counts_each_member_and_its_live_descendants():
    with processes.started([sys.executable, "-c", BUSY]) as proc:  # its whole session is killed on leaving
        deadline = time.monotonic() + 30
        while preprocess_dask.cluster_cpu_s([proc]) < 2 * BURN_S and time.monotonic() < deadline:
            time.sleep(0.1)
        assert preprocess_dask.cluster_cpu_s([proc]) >= 2 * BURN_S   # the child's and the grandchild's
    assert preprocess_dask.cluster_cpu_s([proc]) == 0.0   # gone: nothing more to count
