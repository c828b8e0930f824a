"""The three stages as jobs: each stage's config checked with that stage's own loader, the resolved config the job
runs with, the stage's own arguments, and its command line.

Only the stages' interfaces are imported (common.preprocess_config, pretrain.config, finetune.config,
finetune.cli), none of which imports torch, DeepSpeed or Beam: rendering a job
works on a login node without the training stack (tests/cluster/test_cli.py checks this).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import configlib

STAGES = ("preprocess", "pretrain", "finetune")
# The options a cluster job sets itself; in the stage's arguments they would fight with the job's own.
BEAM_RUNNER_OPTIONS = ("--runner", "--direct_num_workers", "--direct_running_mode", "--dask_client_address")
DASK_PORT = 8786


class StageError(configlib.ConfigError):
    """A stage config or stage arguments that the job would fail on."""


class ShellVar(str):
    """A word of a command line that is a shell variable of the job script (expanded there, not quoted), with an
    optional literal prefix: ``ShellVar("head", "--nodelist=")`` is ``--nodelist="${head}"``."""

    prefix: str

    def __new__(cls, name: str, prefix: str = ""):
        word = super().__new__(cls, name)
        word.prefix = prefix
        return word


@dataclass(frozen=True)
class StageJob:
    stage: str                    # preprocess | pretrain | finetune
    name: str                     # the job's name on the scheduler (a DNS label: Kubernetes needs one)
    config: Any                   # the stage's config dataclass, as loaded by the stage's own loader
    config_text: str              # the resolved config (overrides applied) that the job runs with
    config_source: str            # the file it came from
    overrides: tuple[str, ...]    # --set values, repeated on the job's command line to show what changed
    arguments: tuple[str, ...]    # the stage's own arguments (inputs, outputs), given after `--`
    outputs: tuple[tuple[str, str], ...]  # (what, path) the job writes: must be on storage that outlives it
    inputs: tuple[tuple[str, str], ...]   # (what, path) the job reads


def default_name(stage: str, config_path: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "-", Path(config_path).stem.lower()).strip("-")
    return f"bert-{stage}-{stem}"[:40].rstrip("-")


def check_name(name: str) -> str:
    if not re.match(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$", name):
        raise StageError(f"--name {name!r}: use 1-40 lowercase letters, digits and '-', starting with a letter and "
                         "not ending with '-' (Kubernetes derives pod and host names from it)")
    return name


def prepare(stage: str, config_path: str, overrides: list[str], arguments: list[str],
            name: str | None = None) -> StageJob:
    """Load and check the stage config and the stage's arguments; refuse what the job would fail on."""
    if stage not in STAGES:
        raise StageError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")
    for argument in arguments:
        if argument.split("=", 1)[0] in ("--config", "--set"):
            raise StageError(f"{argument.split('=', 1)[0]} after '--': give --config and --set to python -m cluster "
                             "(before '--'); after '--' go only the stage's own arguments")
    loader = {"preprocess": _load_preprocess, "pretrain": _load_pretrain, "finetune": _load_finetune}[stage]
    config, outputs, inputs = loader(config_path, overrides, arguments)
    return StageJob(stage=stage, name=check_name(name or default_name(stage, config_path)), config=config,
                    config_text=configlib.to_yaml(config), config_source=config_path, overrides=tuple(overrides),
                    arguments=tuple(arguments), outputs=tuple(outputs), inputs=tuple(inputs))


def _load_pretrain(config_path, overrides, arguments):
    from pretrain import config as pretrain_config

    if arguments:
        raise StageError(f"pretraining takes no arguments after '--' (got {' '.join(arguments)}); every setting is "
                         "in its config: use --set, e.g. --set data.path=DIR --set output_dir=DIR")
    cfg = pretrain_config.load(config_path, overrides)
    if not cfg.data.path:
        raise StageError(f"{config_path}: data.path is not set; point it at a dataset written by `python -m "
                         "preprocess run` with --set data.path=DIR (a path the job can read)")
    inputs = [("data.path", cfg.data.path)]
    if cfg.model.init_from:
        inputs.append(("model.init_from", cfg.model.init_from))
    return cfg, [("output_dir", cfg.output_dir)], inputs


