"""How the suite shares one machine between pytest-xdist workers (``scripts/test.sh`` runs ``-n 2``).

Much of the suite waits on single-threaded work (interpreter and torch start-up, TorchInductor's code generation,
Beam's DirectRunner, pip), so a second worker fills the other core. Two rules keep that safe:

* **Shared fixtures stay whole.** A test that uses a module-scoped fixture joins the ``xdist_group`` of its file
  (``--dist loadgroup`` sends a group to one worker), so that fixture (a finetuning setup of a minute and a half, the
  live Slurm jobs) is built once; ``MERGED`` puts files that share machine-wide services in one group. Every other
  test goes to whichever worker is free.
* **The cores are shared out.** Each worker's ``OMP_NUM_THREADS`` is its share of the cores.
* **Some tests run alone.** A test marked ``exclusive`` waits until the other workers have finished their current
  test and keeps them waiting until it ends: it needs most of the memory (BERT-Large), bounds its own wall time
  (a fault must end a job within N seconds), or drives services every worker would share (Slurm, sshd). The lock
  is writer-preferring (a turnstile in front of a shared/exclusive ``flock``), so an exclusive test is not starved
  by the other worker's stream of shared ones.

Without xdist (plain ``pytest``) none of this applies: the lock is skipped and the groups are ignored.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import tempfile

import pytest

# Files that share a session fixture (``two_rank_reference``) and the machine's Slurm and sshd services.
MERGED = {
    "tests/cluster/test_slurm_live.py": "live-cluster",
    "tests/cluster/test_multinode_ssh.py": "live-cluster",
}


# Files whose tests run longest on one worker while waiting on pip and whole commands (fresh virtual environments,
# the demo): run first, so they overlap the rest of the suite instead of ending it with the other worker idle.
FIRST = ("tests/test_demo.py", "tests/test_extras.py")


def front_load(items: list[pytest.Item], root: pathlib.Path) -> None:
    """Put the tests of ``FIRST`` first, in that order, the rest as collected (the same order on every worker,
    as xdist requires)."""
    def rank(item: pytest.Item) -> int:
        path = pathlib.Path(str(item.path)).resolve().relative_to(root).as_posix()
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items[:] = sorted(items, key=rank)  # stable: the collected order within each rank


def group_by_file(items: list[pytest.Item], root: pathlib.Path) -> None:
    """Give every test that uses a fixture shared beyond one test (module, class or package scope) its file's (or
    its merged group's) ``xdist_group``, so that fixture is built once; the others stay free, so the two workers
    balance to the end instead of one finishing a long file alone."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = pathlib.Path(str(item.path)).resolve().relative_to(root).as_posix()
        if path in MERGED or _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(MERGED.get(path, path)))


def _shares_a_fixture(item: pytest.Item) -> bool:
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d.scope in ("module", "class", "package") for defs in definitions.values() for d in defs)


LOCKS = "BERT_PIPELINE_TEST_LOCKS"  # the directory of this run's lock files, made by the controller


def threads_per_worker(cpus: int, workers: int) -> int:
    """Threads each worker's torch (and the children it starts) may use: the cores shared out, at least one."""
    return max(1, cpus // max(1, workers))


def share_the_cores(config: pytest.Config) -> None:
    """In an xdist worker, before torch is imported: ``OMP_NUM_THREADS`` set to this worker's share of the cores
    (children inherit it; a launcher's ranks set their own). Two workers of two threads each on two cores run
    OpenMP's spinning threads over each other: an in-process training test took twice as long beside another."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        threads = threads_per_worker(len(os.sched_getaffinity(0)), int(workerinput["workercount"]))
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def open_locks(config: pytest.Config) -> None:
    """In the controller of an xdist run: a directory for the lock files, named to the workers it starts next
    through their inherited environment."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        os.environ[LOCKS] = tempfile.mkdtemp(prefix="bert-pipeline-test-locks-")


def close_locks(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and os.environ.get(LOCKS):
        shutil.rmtree(os.environ.pop(LOCKS), ignore_errors=True)


@contextlib.contextmanager
def machine_share(item: pytest.Item):
    """Hold this worker's share of the machine for ``item``'s whole run (setup, call, teardown): shared, or the
    whole machine for an ``exclusive`` test. A no-op outside an xdist worker."""
    locks = os.environ.get(LOCKS)
    if not (locks and os.environ.get("PYTEST_XDIST_WORKER")):
        yield
        return
    exclusive = item.get_closest_marker("exclusive") is not None
    with open(os.path.join(locks, "turnstile"), "a") as turnstile, open(os.path.join(locks, "share"), "a") as share:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # an exclusive test waiting here keeps new shared ones out
        fcntl.flock(share, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(share, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
