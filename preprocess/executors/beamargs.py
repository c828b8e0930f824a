"""What the command line's pass-through Apache Beam options ask for, read without importing Beam."""
from __future__ import annotations

import os

from common.errors import InputError

RUNNING_MODES = ("in_memory", "multi_threading", "multi_processing")  # Beam's DirectOptions choices


def option(beam_args: list[str], name: str, default: str | None = None) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` (the last one given, as Beam's parser takes), else
    ``default``."""
    value = default
    for index, arg in enumerate(beam_args):
        if arg == name and index + 1 < len(beam_args):
            value = beam_args[index + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


def is_direct_runner(beam_args: list[str]) -> bool:
    """Whether the runner is Beam's DirectRunner (the default; by name, alias or module path)."""
    return option(beam_args, "--runner", "DirectRunner").rsplit(".", 1)[-1] in ("DirectRunner", "direct")


def direct_workers(beam_args: list[str]) -> tuple[int, str]:
    """(worker count, running mode) the DirectRunner is asked for, with Beam's meaning of 0 (one per usable
    core) resolved; what cannot run is refused here, in one line, before anything is read.

    Every accepted combination gives the same shards: the in-memory mode runs the whole pipeline in this process
    (Beam's in-memory runner has one worker whatever the count), and the multi-processing mode runs our own pool
    of that many worker processes (``executors.local``), one included. Beam's multi-threaded mode is refused."""
    mode = option(beam_args, "--direct_running_mode", "in_memory")
    if mode not in RUNNING_MODES:
        raise InputError(f"--direct_running_mode {mode}: choose one of {', '.join(RUNNING_MODES)}")
    if mode == "multi_threading":
        raise InputError("--direct_running_mode multi_threading is not supported: Beam's multi-threaded "
                         "FnApiRunner was seen to drop elements of large groups; use multi_processing")
    given = option(beam_args, "--direct_num_workers", "1")
    try:
        workers = int(given)
    except ValueError:
        workers = -1
    if workers < 0:
        raise InputError(f"--direct_num_workers {given}: give a whole number of worker processes, at least 1 "
                         "(0: one per usable core)")
    return (workers or len(os.sched_getaffinity(0))), mode


def local_pool_size(beam_args: list[str]) -> int:
    """N when the DirectRunner is asked for multi-processing with N worker processes (``executors.local`` runs
    them, one worker too), else 0."""
    if not is_direct_runner(beam_args):
        return 0
    workers, mode = direct_workers(beam_args)
    return workers if mode == "multi_processing" else 0


def runs_in_one_process(beam_args: list[str]) -> bool:
    """Whether the DirectRunner runs the whole pipeline in this process (its in-memory mode, the default)."""
    if not is_direct_runner(beam_args):
        return False
    return direct_workers(beam_args)[1] == "in_memory"


def without_worker_options(beam_args: list[str]) -> list[str]:
    """The options without the ones that choose the runner and ask for its worker processes."""
    drop = {"--direct_num_workers", "--direct_running_mode", "--runner"}
    out, skip = [], False
    for arg in beam_args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in drop:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out
