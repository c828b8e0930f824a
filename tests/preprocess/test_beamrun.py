"""preprocess.beamrun: the runner is pinned, construction-time checks are off, threads are refused."""
from __future__ import annotations

import pytest

from common.errors import InputError
from preprocess.beamrun import FN_API_RUNNER, beam_options


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
