"""Export a pretraining checkpoint as a Hugging Face directory of the run's model family.

    python -m pretrain.export runs/bert-large-phase1 OUT_DIR            # the run's newest complete checkpoint
    python -m pretrain.export runs/bert-large-phase1/checkpoints/step_00002000 OUT_DIR
    python -m pretrain.export runs/bert-large-phase1 OUT_DIR --best     # its best by checkpoint.keep_best

Works in one process on CPU for a checkpoint of any ZeRO stage written by any number of ranks.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from common.errors import CheckpointError, report, storage_failure
from pretrain import checkpoints

log = logging.getLogger("pretrain")


def find_checkpoint(path: Path) -> checkpoints.Checkpoint:
    """A run directory (its newest intact checkpoint), its checkpoints/ directory, or one checkpoint.

    Files are checked against the checkpoint's marker and for pickled code first: one named checkpoint that
    fails is refused; for a run, a failing checkpoint is skipped with a warning for the next older one.
    """
    from pretrain.engine import refuse_unsafe

    path = Path(path)
    if (path / checkpoints.MARKER).is_file():
        found = next(c for c in checkpoints.complete(path.parent) if c.tag == path.name)
        checkpoints.verify(found)
        refuse_unsafe(found.path)
        return found
    for candidate in (path / "checkpoints", path):
        found = checkpoints.newest_intact(candidate, "fallback", check=lambda c: refuse_unsafe(c.path),
                                          warn=log.warning)
        if found is not None:
            return found
    if path.name.startswith("step_") and path.is_dir():
        raise CheckpointError(f"{path} has no {checkpoints.MARKER} marker: its save did not finish; use an "
                              "earlier checkpoint of the run")
    raise CheckpointError(f"{path}: no complete pretraining checkpoint here (expected a run directory, its "
                          "checkpoints/ directory or a checkpoints/step_NNNNNNNN directory)")


def export_checkpoint(path: Path | checkpoints.Checkpoint, output: Path) -> Path:
    """Write ``output`` (config.json, model.safetensors, tokenizer) from the checkpoint at ``path`` (or from
    a checkpoint ``find_checkpoint`` already checked)."""
    found = path if isinstance(path, checkpoints.Checkpoint) else find_checkpoint(path)
    _, family, model = checkpoint_model(found)
    tokenizer_dir = found.directory.parent / "tokenizer"  # copied there by the run from its dataset
    family.export(model, output, tokenizer_dir if tokenizer_dir.is_dir() else None)
    return output


def best_checkpoint(run_dir: Path) -> checkpoints.Checkpoint:
    """The checkpoint a run kept as its best (``checkpoint.keep_best``), checked as ``find_checkpoint`` checks."""
    cfg = run_config(Path(run_dir))
    metric = cfg.checkpoint.keep_best
    if not metric:
        raise CheckpointError(f"{run_dir}: the run keeps no best checkpoint (checkpoint.keep_best is unset); export "
                              "its newest, or name a checkpoint")
    found = checkpoints.best(Path(run_dir) / "checkpoints", metric)
    if found is None:
        raise CheckpointError(f"{run_dir}: no checkpoint records an evaluation of {metric}; export its newest")
    return find_checkpoint(found.path)


def run_config(run_dir: Path):
    """The resolved config a run saved (config.yaml)."""
    import yaml

    from common import configlib
    from pretrain.config import PretrainConfig

    return configlib.from_dict(PretrainConfig, yaml.safe_load((run_dir / "config.yaml").read_text()),
                               str(run_dir / "config.yaml"))


def checkpoint_model(found: checkpoints.Checkpoint):
    """(the run's config, its family, the CPU fp32 model) of a checked checkpoint, in one process."""
    from pretrain import engine, families

    run_dir = found.directory.parent
    cfg = run_config(run_dir)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            state = engine.consolidate_checkpoint(found.directory, found.tag, found.info["zero_stage"],
                                                  Path(scratch) / "u")
        except CheckpointError:
            raise
        except Exception as error:  # a checkpoint from before markers listed checksums can still be cut short
            failure = storage_failure(error, path=scratch, doing="consolidating the checkpoint", writing=True,
                                      fix="set TMPDIR to a file system with room for a copy of it")
            if failure is not None:
                raise failure from error
            log.debug("consolidating %s failed", found.path, exc_info=True)
            raise CheckpointError(f"{found.path}: DeepSpeed could not read it ({type(error).__name__}: "
                                  f"{str(error).splitlines()[0][:200] if str(error) else ''}); a file is damaged: "
                                  "export an earlier checkpoint of the run") from error
    family = families.for_config(cfg, run_directory=run_dir)  # e.g. a distillation teacher's recorded config
    state = {k.removeprefix("model."): v for k, v in state.items()}
    try:
        model = family.model_from_state(state)
    except CheckpointError as error:
        raise CheckpointError(f"{found.path}: {error}") from None
    return cfg, family, model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--best", action="store_true",
                        help="the run's best checkpoint by its checkpoint.keep_best metric, not its newest")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error too")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(best_checkpoint(args.checkpoint) if args.best else args.checkpoint, args.output)
    except Exception as error:  # noqa: BLE001 - an expected error becomes one line, anything else a traceback
        failure = storage_failure(error, path=args.output)
        if failure is None and not isinstance(error, (CheckpointError, FileNotFoundError)):
            raise
        report(str(failure or error), error, debug=args.debug,
               traceback_file="pretrain-export" if failure is not None else None)
        return 2
    print(f"exported {args.checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
