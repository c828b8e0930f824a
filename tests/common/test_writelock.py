"""One writer per output: a live holder is named and refused, a dead one's lock taken over; orphans end."""
import json
import os
import socket
import sys
import time

import psutil
import pytest

from common import processes, writelock
from tests.preprocess.conftest import REPO_ROOT


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    lock = tmp_path / "out" / "writer.lock"
    with writelock.hold(lock, "the output out/") as owner:
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() == owner["host"]
        assert oct(lock.stat().st_mode & 0o777) == oct(0o644 & ~_umask())
        with pytest.raises(writelock.OutputLockedError,
                           match=f"{lock}: the output out/ is being written by process {os.getpid()} on "):
            writelock.acquire(lock, "the output out/")
    assert not lock.exists()  # released


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, caplog):
    with processes.started([sys.executable, "-c", "pass"]) as gone:
        gone.wait(timeout=60)
    lock = tmp_path / "writer.lock"
    lock.write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "started": time.time() - 60}))
    with writelock.hold(lock, "x"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert f"taking over a stale lock (process {gone.pid}" in caplog.text


def test_a_reused_pid_does_not_keep_a_lock_alive(tmp_path):
    lock = tmp_path / "writer.lock"
    me = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": "1", "started": 0}  # started earlier
    lock.write_text(json.dumps(me))
    with writelock.hold(lock, "x") as owner:
        assert owner["process_start"] != "1"


def test_a_lock_from_another_host_is_refused_with_how_to_remove_it(tmp_path):
    lock = tmp_path / "writer.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "node-17", "started": 0}))
    with pytest.raises(writelock.OutputLockedError, match=f"process 1 on node-17 .*remove {lock} if it is known"):
        writelock.acquire(lock, "x")


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    child_pid = tmp_path / "child.pid"
    # In a session of its own: only the parent is killed below, and the orphan must end by itself; whatever is
    # left of the session (an orphan that did not, after the assertions) is killed on leaving the block.
    with processes.started([sys.executable, "-c", f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "from common.writelock import end_with_parent; import time; "
                          "end_with_parent(); open({str(child_pid)!r}, 'w').write(str(__import__('os').getpid())); "
                          "time.sleep(120)"])
time.sleep(120)
"""], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}) as parent:
        deadline = time.time() + 60
        while not child_pid.exists() or not child_pid.read_text():
            assert time.time() < deadline
            time.sleep(0.05)
        child = psutil.Process(int(child_pid.read_text()))
        parent.kill()
        parent.wait(timeout=60)
        child.wait(timeout=10)  # raises if the orphan lives on
        assert not child.is_running()

