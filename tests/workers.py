"""How the suite shares one machine between pytest-xdist workers (``scripts/test.sh`` runs ``-n 2``).

Much of the suite waits on single-threaded work (interpreter and torch start-up, TorchInductor's code generation,
Beam's DirectRunner, pip), so a second worker fills the other core. Two rules keep that safe:

* **Files stay whole.** Every test joins the ``xdist_group`` of its file (``--dist loadgroup`` then sends whole
  files to a worker, as ``loadfile`` would), so module fixtures (a finetuning setup of a minute and a half, the live
  Slurm jobs) are built once; ``MERGED`` puts files that share session fixtures or machine-wide services in one
  group.
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


def group_by_file(items: list[pytest.Item], root: pathlib.Path) -> None:
    """Give every test without an ``xdist_group`` its file's (or its merged group's) name."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = pathlib.Path(str(item.path)).resolve().relative_to(root).as_posix()
            item.add_marker(pytest.mark.xdist_group(MERGED.get(path, path)))


LOCKS = "BERT_PIPELINE_TEST_LOCKS"  # the directory of this run's lock files, made by the controller


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
