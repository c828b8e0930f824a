"""Apache Beam in this process: the pipeline options (runner pinned), the worker processes' log, running one
pipeline to completion. The stages' executors (``pipeline``, ``local``, ``steps``)
run their pipelines through here."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from preprocess import handoff
from preprocess.executors import daskfaults
from preprocess.executors.beamargs import direct_workers, is_direct_runner, option

FN_API_RUNNER = "apache_beam.runners.portability.fn_api_runner.fn_runner.FnApiRunner"
DASK_PARTITIONS_PER_THREAD = 4  # bag partitions per Dask worker thread, unless --dask_npartitions/_partition_size


@functools.lru_cache(maxsize=8)
def dask_threads(address: str | None) -> int:
    """Worker threads of the Dask cluster at ``address``; without one, the local cluster the DaskRunner starts
    (a worker per core)."""
    if address is None:
        return os.cpu_count() or 1
    from distributed import Client

    with Client(address, timeout=60) as client:
        return max(1, sum(client.nthreads().values()))


def beam_options(beam_args: list[str], verbose: bool = False) -> PipelineOptions:
    """Pipeline options with the runner pinned: Beam's bare DirectRunner would try to fetch Prism."""
    args = list(beam_args)
    if not verbose and not any(a.startswith("--default_sdk_harness_log_level") for a in args):
        args.append("--default_sdk_harness_log_level=WARNING")  # worker processes otherwise log every bundle
    if not any(a.split("=", 1)[0] in ("--pipeline_type_check", "--no_pipeline_type_check") for a in args):
        # Our transforms declare no type hints, so construction-time checking only infers them from the lambdas'
        # bytecode: about half the time to build the pipeline, and it checks nothing a user can change.
        args.append("--no_pipeline_type_check")
    runner = None
    for i, arg in enumerate(args):
        if arg.startswith("--runner"):
            runner = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
    if is_direct_runner(args):
        direct_workers(args)  # refuses what the DirectRunner cannot run here, before anything is read
    if runner is not None and runner.endswith("DaskRunner") and not any(
            a.split("=", 1)[0] in ("--dask_npartitions", "--dask_partition_size") for a in args):
        # Beam's DaskRunner puts up to 128 elements of a Create in one bag partition, and a partition is one task:
        # our Creates hold a few heavy elements (input files, units of work), which then all ran on one worker.
        threads = dask_threads(option(args, "--dask_client_address"))
        args.append(f"--dask_npartitions={DASK_PARTITIONS_PER_THREAD * threads}")
    if runner is None:
        args.append(f"--runner={FN_API_RUNNER}")
    elif runner in ("DirectRunner", "direct"):
        args = [a for a in args if not a.startswith("--runner") and a != runner] + [f"--runner={FN_API_RUNNER}"]
    return PipelineOptions(args)


class WorkerLog:
    """Sends file descriptor 2 to a log file while Beam runs, unless verbose.

    Beam's multi-processing workers are subprocesses that inherit our stderr and log every start and stop at
    INFO before any option could quiet them. The log is kept only when the run fails.
    """

    def __init__(self, verbose: bool):
        self.path = None
        if not verbose:
            handle, self.path = tempfile.mkstemp(prefix="preprocess-beam-", suffix=".log")
            os.close(handle)

    def __enter__(self):
        if self.path:
            sys.stderr.flush()
            self._saved = os.dup(2)
            with open(self.path, "ab") as log:
                os.dup2(log.fileno(), 2)
        return self

    def __exit__(self, *exc):
        if self.path:
            sys.stderr.flush()
            os.dup2(self._saved, 2)
            os.close(self._saved)
        return False


def run_beam(options: PipelineOptions, build, log: WorkerLog | None = None, in_process: bool = False) -> None:
    """Build one pipeline (``build(pipeline, lot)`` adds its transforms) and run it to the end, its workers'
    stderr sent to ``log``.

    ``in_process``: the caller knows that the runner runs the whole pipeline in this process (the DirectRunner's
    in-memory mode: ``beamargs.runs_in_one_process``; the local pool's own pipelines). ``lot`` is then a
    ``preprocess.handoff`` lot, open while the pipeline runs, through which its payloads cross the GroupByKeys by
    reference; otherwise it is None.
    """
    with handoff.open_lot() if in_process else contextlib.nullcontext() as lot:
        pipeline = beam.Pipeline(options=options)
        build(pipeline, lot)
        with log or contextlib.nullcontext():
            result = pipeline.run()
            try:
                result.wait_until_finish()
                daskfaults.check_finished(result)  # Beam's DaskRunner says DONE when Dask cancelled its tasks
            except BaseException:
                daskfaults.close_client(result)
                raise


__all__ = ["FN_API_RUNNER", "WorkerLog", "beam_options", "run_beam"]
