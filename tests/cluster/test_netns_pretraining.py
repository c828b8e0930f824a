"""Pretraining across hosts on a (virtual) network: two network namespaces, each with its own address, host name and
sshd (``tests/cluster/netns.py``), one rank on each. Launched by the DeepSpeed launcher (hostfile, pdsh over ssh)
and by torchrun's c10d rendezvous, the run equals the same run's two ranks on one host bit for bit: every step's loss,
the final checkpoint's weights and the Hugging Face export."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from pretrain import checkpoints
from tests.cluster import multihost
from tests.cluster.multihost import STEPS, deepspeed_command, run_args
from tests.pretrain.launching import environment, free_port

pytest_plugins = ["tests.cluster.multihost"]
pytestmark = pytest.mark.slow


def test_deepspeed_launcher_trains_across_two_hosts_like_one_host(hosts, sample_dataset, one_host_reference,
                                                                  tmp_path):
    out = tmp_path / "run"
    result = hosts.run("host-a", deepspeed_command(hosts, tmp_path, run_args(sample_dataset, out)), cwd=tmp_path,
                       timeout=300, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=environment(PATH=hosts.path))
    assert result.returncode == 0, result.stdout[-5000:]
    # No --master_addr: the launcher asked host-a for its address (ssh host-a hostname -I) and every rank met there.
    assert f"Using IP address of {hosts.address['host-a']} for node host-a" in result.stdout, result.stdout[-3000:]
    for host in hosts.names:  # pdsh prefixes each remote line with its host
        assert any(line.startswith(f"{host}: ") for line in result.stdout.splitlines()), host
    assert "micro-batch 16 x 2 ranks x 1 accumulation" in result.stdout
    multihost.assert_same_run(out, one_host_reference)
    assert multihost.rank_hosts(result.stdout) == {0: ("host-a", hosts.address["host-a"]),
                                                   1: ("host-b", hosts.address["host-b"])}


def test_torchrun_c10d_rendezvous_trains_across_two_hosts_like_one_host(hosts, sample_dataset, one_host_reference,
                                                                        tmp_path):
    out = tmp_path / "run"
    port = free_port()
    agents = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"host-a:{port}", "--rdzv_id", f"netns-{port}",
               multihost.RUN, "--config", multihost.TINY, *run_args(sample_dataset, out)] for _ in hosts.names]
    outputs = multihost.run_on_hosts(hosts, dict(zip(hosts.names, agents)), timeout=300, cwd=tmp_path,
                                     env=environment())
    for host, (status, output) in outputs.items():
        assert status == 0, f"{host}:\n{output[-4000:]}"
    multihost.assert_same_run(out, one_host_reference)
    # c10d gives out ranks in the order the agents joined: whichever way, one rank ran on each host.
    ranks = multihost.rank_hosts("\n".join(output for _, output in outputs.values()))
    assert sorted(ranks.values()) == [(h, hosts.address[h]) for h in hosts.names]
    assert checkpoints.newest(out / "checkpoints").info["world_size"] == 2


CUT_AT = 6              # the step after which a link goes down (of STEPS = 24)
TIMEOUT_MINUTES = 0.25  # faults.timeout_minutes of the fault tests: 15 s
MARGIN_S = 60           # a rank's exit after the collective timeout: the peers' answers (10 s), then its error line


@pytest.mark.exclusive  # it bounds the ranks' exit by the wall clock
def test_a_link_down_mid_step_stops_every_rank_naming_the_peer_and_resume_continues_bitwise(
        hosts, sample_dataset, one_host_reference, tmp_path):
    out, logs = tmp_path / "run", tmp_path / "rank-logs"
    args = run_args(sample_dataset, out, **{"faults.timeout_minutes": TIMEOUT_MINUTES})
    launcher_log = tmp_path / "launcher.log"
    try:
        with open(launcher_log, "w") as log, hosts.started(
                "host-a", deepspeed_command(hosts, tmp_path, args, "--enable_each_rank_log", str(logs)),
                cwd=tmp_path, env=environment(PATH=hosts.path), stdout=log, stderr=subprocess.STDOUT) as launcher:
            multihost.wait_for_step(out, CUT_AT, launcher, launcher_log)
            ranks = {host: multihost.ranks_on(hosts, host) for host in hosts.names}
            assert all(len(found) == 1 for found in ranks.values()), ranks
            hosts.unplug("host-b")
            cut = time.monotonic()
            exits = {}
            for host, (rank,) in ranks.items():
                psutil.wait_procs([rank], timeout=TIMEOUT_MINUTES * 60 + MARGIN_S)
                exits[host] = time.monotonic() - cut
            status = launcher.wait(timeout=MARGIN_S)
    finally:
        hosts.plug("host-b")
        hosts.settle()
    print(f"link down at step {CUT_AT}: ranks exited after {exits} s (timeout {TIMEOUT_MINUTES * 60:.0f} s); "
          f"launcher exit {status}")
    assert all(not rank.is_running() for found in ranks.values() for rank in found), exits
    assert status != 0, launcher_log.read_text()[-3000:]
    # Each rank's last line names the peer it lost: host-b's rank the store's host (host-a), host-a's rank host-b's.
    a, b = (hosts.address[h] for h in hosts.names)
    lines = {r: multihost.error_line(logs, r) for r in (0, 1)}
    assert f"rank 1 on host-b ({b}) did not answer host-a ({a})" in lines[0], lines[0]
    assert f"rendezvous store at {a}:" in lines[1] and "does not answer host-b" in lines[1], lines[1]
    # No half-written checkpoint counts: the marked ones verify, and the export never began.
    marked = checkpoints.complete(out / "checkpoints")
    assert marked and all(checkpoints.verify(c) >= 0 for c in marked)
    assert not (out / "hf").exists() and not (out / "hf.partial").exists()
    # The link is back: --resume from the newest complete checkpoint ends where the uninterrupted run does.
    resumed = hosts.run("host-a", deepspeed_command(hosts, tmp_path, ["--resume", *args]), cwd=tmp_path,
                        timeout=300, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        env=environment(PATH=hosts.path))
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"at step {marked[-1].step} " in resumed.stdout
    multihost.assert_same_run(out, one_host_reference)


SLOW_RATE, SLOW_STEPS = "20mbit", 3  # ~13 MB cross the link each step (bf16 gradients and weights): seconds a step
LOSS_PERCENT = 2  # of host-b's packets dropped each way meanwhile: TCP resends them (a retransmit timeout each)


def test_a_slow_lossy_link_trains_to_the_same_result(hosts, sample_dataset, one_host_reference, tmp_path):
    """host-b's link rate-limited both ways (tbf) and dropping LOSS_PERCENT % of its packets (nftables) for the first
    steps, then freed for the rest: TCP resends what was lost and the run equals the one-host run bit for bit. The
    step times are printed, not asserted."""
    out = tmp_path / "run"
    launcher_log = tmp_path / "launcher.log"
    hosts.throttle("host-b", SLOW_RATE)
    hosts.lose("host-b", LOSS_PERCENT)
    try:
        with open(launcher_log, "w") as log, hosts.started(
                "host-a", deepspeed_command(hosts, tmp_path, run_args(sample_dataset, out)), cwd=tmp_path,
                env=environment(PATH=hosts.path), stdout=log, stderr=subprocess.STDOUT) as launcher:
            multihost.wait_for_step(out, SLOW_STEPS, launcher, launcher_log, timeout=400)
            hosts.unthrottle("host-b")
            dropped = hosts.unlose("host-b")
            status = launcher.wait(timeout=300)
    finally:
        hosts.unthrottle("host-b")
        hosts.unlose("host-b")
        hosts.settle()
    assert status == 0, launcher_log.read_text()[-4000:]
    assert dropped > 0  # the loss was met, not dodged
    multihost.assert_same_run(out, one_host_reference)
    slow, fast = multihost.step_seconds(out, 2, SLOW_STEPS), multihost.step_seconds(out, SLOW_STEPS + 2, STEPS)
    print(f"median step time over a {SLOW_RATE} link losing {LOSS_PERCENT} % ({dropped} packets dropped; steps "
          f"2-{SLOW_STEPS}): {slow:.2f} s; "
          f"unlimited (steps {SLOW_STEPS + 2}-{STEPS}): {fast:.2f} s; one host: "
          f"{multihost.step_seconds(one_host_reference.run):.2f} s")


@pytest.mark.exclusive  # it bounds the job's end by the wall clock
def test_a_host_that_vanishes_ends_the_job_as_a_killed_rank_does_and_resume_continues_bitwise(
        hosts, sample_dataset, one_host_reference, tmp_path):
    """Every process of host-b killed at once (its rank, its launcher's part, its sshd): the connections close, so
    host-a's rank fails at once, long before faults.timeout_minutes (5 here), and the launcher exits non-zero."""
    out = tmp_path / "run"
    args = run_args(sample_dataset, out, **{"faults.timeout_minutes": 5})
    launcher_log = tmp_path / "launcher.log"
    try:
        with open(launcher_log, "w") as log, hosts.started(
                "host-a", deepspeed_command(hosts, tmp_path, args), cwd=tmp_path, env=environment(PATH=hosts.path),
                stdout=log, stderr=subprocess.STDOUT) as launcher:
            multihost.wait_for_step(out, CUT_AT, launcher, launcher_log)
            (rank,) = multihost.ranks_on(hosts, "host-a")
            assert multihost.ranks_on(hosts, "host-b")
            assert hosts.vanish("host-b")
            gone = time.monotonic()
            status = launcher.wait(timeout=120)
            psutil.wait_procs([rank], timeout=30)
            ended = time.monotonic() - gone
    finally:
        hosts.settle()
        hosts.restart_ssh("host-b")
    print(f"host-b vanished at step {CUT_AT}: the launcher exited {status} after {ended:.1f} s")
    assert status != 0 and not rank.is_running(), launcher_log.read_text()[-3000:]
    assert ended < 5 * 60, "host-a's rank waited for the collective timeout"  # it did not wait for the timeout
    marked = checkpoints.complete(out / "checkpoints")
    assert marked and all(checkpoints.verify(c) >= 0 for c in marked)
    assert not (out / "hf").exists() and not (out / "hf.partial").exists()
    resumed = hosts.run("host-a", deepspeed_command(hosts, tmp_path, ["--resume", *args]), cwd=tmp_path,
                        timeout=300, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        env=environment(PATH=hosts.path))
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"at step {marked[-1].step} " in resumed.stdout
    multihost.assert_same_run(out, one_host_reference)
