"""The rest of the machine: the CPU other processes use while a benchmark measures, and waiting for them to calm down.

A shared machine's other jobs skew wall times far more than CPU times; the benchmarks record the cores others
used during each measurement and flag (or leave out of their medians) the measurements they contended with.
"""
from __future__ import annotations

import time

import psutil

CONTENDED_LOAD = 0.25   # other processes using more cores than this during a measurement: it is flagged


def busy_cpu() -> float:
    """Machine-wide non-idle CPU seconds so far (steal, iowait and guest time excluded)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0) - getattr(t, "guest", 0.0) \
        - getattr(t, "guest_nice", 0.0)


class OtherProcesses:
    """The CPU the rest of the machine used since this object was made: the machine's busy CPU minus this
    process's own (all its threads) and minus ``children_cpu_s``, the CPU of children measured meanwhile."""

    def __init__(self):
        self._busy, self._own, self._wall = busy_cpu(), time.process_time(), time.perf_counter()

    def cpu_s(self, children_cpu_s: float = 0.0) -> float:
        return max(0.0, busy_cpu() - self._busy - (time.process_time() - self._own) - children_cpu_s)

    def cores(self, children_cpu_s: float = 0.0) -> float:
        """The CPU seconds of ``cpu_s`` per wall-clock second: how many cores others kept busy on average."""
        return self.cpu_s(children_cpu_s) / max(time.perf_counter() - self._wall, 1e-9)


def wait_for_quiet(max_wait: float, threshold: float = 0.3) -> float:
    """Wait (up to ``max_wait`` s) until the rest of the machine uses under ``threshold`` cores; returns that load."""
    deadline = time.monotonic() + max_wait
    while True:
        others = OtherProcesses()
        time.sleep(1.0)
        load = others.cores()
        if load < threshold or time.monotonic() >= deadline:
            return round(load, 3)
