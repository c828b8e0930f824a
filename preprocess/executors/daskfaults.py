"""A Dask cluster that fails under a run: the pipeline's result checked for tasks Dask dropped, and the failure as
one line (workers that kept dying, the scheduler lost mid-run, a scheduler never reached). Imports neither Dask nor
Beam (the error paths of every command call it)."""
from __future__ import annotations

import contextlib
import sys

CLOSE_SECONDS = 10  # for a client whose scheduler is gone, instead of the 30 s it would spend reconnecting at exit


def check_finished(result) -> None:
    """Raise the error of any of a DaskRunner result's futures that did not finish; nothing for other runners.

    Beam's ``DaskRunnerResult.wait_until_finish`` raises a task's error, but a future that Dask *cancelled* (the
    client lost its scheduler: every future is cancelled at once) only ends its wait, and the result says DONE:
    the driver went on to publish from a work directory that the stages had not finished.
    """
    futures = getattr(result, "futures", None)
    if futures is None or getattr(result, "client", None) is None:
        return
    for future in futures if isinstance(futures, (list, tuple)) else [futures]:
        if future.status != "finished":
            future.result()  # raises the cancellation (FutureCancelledError, with Dask's reason) or the error
            raise RuntimeError(f"the Dask task {future.key} ended {future.status}; nothing was published")


def close_client(result) -> None:
    """Close a failed DaskRunner result's client (nothing for other runners): its tasks are forgotten by the
    scheduler, and a client that lost its scheduler does not keep the driver reconnecting at exit."""
    client = getattr(result, "client", None)
    if client is not None and hasattr(client, "close"):
        with contextlib.suppress(Exception):
            client.close(timeout=CLOSE_SECONDS)


def dask_failure(error: BaseException, address: str | None) -> str | None:
    """One line for a Dask cluster that failed under the run (None for other errors; Dask is not imported for
    it): workers that kept dying (``KilledWorker``), the scheduler lost mid-run, or a scheduler never reached.
    ``address``: the run's ``--dask_client_address``."""
    if "distributed" not in sys.modules:
        return None
    from distributed.client import FutureCancelledError
    from distributed.scheduler import KilledWorker

    scheduler = f"the Dask scheduler {address}" if address else "the Dask scheduler"
    if isinstance(error, KilledWorker):
        return (f"Dask workers died running the task {error.task!r} (KilledWorker: {error.allowed_failures + 1} "
                f"workers died while running it, the last {getattr(error.last_worker, 'address', '?')}); nothing "
                "was published. See the workers' logs for why (memory limit, OOM killer, preemption), fix that (or "
                "raise distributed.scheduler.allowed-failures on the scheduler) and run again")
    if isinstance(error, FutureCancelledError):
        if error.reason == "scheduler-connection-lost":
            return (f"lost the connection to {scheduler} mid-run (scheduler-connection-lost); nothing was "
                    "published. Check that the scheduler is up (its log says why it stopped) and run again")
        return (f"{scheduler} cancelled the run's tasks ({error.reason}); nothing was published. Run again "
                "once nothing else restarts or cancels work on that cluster")
    if isinstance(error, OSError) and "trying to connect to" in str(error):
        return (f"cannot reach {scheduler}: {str(error).splitlines()[0]}. Start the scheduler or correct "
                "--dask_client_address")
    return None


__all__ = ["check_finished", "close_client", "dask_failure"]