def _load_preprocess(config_path, overrides, arguments):
    from common import preprocess_config

    parser = argparse.ArgumentParser(prog="python -m preprocess run")
    preprocess_config.add_run_arguments(parser)
    parsed, beam_options = _parse_stage_arguments(parser, ["--config", config_path, *arguments], "preprocess")
    for option in beam_options:
        if option.split("=", 1)[0] in BEAM_RUNNER_OPTIONS:
            raise StageError(f"{option} after '--': the cluster job chooses the Beam runner itself (all cores of one "
                             "node, or a Dask cluster when the site sets preprocess_nodes > 1)")
    for option, value in (("--part", parsed.part), ("--step", parsed.step), ("--wait", parsed.wait)):
        if value is not None:
            raise StageError(f"{option} after '--': the cluster job runs the parts itself (site preprocess_array: "
                             "true runs each part as its own task)")
    # --parts goes into the config the job carries, so the job's steps and the renderers see the same number.
    cfg = preprocess_config.load(config_path, [*overrides, *([f"parts={parsed.parts}"] if parsed.parts else [])])
    if not (parsed.wikipedia or parsed.books or cfg.inputs):
        raise StageError("preprocessing needs input: give --wikipedia URI... and/or --books URI... after '--', or "
                         "list sources under inputs: in the config")
    if not (parsed.tokenizer or cfg.tokenizer.path):
        raise StageError("preprocessing needs a tokenizer: give --tokenizer PATH after '--' or set tokenizer.path")
    inputs = [("--wikipedia", uri) for uri in parsed.wikipedia] + [("--books", uri) for uri in parsed.books]
    inputs += [(f"inputs[{index}].paths", path) for index, spec in enumerate(cfg.inputs) for path in spec.paths]
    inputs += [("--tokenizer", parsed.tokenizer or cfg.tokenizer.path)]
    return cfg, [("--output", parsed.output)], inputs


def _load_finetune(config_path, overrides, arguments):
    from finetune import cli
    from finetune import config as finetune_config

    parsed, unknown = _parse_stage_arguments(None, ["suite", "--config", config_path, *arguments], "finetune",
                                             parse=cli.parse_args)
    if unknown:
        raise StageError(f"finetune: unrecognized arguments after '--': {' '.join(unknown)}")
    cfg = finetune_config.load(config_path, overrides)
    if parsed.tasks:
        try:
            cli.plan("suite", parsed.tasks)
        except ValueError as error:
            raise StageError(f"finetune: {error}") from None
    return cfg, [("--output", str(parsed.output))], [("--checkpoint", parsed.checkpoint), ("--data", str(parsed.data))]


def _parse_stage_arguments(parser, argv: list[str], stage: str, parse=None):
    """Parse with the stage's own parser; its usage error becomes one StageError line."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            if parse is not None:
                return parse(argv), []
            return parser.parse_known_args(argv)
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        message = lines[-1].split("error:", 1)[-1].strip() if lines else "bad arguments"
        raise StageError(f"{stage} arguments after '--': {message}") from None


def check_world_size(job: StageJob, world_size: int) -> None:
    """Pretraining: the global batch must split evenly over the site's processes (the stage's own arithmetic)."""
    if job.stage != "pretrain":
        return
    from pretrain.config import batch_plan

    try:
        batch_plan(job.config.train, world_size)
    except configlib.ConfigError as error:
        raise StageError(f"{job.config_source}: {error}") from None


def check_parts(job: StageJob, site) -> None:
    """Preprocessing as parallel parts needs a run with parts."""
    if job.stage == "preprocess" and site.preprocess_array and job.config.parts < 2:
        raise StageError("the site sets preprocess_array: the parts of the run become parallel tasks, but the run has "
                         f"{job.config.parts} part; give --parts N (N > 1, each part within "
                         "preprocess_part_memory) after '--', or --set parts=N")


def command(job: StageJob, *, python: str, workdir: str, config_file: str, runner: list[str] = ()) -> list[str]:
    """The stage's command line (without a launcher): the resolved config, the --set values (already in it; they
    show what differs from the config file) and the stage's arguments. Pretraining always resumes: a requeued or
    restarted job continues from its newest complete checkpoint, and a new one starts fresh."""
    sets = [word for override in job.overrides for word in ("--set", override)]
    if job.stage == "pretrain":
        return [python, f"{workdir}/pretrain/run.py", "--config", config_file, "--resume", *sets]
    if job.stage == "preprocess":
        return [python, "-m", "preprocess", "run", "--config", config_file, *sets, *job.arguments, *runner]
    return [python, "-m", "finetune", "suite", "--config", config_file, *sets, *job.arguments]


def direct_runner(workers) -> list[str]:
    """Beam on one node: a pool of worker processes over all the cores the job has."""
    count = workers if isinstance(workers, str) else str(workers)  # keeps a ShellVar a ShellVar
    return ["--direct_num_workers", count, "--direct_running_mode", "multi_processing"]


def dask_runner(scheduler: str) -> list[str]:
    return ["--runner", "apache_beam.runners.dask.dask_runner.DaskRunner", "--dask_client_address", scheduler]
