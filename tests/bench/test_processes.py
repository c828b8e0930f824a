"""bench.processes: a child measured whole (its reaped descendants' CPU included) and peak memory per rank."""
import subprocess
import sys

import pytest

from bench import processes
from common import processes as sessions

# A child that starts a grandchild burning a fixed amount of CPU, waits for it, and prints the grandchild's CPU.
GRANDCHILD = "import time; sum(i * i for i in range(3_000_000)); print(time.process_time())"
CHILD = ("import subprocess, sys; out = subprocess.run([sys.executable, '-c', sys.argv[1]], capture_output=True, "
         "text=True, check=True).stdout; print('grandchild', out.strip())")


def test_the_cpu_of_reaped_descendants_is_counted(tmp_path):
    log = tmp_path / "child.log"
    result = processes.run_measured([sys.executable, "-c", CHILD, GRANDCHILD], log, cwd=tmp_path)
    grandchild_cpu = float(log.read_text().split("grandchild")[-1])
    assert result["cpu_s"] >= grandchild_cpu > 0
    assert result["unreaped_processes"] == 0
    assert result["peak_tree_rss_bytes"] >= result["ru_maxrss_bytes"] > 0


def test_a_failing_child_raises_with_its_log(tmp_path):
    with pytest.raises(RuntimeError, match="the child's last words"):
        processes.run_measured([sys.executable, "-c", "import sys; print(\"the child's last words\"); sys.exit(3)"],
                               tmp_path / "fail.log", cwd=tmp_path)


def test_a_child_past_its_timeout_is_killed(tmp_path):
    with pytest.raises(RuntimeError, match="timed out True"):
        processes.run_measured([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "slow.log",
                               timeout=1, cwd=tmp_path)


def test_rank_peaks_read_the_high_water_mark_of_a_lone_process():
    allocate = 64 * 2**20
    code = (f"import sys; block = bytearray({allocate}); block[::4096] = b'x' * len(block[::4096]); "
            "print('ready', flush=True); sys.stdin.readline()")
    with sessions.started([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as child:
        sampler = processes.RankPeaks(child, interval=0.01)
        try:
            assert child.stdout.readline().strip() == "ready"
            sampler.start()
            while sampler.is_alive() and sampler.peaks.get(0, 0) < allocate:
                sampler.done.wait(0.01)
        finally:
            sampler.done.set()
            child.communicate("go\n", timeout=60)
    assert sampler.peaks[0] >= allocate


def test_stop_and_reap_returns_the_cpu_of_a_stopped_child():
    code = "import time; sum(range(2_000_000)); print('ready', flush=True); time.sleep(600)"
    with sessions.started([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout.readline().strip() == "ready"
        cpu = processes.stop_and_reap(child)
    assert child.returncode == -15 and cpu > 0
