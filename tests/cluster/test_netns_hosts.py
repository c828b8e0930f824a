"""The virtual hosts of the multi-host tests (``tests/cluster/netns.py``): each has its own address, host name and
sshd, reaches the others by name, and nothing of them (namespaces, /etc/netns entries, processes) outlives the
``with`` block, also when the block fails."""
import subprocess

import psutil
import pytest

from tests.cluster.live import need
from tests.cluster.netns import Hosts, leftovers
from tests.live_processes import alive


@pytest.fixture
def can_make_hosts():
    reason = Hosts.available()
    need(reason is None, f"the multi-host tests cannot make hosts: {reason}")


def test_three_hosts_each_with_its_own_name_address_and_sshd_and_nothing_left_after_a_failure(can_make_hosts,
                                                                                               tmp_path):
    with pytest.raises(RuntimeError, match="the test failed here"):
        with Hosts(tmp_path, count=3) as hosts:
            prefix = hosts.prefix
            for source in hosts.names:
                for target in hosts.names:
                    # over ssh, by name: the target's own host name, its address (hostname -I) and its view of a peer
                    result = hosts.ssh(source, target, "hostname; hostname -I; getent hosts host-a")
                    assert result.returncode == 0, result.stderr
                    name, addresses, peer = result.stdout.splitlines()
                    assert (name, addresses.split()) == (target, [hosts.address[target]])
                    assert peer.split() == [hosts.address["host-a"], "host-a"]
            # a link down cuts one host off; back up, it answers again
            hosts.unplug("host-c")
            assert hosts.ssh("host-a", "host-c", "true").returncode == 255
            assert hosts.ssh("host-a", "host-b", "true").returncode == 0
            hosts.plug("host-c")
            assert hosts.ssh("host-a", "host-c", "true").returncode == 0
            # something left running on a host, as a crashed test would leave it
            with hosts.started("host-b", ["sleep", "600"], stdout=subprocess.DEVNULL) as sleeper:
                # a process may end between being listed and being looked at (a race, not a leak)
                running = alive(pid for host in hosts.names for pid in hosts.pids(host))
                assert sleeper.pid in {p.pid for p in running} and len(running) >= 4  # 3 sshd and the sleeper
                raise RuntimeError("the test failed here")
    assert not leftovers(prefix)
    gone, left = psutil.wait_procs(running, timeout=10)
    assert not left, left
