"""A run directory has one writer, and ranks do not outlive their launcher."""
import json
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from common import processes
from common.writelock import OutputLockedError
from pretrain import config, train
from tests.live_processes import descendants, kill_all
from tests.pretrain.launching import REPO, TINY, command, environment, free_port, settings


def test_a_second_run_on_the_same_output_is_refused_naming_the_first(one_rank, sample_dataset, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with processes.started([sys.executable, "-c", "import time; time.sleep(60)"]) as holder:  # killed on leaving
        started = psutil.Process(holder.pid).create_time()
        stat = open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[1].split()[19]
        (out / train.LOCK_NAME).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                       "process_start": stat, "started": started}))
        cfg = config.load(TINY, [a for a in settings(sample_dataset, out, steps=2) if a != "--set"])
        with pytest.raises(OutputLockedError, match=f"the run directory {out} is being written by process {holder.pid}"):
            train.run(cfg, one_rank, resume=True)
        assert not (out / "config.yaml").exists()
    assert train.run(cfg, one_rank, resume=True) == 0  # the holder is gone: its lock is stale
    assert not (out / train.LOCK_NAME).exists()


def test_ranks_exit_when_their_launcher_is_killed(sample_dataset, tmp_path):
    out = tmp_path / "run"
    # The launcher's session is killed on leaving the block: only after the ranks were seen to end by themselves.
    with processes.started(command("torchrun", 2, settings(sample_dataset, out, steps=100000), free_port()),
                           cwd=REPO, env=environment(), text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT) as proc:
        deadline = time.time() + 180
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().strip()):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        ranks = descendants(proc.pid, "run.py")
        assert len(ranks) == 2
        proc.send_signal(signal.SIGKILL)  # the launcher alone: nothing forwards a signal to the ranks
        proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(ranks, timeout=90)
        assert not alive, f"ranks {[p.pid for p in alive]} outlived their launcher"


@pytest.mark.exclusive  # it bounds the job's end by the wall clock
def test_a_stopped_rank_makes_the_others_exit_within_the_collective_timeout(sample_dataset, tmp_path):
    out = tmp_path / "run"
    args = settings(sample_dataset, out, steps=100000, **{"faults.timeout_minutes": 0.25, "zero.stage": 2})
    with processes.started(command("torchrun", 2, args, free_port()), cwd=REPO, env=environment(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        try:
            deadline = time.time() + 180
            while not ((out / "metrics.jsonl").is_file()
                       and len((out / "metrics.jsonl").read_text().splitlines()) >= 2):
                assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
                time.sleep(0.2)
            ranks = sorted(descendants(proc.pid, "run.py"), key=lambda p: p.pid)
            stopped, waiting = ranks
            stopped.suspend()  # SIGSTOP: alive, holding its sockets, answering nothing
            began = time.time()
            waiting.wait(timeout=15 + 75)  # raises if it is still blocked well past the 15-second timeout
            assert time.time() - began < 90
        finally:
            kill_all(descendants(proc.pid))
            output = proc.communicate(timeout=120)[0]
    assert "a collective (the gradient reduction or the step's statistics) waited longer than " \
           "faults.timeout_minutes (0.25)" in output, output[-3000:]
