"""Reading the pass-through Beam options: runner, local worker processes, the options a pool keeps."""
import pytest

from preprocess.executors import beamargs


def test_an_option_is_read_in_either_form_and_the_last_one_wins():
    assert beamargs.option(["--runner", "DataflowRunner"], "--runner") == "DataflowRunner"
    assert beamargs.option(["--runner=FlinkRunner", "--runner", "DirectRunner"], "--runner") == "DirectRunner"
    assert beamargs.option(["--runner_v2", "x"], "--runner", "default") == "default"
    assert beamargs.option(["--runner"], "--runner", "default") == "default"  # no value: left to Beam's parser


def test_pool_only_for_local_multi_processing():
    assert beamargs.local_pool_size(["--direct_num_workers", "4", "--direct_running_mode", "multi_processing"]) == 4
    assert beamargs.local_pool_size(["--direct_num_workers=2", "--direct_running_mode=multi_processing"]) == 2
    assert beamargs.local_pool_size(["--direct_num_workers", "2"]) == 0  # in-memory mode: Beam's own
    assert beamargs.local_pool_size(["--direct_num_workers", "1", "--direct_running_mode", "multi_processing"]) == 0
    assert beamargs.local_pool_size(["--runner", "apache_beam.runners.direct.direct_runner.DirectRunner",
                                     "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]) == 2
    assert beamargs.local_pool_size(["--runner", "apache_beam.runners.dask.dask_runner.DaskRunner",
                                     "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]) == 0


@pytest.mark.parametrize("beam_args, one_process", [
    ([], True), (["--direct_num_workers", "1"], True), (["--runner=direct"], True),
    (["--runner=apache_beam.runners.direct.direct_runner.DirectRunner"], True),
    (["--direct_num_workers", "2"], True),  # in-memory mode: still one process
    (["--direct_num_workers", "2", "--direct_running_mode", "multi_threading"], False),
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
