"""Live services for the cluster tests, as a pytest plugin (``pytest_plugins = ["tests.cluster.live"]``):

* ``slurm``: a real single-host Slurm cluster (Debian's munge, slurmctld and slurmd) with its own munge socket,
  ports, state and logs in a temporary directory, so it neither needs nor disturbs any Slurm already on the machine;
* ``ssh_nodes``: an OpenSSH server on 127.0.0.1 with its own host key, reached as two "nodes" through an ssh client
  config and a key pair made for it;
* ``sample_dataset``: the pretraining tests' dataset, and ``two_rank_reference``: the tiny pretraining run on two
  processes under torchrun, which every other way of launching the same run must reproduce (both once a session).

A service is started for the test module that uses it (about a second) and stopped, by process id, when the module is
done; if pytest is killed, the kernel stops its daemons. The Debian packages come from ``scripts/test_services.sh``;
without them (or without root) the tests fail in CI and are skipped elsewhere.
PYTEST_DONT_REWRITE (a plugin module: no assertion rewriting)
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from common import processes
from tests.pretrain.conftest import sample_dataset  # noqa: F401  (re-exported: one dataset for all live tests)
from tests.pretrain.launching import free_port, launch, losses, settings

STEPS = 40             # long enough to deliver a signal mid-run, short enough for seconds of training
CHECKPOINT_EVERY = 10
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


def tiny_run(dataset, out, **more) -> list[str]:
    """``--set`` arguments of the tiny pretraining run the live tests launch in different ways."""
    return settings(dataset, out, steps=STEPS, **{"checkpoint.every_steps": CHECKPOINT_EVERY, **more})


def need(condition: bool, message: str) -> None:
    """A missing service is a failure in CI (CI=true) and a skip, with the reason, elsewhere."""
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def need_system(*programs: str) -> None:
    missing = [p for p in programs if shutil.which(p) is None and not os.access(p, os.X_OK)]
    need(not missing, f"{', '.join(missing)} not installed: run `bash scripts/test_services.sh` as root")
    need(os.geteuid() == 0, "the live cluster tests start sshd and Slurm daemons, which needs root")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(check, what: str, timeout: float, interval: float = 0.25, diagnose=lambda: ""):
    """Poll ``check`` until it returns something truthy (returned); fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{diagnose()}")
        time.sleep(interval)


