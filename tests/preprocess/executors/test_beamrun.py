"""preprocess.executors.beamrun: the runner is pinned, construction-time checks are off, threads are refused."""
from __future__ import annotations

import pytest

from common.errors import InputError
from preprocess.executors.beamrun import FN_API_RUNNER, beam_options


def test_the_runner_is_pinned_so_beam_never_fetches_prism():
    assert beam_options([]).get_all_options()["runner"] == FN_API_RUNNER
    assert beam_options(["--runner", "DirectRunner"]).get_all_options()["runner"] == FN_API_RUNNER
    dask = "apache_beam.runners.dask.dask_runner.DaskRunner"
    assert beam_options([f"--runner={dask}"]).get_all_options()["runner"] == dask


def test_construction_time_type_checking_is_off_unless_asked_for():
    from apache_beam.options.pipeline_options import TypeOptions

    assert beam_options([]).view_as(TypeOptions).pipeline_type_check is False
    assert beam_options(["--pipeline_type_check"]).view_as(TypeOptions).pipeline_type_check is True


def test_multi_threading_is_refused():
    with pytest.raises(InputError, match="multi_threading"):
        beam_options(["--direct_running_mode", "multi_threading"])


def test_the_dask_runner_gets_partitions_for_every_worker_thread_unless_told(monkeypatch):
    # Beam's DaskRunner puts up to 128 elements of a Create in one partition: our few heavy elements (input files,
    # units of work) then all ran on one worker.
    from apache_beam.runners.dask.dask_runner import DaskOptions

    from preprocess.executors import beamrun

    assert beamrun.dask_threads(None) >= 1   # no address: the local cluster the runner starts, a worker per core
    asked = []
    monkeypatch.setattr(beamrun, "dask_threads", lambda address: asked.append(address) or 3)
    dask = "--runner=apache_beam.runners.dask.dask_runner.DaskRunner"
    options = beam_options([dask, "--dask_client_address", "tcp://127.0.0.1:1"]).view_as(DaskOptions)
    assert options.npartitions == 3 * beamrun.DASK_PARTITIONS_PER_THREAD and asked == ["tcp://127.0.0.1:1"]
    assert beam_options([dask, "--dask_npartitions", "5"]).view_as(DaskOptions).npartitions == 5
    assert beam_options([dask, "--dask_partition_size=7"]).view_as(DaskOptions).npartitions is None
    assert beam_options([]).get_all_options().get("npartitions") is None   # other runners: untouched
