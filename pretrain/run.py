"""Pretrain BERT with DeepSpeed.

    deepspeed pretrain/run.py --config configs/pretrain/bert_large_phase1_seq128.yaml
    torchrun --nproc_per_node 8 pretrain/run.py --config ... --resume
    mpirun -n 16 python pretrain/run.py --config ...        srun python pretrain/run.py --config ...
    python pretrain/run.py --config ... --dry-run --world-size 64
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

try:  # the launchers run this file as a script: the project must be installed, as the README's set-up does
    from common.configlib import ConfigError
except ModuleNotFoundError as missing:
    sys.exit(f"pretrain/run.py: cannot import {missing.name!r}: install the project first "
             f"(pip install -e '{Path(__file__).resolve().parents[1]}[pretrain]')")
from common.errors import CheckpointError, DatasetFormatError, InputError, report, storage_failure
from common.writelock import OutputLockedError, end_with_parent
from pretrain import config as config_module

EXPECTED_ERRORS = (ConfigError, DatasetFormatError, CheckpointError, FileNotFoundError, ValueError, OutputLockedError)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a YAML file under configs/pretrain/")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set train.max_steps=100 (repeatable)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest complete checkpoint in output_dir (if there is one)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved DeepSpeed config, the batch arithmetic and the per-GPU memory of "
                             "the model states, then exit")
    parser.add_argument("--world-size", type=int, default=None, help="with --dry-run: the number of GPUs to plan for")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error too (otherwise a full disk or missing permission "
                             "writes it to a file in the temporary directory that the error line names)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed
    return parser.parse_args(argv)


def dry_run(cfg, world_size: int) -> None:
    from pretrain.config import batch_plan
    from pretrain.ds_config import deepspeed_config
    from pretrain.memory import DEFAULT_VOCAB, estimate_for_run
    from pretrain.precision import planning_hardware, resolve_run
    from pretrain.schedule import lr_at

    cfg, choices = resolve_run(cfg, planning_hardware())
    plan = batch_plan(cfg.train, world_size)
    ds_config = deepspeed_config(plan, cfg.output_dir, train=cfg.train, optimizer=cfg.optimizer, zero=cfg.zero,
                                 logging=cfg.logging)
    warmup = cfg.schedule.resolved_warmup()
    print(json.dumps(ds_config, indent=2))
    print(f"\n{plan.describe()}")
    print("\n".join(choice.line() for choice in choices))
    print(f"{cfg.train.max_steps:,} steps x {plan.global_batch:,} sequences = "
          f"{cfg.train.max_steps * plan.global_batch:,} samples; warm-up {warmup:,} steps to lr {cfg.optimizer.lr:g}, "
          f"then {cfg.schedule.decay} decay to {lr_at(cfg.train.max_steps - 1, cfg.optimizer.lr, cfg.schedule):.3g}")
    vocab = _dataset_vocab_size(cfg.data.path)
    print(f"\n{estimate_for_run(cfg, world_size, vocab).table()}")
    if vocab is None and not cfg.model.vocab_size and not cfg.model.init_from:
        print(f"  (vocabulary assumed: {DEFAULT_VOCAB:,} ids, bert-base-uncased's rounded up to a multiple of 8; "
              "data.path has no dataset to read it from)")


def _dataset_vocab_size(path: str) -> int | None:
    """The vocabulary of the dataset at ``path`` (its manifest, read and checked as training reads it), or None
    where there is no dataset yet (a plan made before preprocessing)."""
    from common.manifest import MANIFEST_NAME, Manifest

    if not path or not (Path(path) / MANIFEST_NAME).is_file():
        return None
    return Manifest.read(path).tokenizer.vocab_size


def main(argv=None) -> int:
    import warnings

    # DeepSpeed's ZeRO calls a collective that recent torch marks deprecated, once per rank and step.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*deprecated", category=FutureWarning)
    args = parse_args(argv)
    try:
        cfg = config_module.load(args.config, args.overrides)
        if args.dry_run:
            dry_run(cfg, args.world_size or int(os.environ.get("WORLD_SIZE", 1)))
            return 0
        if not cfg.data.path:
            raise ConfigError(f"{args.config}: data.path is not set; point it at a directory written by "
                              "`python -m preprocess run` (or pass --set data.path=DIR)")
    except EXPECTED_ERRORS as error:
        report(str(error), error, debug=args.debug)
        return 2

    from pretrain import engine, launch, train
    from pretrain.monitor import setup_logging

    end_with_parent()  # a rank never outlives its launcher (torchrun, deepspeed, mpirun, srun) or shell
    rendezvous = launch.from_environment()
    setup_logging(rendezvous.rank)
    engine.init_distributed(rendezvous, cfg.faults.timeout_minutes)
    try:
        status = train.run(cfg, rendezvous, resume=args.resume)
    except BaseException as error:  # noqa: BLE001 - every rank ends here: one line, or a traceback when unexpected
        line, storage = expected_error(error, cfg.output_dir)
        if line is None:
            import traceback

            traceback.print_exc()
            _die(1)
        report(line, error, debug=args.debug, label=f"error (rank {rendezvous.rank})",
               traceback_file=f"pretrain-rank{rendezvous.rank}" if storage else None)
        _die(2)
    engine.shutdown()
    # Leave without the interpreter's teardown, whose C++ destructors aborted a finished rank now and then
    # ("terminate called without an active exception": a thread of the distributed runtime still joinable),
    # turning a finished job into a failed one. Everything we write is closed by now; logs are flushed here.
    logging.shutdown()
    _die(status)


def expected_error(error: BaseException, output_dir: str) -> tuple[str | None, bool]:
    """(the one line, whether it is a full disk or missing permission) for an expected error; (None, False) for
    any other. A full disk or missing permission wins over the message of the error it surfaced as (a shard
    unreadable for want of permission is not damaged); the tokenizer's errors already say it."""
    from pretrain.train import CollectiveTimeout

    if not isinstance(error, Exception):  # an interrupt, even one during a disk fault's handling
        return None, False
    if isinstance(error, InputError):
        return error.message, storage_failure(error) is not None
    failure = storage_failure(error, path=output_dir)
    if failure is not None:
        return str(failure), True
    if isinstance(error, (*EXPECTED_ERRORS, CollectiveTimeout)):
        return str(error), False
    return None, False


def _die(status: int) -> None:
    """Exit at once: a rank that lingers would leave the others waiting in a collective until the timeout,
    while its exit makes the launcher (deepspeed, torchrun, mpirun, srun) stop the whole job."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
