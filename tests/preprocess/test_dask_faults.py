"""A Dask cluster that fails under a run (issue 35, item 4): a worker killed once (Dask reschedules its tasks; the
stages' files are rewritten whole, so the shards are byte-identical to the DirectRunner's), workers killed each time
one comes up (KilledWorker: one line, nothing published), the scheduler killed (one line, nothing published).

The faults are injected from outside, as they happen: the test watches the run's work directory and the scheduler
(``Client.processing``) and SIGKILLs a worker process (its nanny starts a new one) or the scheduler itself.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from common import processes
from tests.disk_faults import one_error_line
from tests.preprocess.conftest import REPO_ROOT, read_manifest, run_cli, shard_hashes
from tests.preprocess.servers import _wait_for, dask_cluster, dask_pids, env_with_repo, kill_busy_dask_worker

CONFIG = "configs/preprocess/tiny.yaml"
BOOKS = ("chesterton-brown.txt", "shakespeare-macbeth.txt")
DASK = ("--runner", "apache_beam.runners.dask.dask_runner.DaskRunner")
RUN_TIMEOUT = 600  # seconds; a run on the loaded 2-core CI machine takes well under a minute


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, real_wiki, real_books, bert_vocab):
    """The run's arguments (all but --output and the runner) and a directory for the outputs."""
    root = tmp_path_factory.mktemp("dask-faults")
    books = root / "books"
    books.mkdir()
    for name in BOOKS:
        (books / name).write_bytes((real_books / name).read_bytes())
    return root, ["run", "--config", CONFIG, "--wikipedia", real_wiki, "--books", books, "--tokenizer", bert_vocab]


@pytest.fixture(scope="module")
def direct(corpus):
    """The same run on the DirectRunner: what a run that survives its faults must equal."""
    root, args = corpus
    run_cli(*args, "--output", root / "direct")
    return root / "direct"


@contextlib.contextmanager
def dask_run(args, output, address):
    """The driver (``python -m preprocess run``) running on the cluster at ``address``; on leaving, nothing of it
    is left running. Its stdout and stderr go to files next to ``output``."""
    argv = [sys.executable, "-m", "preprocess", *map(str, args), "--output", str(output), *DASK,
            "--dask_client_address", address]
    with open(f"{output}.stdout", "w") as out, open(f"{output}.stderr", "w") as err, \
            processes.started(argv, cwd=REPO_ROOT, env=env_with_repo(str(REPO_ROOT)), stdout=out,
                              stderr=err) as driver:
        yield driver


def finished(driver, output) -> subprocess.CompletedProcess:
    """Wait for the driver (killed with its session by ``dask_run`` if it overruns) and return what it said."""
    returncode = driver.wait(timeout=RUN_TIMEOUT)
    return subprocess.CompletedProcess(driver.args, returncode, open(f"{output}.stdout").read(),
                                       open(f"{output}.stderr").read())


def documents_written(output) -> bool:
    """Whether the documents stage has written its first bucket: the run is under way, with most of it to come."""
    docs = f"{output}.incomplete/_work/docs"
    return os.path.isdir(docs) and any(name.endswith(".arrow") for _, _, names in os.walk(docs) for name in names)


def files_in(dataset) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), dataset) for d, _, names in os.walk(dataset) for n in names}


def assert_nothing_published(output) -> None:
    """No dataset, and no manifest anywhere that could make one look finished. A task still running on a worker
    may write under DIR.incomplete after the driver gave up; the next run removes it."""
    assert not output.exists()
    staging = output.parent / f"{output.name}.incomplete"
    assert not (staging / "manifest.json").exists()


def env_for_cluster(**config) -> dict:
    env = env_with_repo(str(REPO_ROOT))
    env.update({f"DASK_{key.upper()}": str(value) for key, value in config.items()})
    return env


def test_a_worker_killed_mid_run_is_replaced_and_the_shards_are_byte_identical(corpus, direct):
    root, args = corpus
    output = root / "killed-once"
    from distributed import Client

    with dask_cluster(2, str(REPO_ROOT), env_with_repo(str(REPO_ROOT))) as address, \
            Client(address, timeout=30) as client, dask_run(args, output, address) as driver:
        _wait_for(lambda: documents_written(output) or driver.poll() is not None, "the documents stage",
                  timeout=RUN_TIMEOUT)
        assert driver.poll() is None, open(f"{output}.stderr").read()[-3000:]
        killed = kill_busy_dask_worker(client, set(), done=lambda: driver.poll() is not None)
        assert killed is not None, "the run ended before a worker could be killed while running a task"
        proc = finished(driver, output)
        assert proc.returncode == 0, proc.stderr[-4000:]
        client.wait_for_workers(2, timeout=60)  # the nanny started a new worker in place of the killed one
        assert killed not in dask_pids(client).values()

    assert shard_hashes(output) == shard_hashes(direct)
    assert files_in(output) == files_in(direct)  # no partial shard or temporary file left by the killed task
    assert read_manifest(output)["rows"] == read_manifest(direct)["rows"]
    assert not (root / "killed-once.incomplete").exists()