def daemon(command: list[str], log: pathlib.Path) -> subprocess.Popen:
    """Start a service in the foreground, in its own session (a Ctrl-C in the terminal reaches pytest, which then
    stops it in order) and set to receive SIGTERM if pytest dies without stopping it (Linux's parent-death signal),
    so that a killed test run leaves no daemons behind."""
    libc = ctypes.CDLL(None, use_errno=True)

    def die_with_parent():
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    with open(log, "ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=die_with_parent)


def stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM to a ``daemon`` (it shuts down in order), then SIGKILL to whatever still runs in its session."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
    processes.stop(proc)


@contextlib.contextmanager
def started(service):
    """A service (``SlurmCluster``, ``SSHNodes``) started, and stopped afterwards, also when it started only in part."""
    try:
        service.start()
        yield service
    finally:
        service.stop()


def tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return f"--- {path} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"--- {path}: not there ---"


# ----------------------------------------------------------------------------------------------- Slurm

class SlurmCluster:
    """munged, slurmctld and slurmd in the foreground (so their ids are ours), configured for one node with all of
    this machine's cores, a 10 s credential lifetime (a requeued job may start again only after it) and a scheduler
    that runs every few seconds. Clients find it through ``SLURM_CONF`` (see ``env``)."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.jobcomp_log = root / "log" / "jobcomp.log"
        self.node = socket.gethostname().split(".")[0]
        self._daemons: list[tuple[str, subprocess.Popen]] = []

    @property
    def env(self) -> dict:
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        for sub in ("munge", "log", "state/ctld", "state/d"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        processes.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True, timeout=60)
        # munged refuses root unless forced; everything here runs as root, so its own munge user buys nothing.
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                               f"--seed-file={self.root / 'munge' / 'munged.seed'}"])
        wait_until(self.munge_socket.exists, "munged's socket", 20, diagnose=self.diagnose)
        try:
            address = socket.gethostbyname(self.node)
        except OSError:
            address = ""
        need(bool(address), f"this machine's host name {self.node!r} does not resolve; jobs find their master by "
                            f"node name (add '127.0.0.1 {self.node}' to /etc/hosts)")
        self.conf.write_text(self._config())
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])

        def node_ready():
            state = self.run("sinfo", "-h", "-n", self.node, "-o", "%T", check=False).stdout.strip()
            if state.startswith(("down", "drain", "fail")):
                self.run("scontrol", "update", f"NodeName={self.node}", "State=RESUME", check=False)
            return state.rstrip("*") in ("idle", "mixed", "allocated")

        wait_until(node_ready, f"Slurm node {self.node} idle", 60, diagnose=self.diagnose)

    def _config(self) -> str:
        hardware = dict(item.split("=", 1) for item in processes.run(
            ["slurmd", "-C"], check=True, capture_output=True, text=True, timeout=60).stdout.split() if "=" in item)
        memory = int(hardware["RealMemory"]) * 9 // 10  # above what slurmd measures would drain the node
        state, log = self.root / "state", self.root / "log"
        return "\n".join([
            "ClusterName=bertpipelinetest",
            f"FirstJobId={self._first_job_id()}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # a private munged; a requeued job waits one credential lifetime (default 120 s) before it restarts
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={state / 'ctld'}", f"SlurmdSpoolDir={state / 'd'}",
            f"SlurmctldPidFile={state / 'slurmctld.pid'}", f"SlurmdPidFile={state / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}", f"SlurmdLogFile={log / 'slurmd.log'}",
            # no cgroup tree is delegated to us (containers, VMs without systemd): track processes by parentage
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            # one small node: schedule every couple of seconds rather than every 30-60 s
            "SchedulerType=sched/backfill", "SchedulerParameters=bf_interval=1,sched_interval=2",
            "ReturnToService=2", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.jobcomp_log}", "MailProg=/bin/true",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={hardware['CPUs']} "
            f"Sockets={hardware['SocketsPerBoard']} CoresPerSocket={hardware['CoresPerSocket']} "
            f"ThreadsPerCore={hardware['ThreadsPerCore']} RealMemory={memory} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n"

    @staticmethod
    def _first_job_id() -> int:
        """Pretraining jobs take the port 20000 + job id % 20000 for their rendezvous: start the job ids where
        those ports are free, so that a second test cluster on this machine (another session's) cannot collide."""
        rng = random.Random()
        for _ in range(100):
            first = rng.randrange(1000, 19000)
            if all(_port_free(20000 + first + offset) for offset in range(10)):
                return first
        raise AssertionError("no free run of ports in 21000-39010 for the test jobs' rendezvous")

    def _spawn(self, name: str, command: list[str]) -> None:
        self._daemons.append((name, daemon(command, self.root / "log" / f"{name}.out")))

    def stop(self) -> None:
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self._daemons):
            self.run("scancel", "--quiet", "--partition=debug", check=False)
            wait_until(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), "jobs cancelled", 30)
        for _, proc in reversed(self._daemons):
            stop(proc)

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        result = processes.run(command, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr or result.stdout}")
        return result

    def job(self, job_id: str) -> dict:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, StdOut, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: str, timeout: float) -> dict:
        """Wait for the job to finish (a requeued job is not finished) and return its final fields."""
        return wait_until(lambda: (job := self.job(job_id))["JobState"] in FINISHED and job, f"job {job_id} finished",
                          timeout, interval=0.5, diagnose=lambda: self.diagnose(job_id))

    def completions(self, job_id: str) -> list[dict]:
        """The job's records in the completion log, one per time it ended (a requeue ends it once)."""
        if not self.jobcomp_log.exists():
            return []
        records = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in self.jobcomp_log.read_text().splitlines()]
        return [r for r in records if r.get("JobId") == job_id]

    def diagnose(self, job_id: str | None = None) -> str:
        parts = []
        if job_id:
            info = self.run("scontrol", "show", "job", job_id, check=False)
            parts.append(info.stdout or info.stderr)
            stdout = re.search(r"StdOut=(\S+)", info.stdout or "")
            if stdout:
                parts.append(tail(pathlib.Path(stdout.group(1)), 60))
        log = self.root / "log"
        parts += [tail(log / name) for name in ("slurmctld.log", "slurmd.log", "munged.out")]
        return "\n".join(parts)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running single-host Slurm cluster; ``slurm.env`` points clients (sbatch, scontrol, ...) at it. Its
    configuration and daemon logs stay in pytest's temporary directory for a look after a failure."""
    need_system("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol")
    with started(SlurmCluster(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


# ----------------------------------------------------------------------------------------------- ssh

class SSHNodes:
    """An sshd on 127.0.0.1 (its own port, config and host key) that two host names, ``hosts``, lead to.

    The names exist only in an ssh client config made here; ``bin`` holds an ``ssh`` that reads it, so that
    everything that calls ssh from ``PATH`` (the DeepSpeed launcher's check, pdsh) sees the two nodes as a user's
    ``~/.ssh/config`` would make them, and this machine's own ssh set-up is left alone."""

    hosts = ("node-a", "node-b")

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.bin = root / "bin"
        self.client_config = root / "ssh_config"
        self._sshd: subprocess.Popen | None = None

    def start(self) -> None:
        self.bin.mkdir(parents=True, exist_ok=True)
        host_key, user_key = self.root / "host_ed25519", self.root / "id_ed25519"
        for key in (host_key, user_key):
            processes.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bert-pipeline-test", "-f", str(key)],
                          check=True, capture_output=True, timeout=60)
        (self.root / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
        host_public = host_key.with_suffix(".pub").read_text().split()
        (self.root / "known_hosts").write_text(f"bert-pipeline-test-node {host_public[0]} {host_public[1]}\n")
        port = free_port()
        server_config = self.root / "sshd_config"
        server_config.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            f"AllowUsers {os.environ.get('USER') or 'root'}",
            "UsePAM no", "StrictModes no", "PrintMotd no", "X11Forwarding no", "LogLevel ERROR",
        ]) + "\n")
        self.client_config.write_text("\n".join([
            f"Host {' '.join(self.hosts)}", "  HostName 127.0.0.1", f"  Port {port}", f"  IdentityFile {user_key}",
            "  IdentitiesOnly yes", "  BatchMode yes",
            # both names are one server: check its key under one alias, strictly
            "  HostKeyAlias bert-pipeline-test-node", f"  UserKnownHostsFile {self.root / 'known_hosts'}",
            "  StrictHostKeyChecking yes", "  LogLevel ERROR",
        ]) + "\n")
        wrapper = self.bin / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {self.client_config} "$@"\n')
        wrapper.chmod(0o755)
        # sshd insists on its privilege separation directory, which the package leaves to the init system.
        pathlib.Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._sshd = daemon([shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(server_config)],
                            self.root / "sshd.log")

        def reachable():
            assert self._sshd.poll() is None, tail(self.root / "sshd.log")
            return all(self.ssh(host, "true").returncode == 0 for host in self.hosts)

        wait_until(reachable, "sshd on 127.0.0.1 reachable as " + " and ".join(self.hosts), 30,
                   diagnose=lambda: tail(self.root / "sshd.log"))

    def ssh(self, host: str, *command: str) -> subprocess.CompletedProcess:
        return processes.run([str(self.bin / "ssh"), host, *command], capture_output=True, text=True, timeout=30)

    def stop(self) -> None:
        """Stop the server and whatever still runs in its sessions (a run that failed midway)."""
        if self._sshd is None:
            return
        import psutil

        with_children = []
        try:
            with_children = psutil.Process(self._sshd.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        stop(self._sshd)
        for child in with_children:
            try:
                child.terminate()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(with_children, timeout=10)


@pytest.fixture(scope="module")
def ssh_nodes(tmp_path_factory):
    need_system("/usr/sbin/sshd", "ssh", "ssh-keygen", "pdsh")
    with started(SSHNodes(tmp_path_factory.mktemp("ssh"))) as nodes:
        yield nodes


# ----------------------------------------------------------------------------------------------- reference run

@pytest.fixture(scope="session")
def two_rank_reference(sample_dataset, tmp_path_factory) -> dict[int, float]:
    """The tiny run on two processes under torchrun on this machine: the loss of every step."""
    out = tmp_path_factory.mktemp("reference") / "run"
    result = launch("torchrun", 2, tiny_run(sample_dataset, out))
    assert result.returncode == 0, result.stdout[-4000:]
    return losses(out)


def summary(run_dir: pathlib.Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
