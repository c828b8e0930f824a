"""``python -m finetune suite|glue|squad|conll``: finetune a checkpoint and write report.json and report.md.

    python -m finetune suite --checkpoint runs/bert-large-phase2 --tasks glue,squad,conll --data DATA --output OUT
    python -m finetune glue --checkpoint DIR --tasks cola,rte --data DATA --output OUT
    python -m finetune squad --checkpoint DIR --data DATA --output OUT --set squad.version_2=true

DATA holds glue/<Task>/ (the download_glue_data.py layout), squad/ and conll2003/ (as ../shared/data does).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from common import configlib
from common.errors import InputError, storage_failure
from common.errors import report as report_error

BENCHMARKS = ("glue", "squad", "conll")
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "finetune" / "default.yaml"
log = logging.getLogger("finetune")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m finetune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("suite", *BENCHMARKS))
    parser.add_argument("--checkpoint", required=True, help="a Hugging Face BERT, ALBERT or ELECTRA directory "
                        "(config.json model_type), a pretraining run directory or one of its checkpoints")
    parser.add_argument("--data", required=True, type=Path, help="the directory holding glue/, squad/, conll2003/")
    parser.add_argument("--output", required=True, type=local_directory)
    parser.add_argument("--tasks", default=None, help="suite: benchmarks (glue,squad,conll) and/or single GLUE "
                        "tasks (cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli); glue: GLUE tasks; default all")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--save-models", action="store_true",
                        help="write each task's selected model (the median seed's best epoch, or save_seed's) as a "
                             "transformers task-model directory under OUT/models/<task>/ (as --set save_models=true)")
    parser.add_argument("--note", default=None, help="a line the report opens with, saying what the run is (the "
                        "demo says that its data is a synthetic sample)")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error too (otherwise a full disk or missing permission "
                             "writes it to a file in the temporary directory that the error line names)")
    return parser.parse_args(argv)


def plan(command: str, tasks: str | None) -> tuple[list[str], list[str]]:
    """(benchmarks to run, GLUE tasks) from the command line; unknown names are refused.

    For ``suite``, --tasks mixes benchmark names and GLUE task names: ``glue`` is all nine GLUE tasks,
    ``sst2,mrpc,squad`` two of them and SQuAD.
    """
    from finetune import glue
    from finetune.errors import DataError

    names = [t.strip().lower() for t in tasks.split(",") if t.strip()] if tasks else []
    if command == "suite":
        names = names or list(BENCHMARKS)
        for name in names:
            if name not in BENCHMARKS and name not in glue.GLUE_TASKS:
                raise DataError(f"unknown task {name!r} in --tasks; choose from {', '.join(BENCHMARKS)} or GLUE tasks "
                                f"{', '.join(glue.GLUE_TASKS)}")
        glue_tasks = list(glue.GLUE_TASKS) if "glue" in names else [n for n in glue.GLUE_TASKS if n in names]
        benchmarks = [b for b in BENCHMARKS if b in names or (b == "glue" and glue_tasks)]
        return benchmarks, glue_tasks
    if command == "glue":
        for name in names:
            if name not in glue.GLUE_TASKS:
                raise DataError(f"unknown GLUE task {name!r}; choose from {', '.join(glue.GLUE_TASKS)}")
        return ["glue"], names or list(glue.GLUE_TASKS)
    if names:
        raise DataError(f"--tasks applies to suite and glue, not to {command}")
    return [command], []


def local_directory(value: str) -> Path:
    """``--output``: reports, exports and task models are written as files, so an object-store URI is refused
    (``Path`` would turn ``s3://b/x`` into the local directory ``s3:/b/x``)."""
    if "://" in value:
        raise argparse.ArgumentTypeError(f"{value!r} is an object-store URI; give a local or shared file-system "
                                         "directory and copy the results to the store afterwards")
    return Path(value)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    try:
        return run(args)
    except Exception as error:  # noqa: BLE001 - an expected error becomes one line, anything else a traceback
        line, storage = expected_error(error, args.output)
        if line is None:
            raise
        report_error(line, error, debug=args.debug, traceback_file="finetune" if storage else None)
        return 2


def expected_error(error: BaseException, output: Path) -> tuple[str | None, bool]:
    """(the one line, whether it is a full disk or missing permission) for an expected error; (None, False) for
    any other. A full disk or missing permission wins over the message of the error it surfaced as; the
    tokenizer's errors already say it."""
    from common.errors import CheckpointError
    from finetune.errors import DataError

    if isinstance(error, InputError):
        return error.message, storage_failure(error) is not None
    failure = storage_failure(error, path=output)
    if failure is not None:
        return str(failure), True
    if isinstance(error, (configlib.ConfigError, DataError, CheckpointError)):
        return str(error), False
    return None, False


def run(args: argparse.Namespace) -> int:
    from common.errors import CheckpointError
    from finetune import pretrained, report, suite
    from finetune.config import load
    from finetune.trainer import resolved_precision

    started = time.time()
    cfg = load(args.config, args.overrides + (["save_models=true"] if args.save_models else []))
    to_run, glue_tasks = plan(args.command, args.tasks)
    suite.check_data(to_run, glue_tasks, args.data, cfg)
    # Each benchmark's precision as it resolves here (per-task GLUE changes are resolved in the report).
    notes = [f"{name}.{resolved_precision(getattr(cfg, name).training.precision).line()}" for name in to_run]
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "config.yaml").write_text("".join(f"# {note}\n" for note in notes) + configlib.to_yaml(cfg))
    model_dir = pretrained.resolve(args.checkpoint, args.output)
    tokenizer = pretrained.load_tokenizer_for(model_dir)
    if cfg.save_models:
        from finetune.task_models import check_tokenizer

        check_tokenizer(tokenizer, model_dir)
    log.info(f"model {model_dir}; benchmarks {', '.join(to_run)}; seeds {cfg.seeds}")
    results = []
    if "glue" in to_run:
        results += suite.run_glue(glue_tasks, args.data, model_dir, tokenizer, cfg, args.output)
    if "squad" in to_run:
        results += suite.run_squad(args.data, model_dir, tokenizer, cfg, args.output)
    if "conll" in to_run:
        results += suite.run_conll(args.data, model_dir, tokenizer, cfg, args.output)
    model = {"model_type": pretrained.model_type(model_dir), "parameters": pretrained.encoder_parameters(model_dir)}
    final = report.build(results, checkpoint=str(args.checkpoint), seconds=time.time() - started, seeds=cfg.seeds,
                         config=configlib.to_dict(cfg), model=model, note=args.note)
    report.write(final, args.output)
    print(report.markdown(final))
    log.info(f"wrote {args.output / 'report.json'} and report.md in {time.time() - started:.0f} s")
    unsaved = sorted({f"{r['task']} (seed {r['saved_model']['seed']}): {r['saved_model']['error']}"
                      for r in results if "error" in r.get("saved_model", {})})
    if unsaved:  # the report is written and says so too; the run still did not deliver what was asked
        raise CheckpointError("task model(s) not saved: " + "; ".join(unsaved))
    return 0