def test_workers_that_keep_dying_fail_the_run_in_one_line_naming_killed_worker(corpus):
    # One worker, and a scheduler that gives up on a task after a second worker died running it
    # (distributed.scheduler.allowed-failures=1; Dask's default is 3): every worker that takes a task is killed.
    root, args = corpus
    output = root / "killed-always"
    from distributed import Client

    env = env_for_cluster(distributed__scheduler__allowed_failures=1)
    killed: set[int] = set()
    with dask_cluster(1, str(REPO_ROOT), env) as address, Client(address, timeout=30) as client, \
            dask_run(args, output, address) as driver:
        while (pid := kill_busy_dask_worker(client, killed, done=lambda: driver.poll() is not None)) is not None:
            killed.add(pid)
        proc = finished(driver, output)

    line = one_error_line(proc)
    assert len(killed) >= 2, killed
    assert line.startswith("error: Dask workers died running the task "), line
    assert "(KilledWorker: 2 workers died while running it, the last tcp://127.0.0.1:" in line
    assert "nothing was published. See the workers' logs for why" in line
    assert "distributed.scheduler.allowed-failures" in line
    assert_nothing_published(output)


def test_the_scheduler_killed_mid_run_fails_the_run_in_one_line(corpus):
    root, args = corpus
    output = root / "scheduler-killed"
    from distributed import Client

    with dask_cluster(2, str(REPO_ROOT), env_with_repo(str(REPO_ROOT))) as address, dask_run(args, output,
                                                                                              address) as driver:
        with Client(address, timeout=30) as client:
            scheduler = client.run_on_scheduler(os.getpid)
        _wait_for(lambda: documents_written(output) or driver.poll() is not None, "the documents stage",
                  timeout=RUN_TIMEOUT)
        assert driver.poll() is None, open(f"{output}.stderr").read()[-3000:]
        os.kill(scheduler, signal.SIGKILL)
        proc = finished(driver, output)

    line = one_error_line(proc)
    assert line == (f"error: lost the connection to the Dask scheduler {address} mid-run "
                    "(scheduler-connection-lost); nothing was published. Check that the scheduler is up (its log "
                    "says why it stopped) and run again"), line
    assert_nothing_published(output)


def test_a_scheduler_that_cannot_be_reached_is_named(corpus, tmp_path):
    from tests.preprocess.servers import free_port

    _, args = corpus
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    proc = run_cli(*args, "--output", tmp_path / "out", *DASK, "--dask_client_address", address,
                   "--dask_connection_timeout", "3", "--dask_npartitions", "2", check=False)
    line = one_error_line(proc)
    assert line.startswith(f"error: cannot reach the Dask scheduler {address}: "), line
    assert line.endswith(". Start the scheduler or correct --dask_client_address"), line
    assert_nothing_published(tmp_path / "out")


class _Future:
    def __init__(self, status, error=None):
        self.status, self.key, self._error = status, ("task", 0), error

    def result(self):
        if self._error is not None:
            raise self._error


class _Result:
    def __init__(self, *futures):
        self.futures, self.client, self.closed = list(futures), self, False

    def close(self, timeout):
        self.closed = True


def test_a_dask_result_with_a_task_that_did_not_finish_is_a_failure():
    from distributed.client import FutureCancelledError

    from preprocess.executors import daskfaults

    daskfaults.check_finished(_Result(_Future("finished"), _Future("finished")))
    daskfaults.check_finished(object())  # another runner's result
    lost = FutureCancelledError(("task", 0), "scheduler-connection-lost")
    with pytest.raises(FutureCancelledError):
        daskfaults.check_finished(_Result(_Future("finished"), _Future("cancelled", lost)))
    with pytest.raises(RuntimeError, match=r"the Dask task \('task', 0\) ended lost; nothing was published"):
        daskfaults.check_finished(_Result(_Future("lost")))
    result = _Result()
    daskfaults.close_client(result)
    assert result.closed
