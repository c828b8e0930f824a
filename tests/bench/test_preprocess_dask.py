"""bench.preprocess_dask: the cluster's own CPU, which the run would otherwise count as contention."""
import os
import signal
import subprocess
import sys
import time

from bench import preprocess_dask

# A child that burns CPU, then starts a grandchild that burns CPU too, then waits: a nanny and its worker.
BUSY = ("import subprocess, sys, time\n"
        "def burn(seconds):\n"
        "    end = time.process_time() + seconds\n"
        "    while time.process_time() < end: pass\n"
        "burn(0.3)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.3\\n"
        "while time.process_time() < end: pass\\ntime.sleep(60)'])\n"
        "time.sleep(60)\n")


def test_the_cluster_cpu_counts_each_member_and_its_live_descendants():
    proc = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while preprocess_dask.cluster_cpu_s([proc]) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert preprocess_dask.cluster_cpu_s([proc]) >= 0.6   # the child's 0.3 s and the grandchild's 0.3 s
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert preprocess_dask.cluster_cpu_s([proc]) == 0.0   # gone: nothing more to count
