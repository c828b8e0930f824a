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

BENCHMARKS = ("glue", "squad", "conll")
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "finetune" / "default.yaml"
log = logging.getLogger("finetune")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m finetune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("suite", *BENCHMARKS))
    parser.add_argument("--checkpoint", required=True, help="a Hugging Face BERT directory, a pretraining run "
                                                            "directory or one of its checkpoints")
    parser.add_argument("--data", required=True, type=Path, help="the directory holding glue/, squad/, conll2003/")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--tasks", default=None, help="suite: benchmarks (glue,squad,conll) and/or single GLUE "
                        "tasks (cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli); glue: GLUE tasks; default all")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
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


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    from finetune import benchmarks as bench
    from finetune import checkpoint, report
    from finetune.config import load
    from finetune.errors import DataError
    from pretrain.hf_compat import CheckpointError

    started = time.time()
    try:
        cfg = load(args.config, args.overrides)
        to_run, glue_tasks = plan(args.command, args.tasks)
        bench.check_data(to_run, glue_tasks, args.data, cfg)
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "config.yaml").write_text(configlib.to_yaml(cfg))
        model_dir = checkpoint.resolve(args.checkpoint, args.output)
        tokenizer = checkpoint.load_tokenizer_for(model_dir)
    except (configlib.ConfigError, DataError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    log.info(f"model {model_dir}; benchmarks {', '.join(to_run)}; seeds {cfg.seeds}")
    results = []
    if "glue" in to_run:
        results += bench.run_glue(glue_tasks, args.data, model_dir, tokenizer, cfg, args.output)
    if "squad" in to_run:
        results += bench.run_squad(args.data, model_dir, tokenizer, cfg, args.output)
    if "conll" in to_run:
        results += bench.run_conll(args.data, model_dir, tokenizer, cfg, args.output)
    final = report.build(results, checkpoint=str(args.checkpoint), seconds=time.time() - started, seeds=cfg.seeds,
                         config=configlib.to_dict(cfg))
    report.write(final, args.output)
    print(report.markdown(final))
    log.info(f"wrote {args.output / 'report.json'} and report.md in {time.time() - started:.0f} s")
    return 0
