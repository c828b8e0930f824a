"""Child processes that never outlive their wait: each starts a session of its own, and when the wait times out,
fails or is interrupted, every process of that session is killed, grandchildren included.

``subprocess.run(..., timeout=...)`` kills only the child it started: a launcher's ranks, a shell's pipeline or a
benchmark's workers live on as orphans (one such orphan held 6.4 GB for the rest of a test run). Tests, benchmarks,
scripts and the cluster helpers start children through ``run`` or ``started`` instead.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Iterator, Sequence

KILL_WAIT = 10.0   # seconds to wait for a killed session's leader to be reaped
POLL = 0.5         # seconds between checks that a waited-on child is still running


def session_members(sid: int) -> list[int]:
    """The processes now in session ``sid`` (a child started here leads its own), from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    members.append(int(entry))
            except OSError:  # gone meanwhile, or not ours to see
                continue
    return members


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``: its process groups first, then any member found in /proc (a
    process that made a group of its own inside the session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def stop(process: subprocess.Popen) -> None:
    """Kill ``process``'s whole session (``process`` was started by ``started`` or ``run``) and reap its leader."""
    kill_session(process.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_WAIT)


@contextlib.contextmanager
def started(argv: Sequence[str], **popen_arguments) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(argv, ...)`` in a session of its own; on leaving the block, whatever is still running in
    that session is killed, whether the block ended normally (the child exited, its workers may not have) or not."""
    process = subprocess.Popen(list(argv), start_new_session=True, **popen_arguments)
    try:
        yield process
    finally:
        if process.poll() is None:
            stop(process)
        else:
            kill_session(process.pid)  # members the leader left behind
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def run(argv: Sequence[str], *, timeout: float, input: str | bytes | None = None, check: bool = False,
        **popen_arguments) -> subprocess.CompletedProcess:
    """``subprocess.run`` with a required ``timeout``, in a session of its own: when it times out (or the wait is
    interrupted) the whole session is killed before ``subprocess.TimeoutExpired`` (or the interrupt) is raised.
    Takes ``capture_output``, ``text``, ``cwd``, ``env`` and the other ``Popen`` arguments."""
    if popen_arguments.pop("capture_output", False):
        popen_arguments.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        popen_arguments["stdin"] = subprocess.PIPE
    deadline = time.monotonic() + timeout
    with started(argv, **popen_arguments) as process:
        while True:
            try:
                stdout, stderr = process.communicate(input, timeout=min(POLL, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired as expired:
                input = None  # sent already; communicate refuses it twice
                if process.poll() is not None:
                    kill_session(process.pid)  # the child is done; what it left behind holds its output pipes
                elif time.monotonic() >= deadline:
                    stop(process)
                    raise subprocess.TimeoutExpired(process.args, timeout, expired.output, expired.stderr) from None
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


__all__ = ["kill_session", "run", "session_members", "started", "stop"]
