"""Hosts on a virtual network, for multi-host tests on one machine: each host a network namespace with its own
address, host name and sshd, all joined to one switch (a bridge in a namespace of its own) by veth cables.

    with Hosts(tmp_path / "hosts", count=2) as hosts:       # host-a 10.77.0.1, host-b 10.77.0.2
        hosts.run("host-a", ["deepspeed", "--hostfile", ...], timeout=300, env=...)
        hosts.unplug("host-b")                               # its cable pulled at the switch
        hosts.throttle("host-b", "4mbit")                    # tbf on its switch port
        hosts.vanish("host-b")                               # every process in its namespace killed

What a host is made of:

* a network namespace ``<prefix>-<letter>`` (``ip netns``) whose ``eth0`` is one end of a veth pair; the other end,
  ``port-<letter>``, is enslaved to the bridge ``br0`` in the switch namespace ``<prefix>-sw``, so no interface of
  the test machine's own namespace is touched and two test sessions (random prefixes) never share a network;
* a host name in a UTS namespace of its own (``unshare --uts``), set before anything runs there, so a process on
  ``host-b`` sees ``gethostname() == "host-b"`` (gloo binds to the address its host name resolves to);
* ``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts`` for everything started in
  the namespace: every host's name resolves to its address there (and to nothing else);
* an sshd listening on the host's address, port 22 (each namespace has its own ports), with its own host key; a
  client config made here (``bin/ssh`` reads it) reaches every host by name with one user key, strict host-key
  checking and keep-alives, so that an ssh session over a dead link ends in seconds instead of TCP's ~15 minutes.

The file system is shared, as on a cluster with a shared file system. ``close()`` (also on an error while starting,
and at the end of the ``with``) kills every process left in each namespace (``ip netns pids``), then deletes the
namespaces and their ``/etc/netns`` entries; the sshd daemons die with pytest (parent-death signal) if it is
killed. ``Hosts.available()`` says why the machine cannot make namespaces (not root, no ``ip``, a kernel without
network namespaces), for a test to fail on in CI and skip elsewhere (``need_hosts``).
PYTEST_DONT_REWRITE
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
import secrets
import shutil
import signal
import string
import subprocess
import time

from common import processes
from tests.cluster.live import daemon, stop, tail, wait_until

SUBNET = "10.77.0"   # host i (0-based) is SUBNET.(i + 1)/24; each test's switch is a network of its own
SSH_ALIVE = (2, 5)   # ssh keep-alive every 2 s, given up after 5 unanswered: a dead link ends a session in ~10 s

LOSS_TABLE = "bert_pipeline_loss"  # the nftables table of ``Hosts.lose``


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = processes.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


class Hosts:
    """``count`` hosts (``host-a``, ``host-b``, ...) on one switch; see the module's docstring."""

    def __init__(self, root: pathlib.Path, count: int = 2):
        if not 1 <= count <= 26:
            raise ValueError("between 1 and 26 hosts")
        self.root = pathlib.Path(root)
        self.prefix = "bp" + secrets.token_hex(3)        # 8 characters: namespace and /etc/netns names
        self.names = [f"host-{letter}" for letter in string.ascii_lowercase[:count]]
        self.address = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(self.names)}
        self.bin = self.root / "bin"
        self.client_config = self.root / "ssh_config"
        self.switch = f"{self.prefix}-sw"
        self._made: list[str] = []                          # namespaces made, deleted in reverse
        self._sshd: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------------------------------- set-up
    @staticmethod
    def available() -> str | None:
        """None when this machine can make the hosts, else why not (one line)."""
        missing = [p for p in ("ip", "unshare", "tc", "ssh", "ssh-keygen", "pdsh") if shutil.which(p) is None]
        if not os.access("/usr/sbin/sshd", os.X_OK):
            missing.append("/usr/sbin/sshd")
        if missing:
            return f"{', '.join(missing)} not installed: run `bash scripts/test_services.sh` as root"
        if os.geteuid() != 0:
            return "network namespaces (ip netns add) need root"
        probe = f"bpprobe{secrets.token_hex(2)}"
        made = _ip("netns", "add", probe, check=False)
        _ip("netns", "del", probe, check=False)
        if made.returncode != 0:
            return f"this kernel or container refuses network namespaces: ip netns add: {made.stderr.strip()}"
        return None

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host.removeprefix('host-')}"

    def port(self, host: str) -> str:
        return f"port-{host.removeprefix('host-')}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.bin.mkdir(exist_ok=True)
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for host in self.names:
            ns = self.namespace(host)
            self._add_namespace(ns)
            etc = pathlib.Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
                f"{address} {name}\n" for name, address in self.address.items()))
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", self.port(host),
                "netns", self.switch)
            _ip("-n", self.switch, "link", "set", self.port(host), "master", "br0")
            _ip("-n", self.switch, "link", "set", self.port(host), "up")
            _ip("-n", ns, "addr", "add", f"{self.address[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        self._start_ssh()

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def _start_ssh(self) -> None:
        user_key = self.root / "id_ed25519"
        self._keygen(user_key)
        (self.root / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
        known = []
        pathlib.Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for host in self.names:
            host_key = self.root / f"{host}_host_ed25519"
            self._keygen(host_key)
            kind, key = host_key.with_suffix(".pub").read_text().split()[:2]
            known.append(f"{host},{self.address[host]} {kind} {key}\n")
            config = self.root / f"{host}_sshd_config"
            config.write_text("\n".join([
                "Port 22", f"ListenAddress {self.address[host]}", f"HostKey {host_key}",
                f"PidFile {self.root / f'{host}_sshd.pid'}", f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password", f"AllowUsers {os.environ.get('USER') or 'root'}",
                "UsePAM no", "StrictModes no", "PrintMotd no", "X11Forwarding no", "LogLevel ERROR",
                f"ClientAliveInterval {SSH_ALIVE[0]}", f"ClientAliveCountMax {SSH_ALIVE[1]}",
            ]) + "\n")
            self._sshd[host] = daemon(self.on(host, ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)]),
                                      self.root / f"{host}_sshd.log")
        (self.root / "known_hosts").write_text("".join(known))
        self.client_config.write_text("\n".join([
            f"Host {' '.join(self.names)}", f"  IdentityFile {user_key}", "  IdentitiesOnly yes", "  BatchMode yes",
            f"  UserKnownHostsFile {self.root / 'known_hosts'}", "  StrictHostKeyChecking yes", "  LogLevel ERROR",
            "  ConnectTimeout 10", f"  ServerAliveInterval {SSH_ALIVE[0]}", f"  ServerAliveCountMax {SSH_ALIVE[1]}",
        ]) + "\n")
        wrapper = self.bin / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {self.client_config} "$@"\n')
        wrapper.chmod(0o755)

        def reachable():
            for host, sshd in self._sshd.items():
                assert sshd.poll() is None, tail(self.root / f"{host}_sshd.log")
            first = self.names[0]
            return all(self.ssh(first, host, "hostname").stdout.strip() == host for host in self.names)

        wait_until(reachable, f"sshd on every host reachable from {self.names[0]}", 30,
                   diagnose=lambda: "\n".join(tail(self.root / f"{h}_sshd.log") for h in self.names))

    @staticmethod
    def _keygen(path: pathlib.Path) -> None:
        processes.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bert-pipeline-test", "-f", str(path)],
                      check=True, capture_output=True, timeout=60)

    # ------------------------------------------------------------------------------------------- use
    def on(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` as a command that runs on ``host``: in its network namespace (and its /etc/hosts), under its
        host name, with this machine's file system."""
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "sh", "-c",
                f'hostname {host} && exec "$@"', "sh", *argv]

    @property
    def path(self) -> str:
        """A PATH whose ``ssh`` is the one that reaches the hosts (for pdsh and the DeepSpeed launcher)."""
        return f"{self.bin}{os.pathsep}{os.environ['PATH']}"

    def run(self, host: str, argv: list[str], *, timeout: float, **popen_arguments) -> subprocess.CompletedProcess:
        """``argv`` run on ``host`` to completion (``common.processes.run``: its session killed on timeout)."""
        return processes.run(self.on(host, argv), timeout=timeout, **popen_arguments)

    def started(self, host: str, argv: list[str], **popen_arguments):
        """``argv`` started on ``host`` (``common.processes.started``: its session killed on leaving)."""
        return processes.started(self.on(host, argv), **popen_arguments)

    def ssh(self, source: str, target: str, *command: str) -> subprocess.CompletedProcess:
        """``command`` run on ``target`` over ssh from ``source``."""
        return self.run(source, [str(self.bin / "ssh"), target, *command], timeout=30, capture_output=True,
                        text=True)

    def pids(self, host: str) -> list[int]:
        """The processes running on ``host`` (in its network namespace), its sshd included."""
        listed = _ip("netns", "pids", self.namespace(host), check=False).stdout.split()
        return [int(p) for p in listed if p.isdigit()]

    # ------------------------------------------------------------------------------------------- faults
    def unplug(self, host: str) -> None:
        """Pull ``host``'s cable at the switch (its port down): no packet in or out, no error sent to anyone."""
        _ip("-n", self.switch, "link", "set", self.port(host), "down")

    def plug(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.port(host), "up")

    def throttle(self, host: str, rate: str, burst: str = "32kbit", latency: str = "400ms") -> None:
        """Limit what reaches ``host`` to ``rate`` (token bucket on its switch port, e.g. "4mbit"), and what it sends
        likewise (on its own eth0)."""
        for ns, dev in ((self.switch, self.port(host)), (self.namespace(host), "eth0")):
            result = processes.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                                    "rate", rate, "burst", burst, "latency", latency],
                                   capture_output=True, text=True, timeout=30)
            if result.returncode != 0:
                raise AssertionError(f"tc tbf on {ns}/{dev} failed: {result.stderr.strip()}")

    def unthrottle(self, host: str) -> None:
        for ns, dev in ((self.switch, self.port(host)), (self.namespace(host), "eth0")):
            processes.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True,
                          timeout=30)

    def lose(self, host: str, percent: int) -> None:
        """Drop ``percent`` % of the packets ``host`` receives and sends, at random (nftables' ``numgen``: netem is
        not in this kernel)."""
        drop = f"numgen random mod 100 < {percent} counter drop"
        rules = (f"table inet {LOSS_TABLE} {{\n"
                 f"  chain inbound {{ type filter hook input priority 0; {drop}; }}\n"
                 f"  chain outbound {{ type filter hook output priority 0; {drop}; }}\n"
                 "}\n")
        result = processes.run(["ip", "netns", "exec", self.namespace(host), "nft", "-f", "-"], input=rules,
                               capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise AssertionError(f"nft on {self.namespace(host)} failed: {result.stderr.strip()} (the nftables "
                                 "package: scripts/test_services.sh installs it)")

    def unlose(self, host: str) -> int:
        """Stop dropping ``host``'s packets; how many were dropped (0 when nothing was set)."""
        listed = processes.run(["ip", "netns", "exec", self.namespace(host), "nft", "list", "table", "inet",
                                LOSS_TABLE], capture_output=True, text=True, timeout=30).stdout
        processes.run(["ip", "netns", "exec", self.namespace(host), "nft", "delete", "table", "inet", LOSS_TABLE],
                      capture_output=True, timeout=30)
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", listed))

    def vanish(self, host: str) -> list[int]:
        """Kill every process on ``host`` at once (SIGKILL), as a machine that loses power: its ranks, its
        launcher's part and its sshd. Returns their ids."""
        killed = self.pids(host)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return killed

    def settle(self) -> None:
        """Kill whatever a test left running on the hosts (a launcher's remote part, a rank), keeping their sshd."""
        keep = {proc.pid for proc in self._sshd.values()}
        for host in self.names:
            for pid in self.pids(host):
                if pid not in keep:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def restart_ssh(self, host: str) -> None:
        """Start ``host``'s sshd again (after ``vanish``), on its old configuration and keys."""
        stop(self._sshd[host])
        self._sshd[host] = daemon(self.on(host, ["/usr/sbin/sshd", "-D", "-e", "-f",
                                                 str(self.root / f"{host}_sshd_config")]),
                                  self.root / f"{host}_sshd.log")
        wait_until(lambda: self.ssh(self.names[0], host, "true").returncode == 0, f"sshd on {host} again", 30,
                   diagnose=lambda: tail(self.root / f"{host}_sshd.log"))

    # ------------------------------------------------------------------------------------------- tear-down
    def close(self) -> None:
        """Kill what runs on the hosts, stop the sshd daemons, delete the namespaces and their /etc/netns."""
        for host in self.names:
            if self.namespace(host) in self._made:
                self.vanish(host)
        for sshd in self._sshd.values():
            stop(sshd)
        deadline = time.monotonic() + 30
        for host in self.names:
            while self.namespace(host) in self._made and self.pids(host) and time.monotonic() < deadline:
                self.vanish(host)
                time.sleep(0.2)
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(pathlib.Path("/etc/netns") / ns, ignore_errors=True)
        self._made.clear()

    def __enter__(self) -> Hosts:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def leftovers(prefix: str) -> list[str]:
    """The namespaces and ``/etc/netns`` entries of the hosts made under ``prefix`` that still exist."""
    listed = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    etc = [f"/etc/netns/{p.name}" for p in pathlib.Path("/etc/netns").glob(f"{prefix}-*")]
    return [ns for ns in listed if ns.startswith(f"{prefix}-")] + etc
