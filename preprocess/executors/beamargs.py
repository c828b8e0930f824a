"""What the command line's pass-through Apache Beam options ask for, read without importing Beam."""
from __future__ import annotations


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


def _direct_workers(beam_args: list[str]) -> tuple[int, str]:
    return (int(option(beam_args, "--direct_num_workers", "1")),
            option(beam_args, "--direct_running_mode", "in_memory"))


def local_pool_size(beam_args: list[str]) -> int:
    """N when the DirectRunner is asked for N > 1 worker processes (``executors.local`` runs them), else 0."""
    if not is_direct_runner(beam_args):
        return 0
    workers, mode = _direct_workers(beam_args)
    return workers if workers > 1 and mode == "multi_processing" else 0


def runs_in_one_process(beam_args: list[str]) -> bool:
    """Whether the DirectRunner runs the whole pipeline in this process (its in-memory mode, the default)."""
    if not is_direct_runner(beam_args):
        return False
    workers, mode = _direct_workers(beam_args)
    return workers == 1 or mode == "in_memory"


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
