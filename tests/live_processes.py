"""psutil views of running processes for the tests that look at them, tolerating a process that ends while it is
looked at: between listing a process and reading it, any process may exit (a launcher's short-lived helper, a
shell on a virtual host), and psutil then raises NoSuchProcess. That is a race, not a leak; the tests that prove
nothing is left over still wait for every process they found."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psutil


def alive(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes of ``pids`` that are still running when looked at."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):  # ZombieProcess is one too
            found.append(psutil.Process(pid))
    return found


def with_words(processes: Iterable[psutil.Process], *words: str) -> list[psutil.Process]:
    """Those of ``processes`` whose command line holds every one of ``words``, left out if it ended meanwhile."""
    found = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            line = " ".join(process.cmdline())
            if all(word in line for word in words):
                found.append(process)
    return found


def descendants(pid: int, *words: str) -> list[psutil.Process]:
    """The running descendants of ``pid`` whose command line holds every one of ``words`` (all without words)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return with_words(children, *words)


def kill_all(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL each of ``processes`` that still runs."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
