"""Which peers a rank can reach, told through the job's rendezvous store rather than the collectives' links.

Each rank leaves its host in the store at start-up (rank 0 logs where the ranks run); after a collective timed out,
``unanswered_peers`` names the ranks that do not answer, with their hosts, or the store's host when the store itself
is out of reach. The store is one TCP connection from each rank to one host, apart from the ranks' own links, so it
tells a rank that cannot be reached from one that stopped. Only torch's store is used here: no DeepSpeed.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

# Keys in the job's rendezvous store (torch's TCPStore, at MASTER_ADDR:MASTER_PORT): each rank's host, and, after a
# collective timed out, the ranks that still answer. The store is one TCP connection from each rank to one host,
# apart from the ranks' own links, so it tells a rank that cannot be reached from one that stopped.
_HOST_KEY, _ANSWER_KEY = "bert_pipeline/host/", "bert_pipeline/answered/"


def _store():
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def own_host() -> str:
    """This machine as the job sees it: its host name and the address that name resolves to (where gloo binds)."""
    name = socket.gethostname()
    try:
        return f"{name} ({socket.gethostbyname(name)})"
    except OSError:
        return f"{name} (unresolved)"


def record_host(rank: int, world: int, timeout: timedelta) -> None:
    """Each rank leaves its host in the store; rank 0 logs where the ranks run (one line)."""
    store = _store()
    store.set(f"{_HOST_KEY}{rank}", own_host())
    if rank != 0:
        return
    keys = [f"{_HOST_KEY}{r}" for r in range(world)]
    store.wait(keys, timeout)
    by_host: dict[str, list[int]] = {}
    for r, key in enumerate(keys):
        by_host.setdefault(store.get(key).decode(), []).append(r)
    from pretrain.monitor import log

    log.info(f"{world} ranks on {len(by_host)} host{'s' if len(by_host) > 1 else ''}: " + "; ".join(
        f"{host} rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}" for host, ranks in by_host.items()))


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def unanswered_peers(rank: int, world: int, timeout_minutes: float) -> str:
    """After a collective timed out: which peers this rank cannot reach, as a clause for the error line.

    Every rank that gets here says so in the rendezvous store and waits a while (a tenth of the collective timeout,
    10-60 s) for the others. Ranks that never answer are named with their hosts (stopped, hung, or cut off from the
    store's host); when the store itself does not answer, its host (MASTER_ADDR) is the peer this rank lost. The
    store is asked from a thread given up after the window: a store client over a dead link can block without end.
    """
    window = min(60.0, max(10.0, timeout_minutes * 6))
    found: dict = {}

    def ask() -> None:
        store = _store()
        store.set_timeout(timedelta(seconds=window))
        store.set(f"{_ANSWER_KEY}{rank}", "1")
        deadline = time.monotonic() + window
        missing = [r for r in range(world) if r != rank]
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([f"{_ANSWER_KEY}{r}"])]
            if missing:
                time.sleep(0.5)
        found.update({r: store.get(f"{_HOST_KEY}{r}").decode() if store.check([f"{_HOST_KEY}{r}"])
                      else "an unknown host" for r in missing}, done=True)

    asking = threading.Thread(target=ask, name="peer-check", daemon=True)
    asking.start()
    asking.join(window + 5)
    if not found.pop("done", False):  # it failed, or still waits on the store
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        return (f"the job's rendezvous store at {where} does not answer {own_host()}: that host "
                f"(rank 0's, or the rendezvous endpoint's) is unreachable from here")
    if not found:
        return "every rank still reaches the rendezvous store: a link between two ranks failed, or a rank hung"
    return "; ".join(f"rank {r} on {host}" for r, host in found.items()) + (
        f" did not answer {own_host()} within {window:.0f} s (unreachable, stopped or hung)")


__all__ = ["own_host", "record_host", "unanswered_peers"]
