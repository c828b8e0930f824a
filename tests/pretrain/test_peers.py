"""After a collective timed out, a rank names the peers it lost (``pretrain.peers.unanswered_peers``): the ranks
that never answer in the rendezvous store, with their hosts, or the store's own host when the store does not answer."""
import os
import threading

from pretrain import peers


class Store:
    """The calls of torch's TCPStore that the check makes, over a dict; ``hang`` makes every call block."""

    def __init__(self, values=(), hang=False):
        self.values, self.hang = dict(values), threading.Event() if hang else None

    def _maybe_hang(self):
        if self.hang is not None:
            self.hang.wait()

    def set_timeout(self, timeout):
        pass

    def set(self, key, value):
        self._maybe_hang()
        self.values[key] = value.encode()

    def check(self, keys):
        self._maybe_hang()
        return all(k in self.values for k in keys)

    def get(self, key):
        return self.values[key]


def test_ranks_that_never_answer_are_named_with_their_hosts(monkeypatch):
    hosts = {f"bert_pipeline/host/{r}": f"node-{r} (10.0.0.{r})".encode() for r in range(4)}
    answered = {"bert_pipeline/answered/2": b"1"}
    monkeypatch.setattr(peers, "_store", lambda: Store({**hosts, **answered}))
    monkeypatch.setattr(peers, "own_host", lambda: "node-0 (10.0.0.0)")
    line = peers.unanswered_peers(0, 4, timeout_minutes=0.25)
    assert line == ("rank 1 on node-1 (10.0.0.1); rank 3 on node-3 (10.0.0.3) did not answer node-0 (10.0.0.0) "
                    "within 10 s (unreachable, stopped or hung)")


def test_every_rank_answering_points_at_a_link_between_ranks(monkeypatch):
    monkeypatch.setattr(peers, "_store", lambda: Store({"bert_pipeline/answered/1": b"1"}))
    assert peers.unanswered_peers(0, 2, 0.25).startswith("every rank still reaches the rendezvous store")


def test_a_store_that_does_not_answer_names_its_host(monkeypatch):
    store = Store(hang=True)
    monkeypatch.setattr(peers, "_store", lambda: store)
    monkeypatch.setattr(peers, "own_host", lambda: "host-b (10.77.0.2)")
    monkeypatch.setitem(os.environ, "MASTER_ADDR", "10.77.0.1")
    monkeypatch.setitem(os.environ, "MASTER_PORT", "29500")
    try:
        line = peers.unanswered_peers(1, 2, 0.25)
    finally:
        store.hang.set()
    assert line.startswith("the job's rendezvous store at 10.77.0.1:29500 does not answer host-b (10.77.0.2)")


def test_ranks_by_host_are_written_as_ranges():
    assert peers._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
