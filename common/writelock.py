"""One writer per output: a lock file that names its holder, and the ending of processes orphaned by their driver.

``hold(path, what)`` creates ``path`` exclusively, holding the process id, host, process start time and
wall-clock start; a second run that finds it refuses in one line naming the holder. A lock left by a process
that is gone (same host; the pid no longer runs, or now belongs to a process started later) is stale: it is
taken over with a warning. A lock from another host cannot be checked from here, so the message says how to
remove it when that job is known to be over.

``end_with_parent()`` asks Linux to send SIGTERM to this process when the process that started it exits (a
driver, a launcher), so workers and ranks never outlive the job that owns their output.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

from common.errors import OutputLockedError

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1




def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(holder: dict) -> bool:
    pid = int(holder.get("pid", -1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    started = holder.get("process_start")
    return started is None or _process_start(pid) in (None, started)


def _describe(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"process {holder.get('pid')} on {holder.get('host')} since {since}"


def acquire(path: Path, what: str) -> dict:
    """Create the lock file ``path`` for this process; raise ``OutputLockedError`` if a live holder has it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid()),
          "started": time.time(), "what": what}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text() or "{}")
            except (OSError, json.JSONDecodeError):
                holder = {}
            if holder.get("host") != me["host"] and holder:
                raise OutputLockedError(
                    f"{path}: {what} is being written by {_describe(holder)}; wait for that job, or remove "
                    f"{path} if it is known to be over") from None
            if holder and _alive(holder):
                raise OutputLockedError(f"{path}: {what} is being written by {_describe(holder)}; wait for it to "
                                        "finish, or stop it, before starting another run on the same output") from None
            log.warning(f"{path}: taking over a stale lock ({_describe(holder) if holder else 'unreadable'}, no "
                        "longer running)")
            with contextlib.suppress(FileNotFoundError):
                stale = path.with_name(f"{path.name}.stale-{os.getpid()}")
                os.replace(path, stale)
                stale.unlink()
            continue
        with os.fdopen(fd, "w") as handle:
            json.dump(me, handle)
        return me
    raise OutputLockedError(f"{path}: could not take the lock for {what}: another run keeps taking it")


def release(path: Path, owner: dict) -> None:
    """Remove the lock file if it is still ``owner``'s."""
    path = Path(path)
    try:
        holder = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return
    if holder.get("pid") == owner["pid"] and holder.get("started") == owner["started"]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def hold(path: Path, what: str):
    owner = acquire(path, what)
    try:
        yield owner
    finally:
        release(path, owner)


def end_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux); False where unsupported."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent exited before the request took effect
        os.kill(os.getpid(), sig)
    return True


__all__ = ["OutputLockedError", "acquire", "end_with_parent", "hold", "release"]
