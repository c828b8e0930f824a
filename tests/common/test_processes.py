"""Nothing outlives a wait: a child that times out, fails or exits takes its whole session down with it."""
import subprocess
import sys
import time

import pytest

from common import processes

# A child that starts a grandchild which ignores SIGTERM, writes its pid, and then both sleep.
FAMILY = """
import subprocess, sys, time
grandchild = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)")
subprocess.Popen([sys.executable, "-c", grandchild, sys.argv[1]], start_new_session={own_group})
time.sleep({sleep})
sys.exit({status})
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _grandchild(pid_file, deadline: float = 30.0) -> int:
    began = time.monotonic()
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() - began < deadline, "the grandchild never started"
        time.sleep(0.05)
    return int(pid_file.read_text())


def _gone(pid: int, within: float = 5.0) -> bool:
    began = time.monotonic()
    while _alive(pid) and time.monotonic() - began < within:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_timed_out_child_leaves_no_process_behind(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = FAMILY.format(own_group=False, sleep=600, status=0)
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run([sys.executable, "-c", code, str(pid_file)], timeout=3)
    assert _gone(_grandchild(pid_file))


def test_a_grandchild_in_a_process_group_of_its_own_is_killed_too(tmp_path):
    """A process group of its own inside the session (a shell's job control makes them) is found and killed."""
    pid_file = tmp_path / "grandchild.pid"
    code = FAMILY.format(own_group=False, sleep=600, status=0).replace(
        "start_new_session=False", "process_group=0")
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run([sys.executable, "-c", code, str(pid_file)], timeout=3)
    assert _gone(_grandchild(pid_file))


def test_a_child_that_exits_takes_its_stragglers_with_it(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = FAMILY.format(own_group=False, sleep=1, status=3)
    result = processes.run([sys.executable, "-c", code, str(pid_file)], timeout=60, capture_output=True, text=True)
    assert result.returncode == 3
    assert _gone(_grandchild(pid_file))
    with pytest.raises(subprocess.CalledProcessError):
        processes.run([sys.executable, "-c", "raise SystemExit(4)"], timeout=60, check=True)


def test_a_waiter_that_fails_kills_the_session(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = FAMILY.format(own_group=False, sleep=600, status=0)
    with pytest.raises(RuntimeError, match="the waiter failed"):
        with processes.started([sys.executable, "-c", code, str(pid_file)]) as child:
            grandchild = _grandchild(pid_file)
            raise RuntimeError("the waiter failed")
    assert child.returncode is not None and _gone(grandchild)


def test_run_passes_input_and_captures_output():
    result = processes.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], timeout=60,
                           input="hello", capture_output=True, text=True)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "HELLO", "")
