"""preprocess.pipeline helpers: the runner is pinned, and a process that runs bundles is prepared once."""
from __future__ import annotations

import subprocess
import sys

import pytest

from preprocess.pipeline import FN_API_RUNNER, beam_options
from preprocess.records import InputError


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


def test_prepared_process_samples_often_freezes_imports_once_and_never_imports_ipython():
    # In a fresh interpreter: the settings are process-wide.
    code = (
        "import gc, sys\n"
        "from preprocess.pipeline import prepare_beam_process\n"
        "from apache_beam.runners.worker import statesampler\n"
        "from apache_beam.utils import interactive_utils\n"
        "prepare_beam_process()\n"
        "assert statesampler.StateSampler('x', None).sampling_period_ms == 20\n"
        "assert not interactive_utils.is_in_ipython()\n"
        "assert sys.modules['IPython'] is None\n"
        "assert gc.get_freeze_count() > 50_000\n"  # Beam's import-time objects, out of the collector's way
        "frozen = gc.get_freeze_count()\n"
        "prepare_beam_process()\n"
        "assert gc.get_freeze_count() == frozen\n"  # once per process
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_collector_is_paused_only_while_importing():
    import gc

    from preprocess.cli import _cycle_collector_paused

    with _cycle_collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # a caller that had turned it off keeps it off
    try:
        with _cycle_collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
