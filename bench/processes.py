"""A benchmark's child process, measured whole: the CPU of its process tree and its peak memory.

CPU comes from ``os.wait4``: the rusage of the child and of every descendant it reaped, which sampling cannot
miss (a short-lived worker dies between two samples). Memory comes from sampling with ``psutil``: the summed RSS
of the tree (``TreeSampler``) or each rank's kernel high-water mark (``RankPeaks``).
"""
from __future__ import annotations

import os
import resource
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil

from bench.cpu import OtherProcesses
from bench.record import REPO, shown

SAMPLE_INTERVAL = 0.1   # seconds between samples of a process tree
RUN_TIMEOUT = 600       # seconds; a measured child that takes longer is killed


def child_env(tree: Path = REPO) -> dict:
    """The environment of a measured child: ``tree``'s packages first on the path (``tree`` may be another
    checkout of the project, measured against this one)."""
    env = dict(os.environ)
    # Measured as an installed program runs: with its modules' bytecode cached (the first run writes it), not
    # compiled from source in every process (seconds per Apache Beam process).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vm_hwm(pid: int | str = "self") -> int:
    """The kernel's high-water mark of a process's resident memory (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


class TreeSampler(threading.Thread):
    """Samples a process tree: the sum of RSS (peak kept) and the last seen CPU time of every process."""

    def __init__(self, pid: int, interval: float = SAMPLE_INTERVAL):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.stop = threading.Event()
        self.peak_rss = 0
        self.peak_processes = 0
        self.samples = 0
        self.cpu: dict[tuple[int, float], float] = {}
        self.names: dict[tuple[int, float], str] = {}
        self.peak_rss_of: dict[tuple[int, float], int] = {}  # each process's own peak
        self.own_cpu = 0.0

    def run(self):
        started = time.thread_time()
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            rss, alive = 0, 0
            for proc in procs:
                try:
                    with proc.oneshot():
                        mem = proc.memory_info()
                        cpu = proc.cpu_times()
                        key = (proc.pid, proc.create_time())
                        if key not in self.names:
                            self.names[key] = " ".join(proc.cmdline()[:4])[:120]
                except psutil.Error:  # gone, zombie or denied between the listing and the read
                    continue
                rss += mem.rss
                alive += 1
                self.peak_rss_of[key] = max(self.peak_rss_of.get(key, 0), mem.rss)
                self.cpu[key] = cpu.user + cpu.system
            self.samples += 1
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_processes = max(self.peak_processes, alive)
            self.stop.wait(self.interval)
        self.own_cpu = time.thread_time() - started


class RankPeaks(threading.Thread):
    """Peak RSS of each rank of a job: VmHWM of every descendant that has RANK in its environment (torchrun's
    workers) or, when the job is not started by torchrun, of the started process itself; read until ``done``."""

    INTERVAL = 0.25   # seconds between reads; VmHWM is a high-water mark, so a peak between two reads is not missed

    def __init__(self, process: subprocess.Popen, interval: float = INTERVAL):
        super().__init__(daemon=True)
        self.root, self.interval, self.peaks, self.done = psutil.Process(process.pid), interval, {}, threading.Event()

    def run(self) -> None:
        launcher = "torch.distributed.run" in " ".join(self.root.cmdline())
        while not self.done.is_set():
            try:
                procs = self.root.children(recursive=True) if launcher else [self.root]
            except psutil.NoSuchProcess:
                break
            for proc in procs:
                try:
                    rank = int(proc.environ()["RANK"]) if launcher else 0
                    hwm = vm_hwm(proc.pid)
                except (psutil.Error, KeyError, OSError, StopIteration):
                    continue  # not a rank, or gone
                self.peaks[rank] = max(self.peaks.get(rank, 0), hwm)
            self.done.wait(self.interval)


def run_measured(cmd: list[str], log: Path, timeout: float = RUN_TIMEOUT, env: dict | None = None,
                 cwd: Path = REPO) -> dict:
    """Run ``cmd`` (output to ``log``) and measure it: wall time, the CPU of the whole reaped tree (wait4), the
    sampled CPU and summed RSS of the tree, ru_maxrss, and the cores other processes used meanwhile.
    Raises RuntimeError, with the log's tail, when the child fails or runs past ``timeout`` seconds."""
    from common import processes  # here: a docstore_load child imports this module on an older tree's ``common``

    log.parent.mkdir(parents=True, exist_ok=True)
    others = OtherProcesses()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "wb") as out:
        started = time.perf_counter()
        # Not processes.started: the child is reaped by os.wait4 below, for the CPU of every descendant it reaped.
        proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(cwd) | (env or {}), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            processes.kill_session(proc.pid)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: the whole measured tree goes with the wait
            timer.cancel()
            sampler.stop.set()
            processes.stop(proc)
            raise
        wall = time.perf_counter() - started
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wait4_cpu = usage.ru_utime + usage.ru_stime
    foreign_cpu = others.cpu_s(children_cpu_s=wait4_cpu)   # the sampler thread's CPU is this process's own
    sampler.stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Anything the tree did not reap (a stray worker still running) would be missed by wait4.
    leftovers = [p.pid for p in psutil.process_iter(["pid"]) if in_session(p, proc.pid)]
    processes.kill_session(proc.pid)  # counted above; none of them outlives the run
    if timed_out.is_set() or proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:6])}... failed (rc {proc.returncode}, timed out "
                           f"{timed_out.is_set()}); log {log}:\n{tail}")
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(wait4_cpu, 3),
        "cpu_user_s": round(usage.ru_utime, 3),
        "cpu_system_s": round(usage.ru_stime, 3),
        "rusage_children_delta_cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 3),
        "sampled_tree_cpu_s": round(sum(sampler.cpu.values()), 3),
        "processes_seen": len(sampler.cpu),
        # Per process, in start order (last sampled CPU): shows how the work spread over the workers.
        "process_cpu_s": [{"cmd": sampler.names[key], "cpu_s": round(cpu, 2),
                           "sampled_peak_rss_bytes": sampler.peak_rss_of.get(key, 0)}
                          for key, cpu in sorted(sampler.cpu.items(), key=lambda kv: kv[0][1]) if cpu >= 0.05],
        "peak_concurrent_processes": sampler.peak_processes,
        # The tree's sum is at least its largest process's high-water mark, which sampling can miss.
        "peak_tree_rss_bytes": max(sampler.peak_rss, usage.ru_maxrss * 1024),
        "sampled_peak_tree_rss_bytes": sampler.peak_rss,
        "ru_maxrss_bytes": usage.ru_maxrss * 1024,   # Linux reports KiB: the largest single process
        "samples": sampler.samples,
        "sampler_cpu_s": round(sampler.own_cpu, 3),
        "unreaped_processes": len(leftovers),
        # CPU that other processes of the machine used meanwhile (contention skews the wall times).
        "foreign_cpu_s": round(foreign_cpu, 3),
        "foreign_load_cores": round(foreign_cpu / wall, 3),
        "log": shown(log),
    }


def in_session(proc: psutil.Process, sid: int) -> bool:
    """Whether ``proc`` belongs to the session ``sid`` (a measured child starts one: its whole tree is in it)."""
    try:
        return os.getsid(proc.pid) == sid
    except OSError:
        return False


def stop_and_reap(proc: subprocess.Popen) -> float:
    """SIGTERM, wait (SIGKILL to its session after 30 s); the CPU of the process and of every descendant it reaped.
    ``proc`` leads a session of its own: whatever it leaves running in it is killed once it is reaped."""
    from common import processes  # here: a docstore_load child imports this module on an older tree's ``common``

    proc.terminate()
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return usage.ru_utime + usage.ru_stime
            time.sleep(0.1)
        processes.kill_session(proc.pid)
        _, _, usage = os.wait4(proc.pid, 0)
        return usage.ru_utime + usage.ru_stime
    finally:
        processes.kill_session(proc.pid)  # its stragglers; all of it when the wait was interrupted
