"""Reading the pass-through Beam options: runner, local worker processes, the options a pool keeps."""
import os

import pytest

from common.errors import InputError
from preprocess.executors import beamargs

CORES = len(os.sched_getaffinity(0))


def test_an_option_is_read_in_either_form_and_the_last_one_wins():
    assert beamargs.option(["--runner", "DataflowRunner"], "--runner") == "DataflowRunner"
    assert beamargs.option(["--runner=FlinkRunner", "--runner", "DirectRunner"], "--runner") == "DirectRunner"
    assert beamargs.option(["--runner_v2", "x"], "--runner", "default") == "default"
    assert beamargs.option(["--runner"], "--runner", "default") == "default"  # no value: left to Beam's parser


def test_pool_only_for_local_multi_processing():
    assert beamargs.local_pool_size(["--direct_num_workers", "4", "--direct_running_mode", "multi_processing"]) == 4
    assert beamargs.local_pool_size(["--direct_num_workers=2", "--direct_running_mode=multi_processing"]) == 2
    assert beamargs.local_pool_size(["--direct_num_workers", "2"]) == 0  # in-memory mode: Beam's own
    assert beamargs.local_pool_size(["--direct_num_workers", "1", "--direct_running_mode", "multi_processing"]) == 1
    assert beamargs.local_pool_size(["--runner", "apache_beam.runners.direct.direct_runner.DirectRunner",
                                     "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]) == 2
    assert beamargs.local_pool_size(["--runner", "apache_beam.runners.dask.dask_runner.DaskRunner",
                                     "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]) == 0


@pytest.mark.parametrize("beam_args, one_process", [
    ([], True), (["--direct_num_workers", "1"], True), (["--runner=direct"], True),
    (["--runner=apache_beam.runners.direct.direct_runner.DirectRunner"], True),
    (["--direct_num_workers", "2"], True),  # in-memory mode: still one process
    (["--direct_num_workers=2", "--direct_running_mode=multi_processing"], False),
    (["--runner", "apache_beam.runners.dask.dask_runner.DaskRunner"], False),
    (["--runner", "DataflowRunner", "--temp_location", "gs://b/tmp"], False), (["--runner", "FlinkRunner"], False),
])
def test_one_process_only_for_the_in_memory_direct_runner(beam_args, one_process):
    assert beamargs.runs_in_one_process(beam_args) is one_process
    assert beamargs.is_direct_runner(beam_args) is (one_process or "--direct_running_mode" in " ".join(beam_args))


def test_the_pool_drops_the_worker_options_only():
    args = ["--direct_num_workers", "2", "--direct_running_mode=multi_processing", "--runner", "DirectRunner",
            "--default_sdk_harness_log_level=INFO"]
    assert beamargs.without_worker_options(args) == ["--default_sdk_harness_log_level=INFO"]


@pytest.mark.parametrize("workers", [None, "0", "1", "2", "3"])
@pytest.mark.parametrize("mode", [None, "in_memory", "multi_processing"])
def test_every_worker_count_of_either_mode_runs_in_this_process_or_in_a_pool_of_that_many(workers, mode):
    """The demo's flags with one worker once ended in a traceback: Beam's own multi-processing runner got the
    pipeline that hands payloads over by reference inside one process. multi_processing is now always our pool
    (one worker too), in_memory always this process; 0 is Beam's one per core."""
    args = (["--direct_num_workers", workers] if workers else []) + (["--direct_running_mode", mode] if mode else [])
    count = int(workers or 1) or CORES
    assert beamargs.direct_workers(args) == (count, mode or "in_memory")
    if mode == "multi_processing":
        assert (beamargs.local_pool_size(args), beamargs.runs_in_one_process(args)) == (count, False)
    else:
        assert (beamargs.local_pool_size(args), beamargs.runs_in_one_process(args)) == (0, True)


@pytest.mark.parametrize("args, message", [
    (["--direct_num_workers", "2", "--direct_running_mode", "multi_threading"], "multi_threading is not supported"),
    (["--direct_running_mode=threads"], "--direct_running_mode threads: choose one of in_memory, multi_threading, "
                                        "multi_processing"),
    (["--direct_num_workers", "-1"], "--direct_num_workers -1: give a whole number"),
    (["--direct_num_workers=two", "--direct_running_mode=multi_processing"], "--direct_num_workers two: give"),
])
def test_what_the_direct_runner_cannot_run_is_refused_in_one_line(args, message):
    for ask in (beamargs.local_pool_size, beamargs.runs_in_one_process):
        with pytest.raises(InputError, match=message) as refused:
            ask(args)
        assert "\n" not in str(refused.value)
    assert beamargs.local_pool_size(["--runner", "FlinkRunner", *args]) == 0  # another runner's business
