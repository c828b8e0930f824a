"""The preprocessing driver: plans the run, has an executor run its stages, publishes the dataset atomically.

Stages (``preprocess.executors.plan``; each in its module of ``preprocess.stages``):

1. documents: read, clean, split, tokenize -> a document store partitioned into hash buckets;
2. index: count each bucket's documents (duplicate ids dropped) -> every document's global index;
3. instances: BERT instances; a random next segment comes from any document of the corpus through a
   keyed join (or, for ``kind: full_sentences`` and ``doc_sentences``, packed rows: ``preprocess.stages.packed``)
   -> key-range pieces, sorted;
4. shards: equal-size, globally shuffled Arrow shards; then the manifest, written last.

With ``parts == 1`` all four run as one Beam pipeline. With ``parts > 1`` the documents and
instances stages run once per part (input files, then bucket ranges), so the DirectRunner holds one
part at a time. With ``--direct_num_workers N --direct_running_mode multi_processing`` the local process pool
(``preprocess.executors.local``) runs them. Every random choice is keyed by (seed, document or packing stream,
duplicate, index) and documents are ordered by hash, so the dataset is byte-identical whatever the parts, workers or
runner.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import time
from pathlib import Path

import apache_beam as beam

from common import schema, sizes, storage, writelock
from common.errors import StorageError, storage_failure
from common.preprocess_config import PreprocessConfig
from preprocess.executors import beamargs, local, part_budget
from preprocess.executors.beamrun import WorkerLog, beam_options, run_beam
from preprocess.executors.evaluation import run_evaluation
from preprocess.executors.plan import Plan, resolve_inputs
from preprocess.executors.publish import discard_failed, prepare_output, publish_dataset
from preprocess.stages.worker_tokenizer import share_tokenizer

LOG = logging.getLogger("preprocess")


def fit_memory_budget(cfg: PreprocessConfig, sized: list[tuple[str, str, int]],
                      beam_args: list[str]) -> PreprocessConfig:
    """``cfg`` with the parts that ``max_memory`` asks for (unchanged without it); logs the choice. The local pool
    runs one part per worker process at a time, so each process gets its share of the budget, and it cuts large
    files into units (``part_budget.pool_peak``)."""
    if cfg.max_memory is None:
        return cfg
    pool = beamargs.local_pool_size(beam_args)
    processes = max(1, pool)
    budget = sizes.parse_size(cfg.max_memory)
    units_of = local.unit_shares(sized, tuple(cfg.inputs)) if pool else None
    choice = part_budget.choose_parts(sized, budget // processes, pool, units_of)
    LOG.info("%s%s", choice.describe(), f", {processes} worker processes" if processes > 1 else "")
    return dataclasses.replace(cfg, parts=choice.parts)


def run(cfg: PreprocessConfig, *, wikipedia: list[str], books: list[str], tokenizer: str, output: str,
        beam_args: list[str] = (), overwrite: bool = False, progress: bool | None = None,
        verbose: bool = False) -> dict:
    """Run the whole stage and return the manifest (its ``summary`` has the headline figures). A local output
    is held by ``DIR.lock`` while the run writes it: a second run on it is refused, naming the first."""
    if storage.is_local(output):  # one writer per dataset; object stores have no lock of ours
        lock = Path(storage.local_path(output).rstrip("/") + ".lock")
        with writelock.hold(lock, f"the dataset {output}"):
            return _run(cfg, wikipedia=wikipedia, books=books, tokenizer=tokenizer, output=output,
                        beam_args=beam_args, overwrite=overwrite, progress=progress, verbose=verbose)
    return _run(cfg, wikipedia=wikipedia, books=books, tokenizer=tokenizer, output=output, beam_args=beam_args,
                overwrite=overwrite, progress=progress, verbose=verbose)


def _run(cfg: PreprocessConfig, *, wikipedia: list[str], books: list[str], tokenizer: str, output: str,
         beam_args: list[str], overwrite: bool, progress: bool | None, verbose: bool) -> dict:
    from common.tokenizer import load_tokenizer

    started = time.time()
    beam_args = list(beam_args)
    options = beam_options(beam_args, verbose)
    log = WorkerLog(verbose)
    sized = resolve_inputs(wikipedia, books, tuple(cfg.inputs))
    cfg = fit_memory_budget(cfg, sized, beam_args)
    tok = load_tokenizer(tokenizer, lowercase=cfg.tokenizer.lowercase)
    staging = prepare_output(output, overwrite)
    try:
        tokenizer_uri = storage.join(staging, schema.TOKENIZER_DIR)
        tok.save(tokenizer_uri)
        share_tokenizer(tokenizer_uri, tok)  # in-process and forked workers need not load it again
        pool_workers = beamargs.local_pool_size(beam_args)
        plan = Plan.build(cfg, sized, tok, staging, tokenizer_uri, slices=max(cfg.parts, pool_workers))
        pipelines = 1 if plan.parts == 1 else len(plan.file_parts()) + plan.parts + 2
        with _progress(progress, 4 if pool_workers else pipelines) as bar:
            if pool_workers:
                with log:
                    local.run_stages(plan, pool_workers, beamargs.without_worker_options(beam_args), bar)
            else:
                run_on_beam(plan, options, log, beamargs.runs_in_one_process(beam_args), bar)
        run_evaluation(plan, log)
        return publish_dataset(cfg, tok, plan, output, started, log)
    except BaseException as error:
        discard_failed(staging, output, log)
        failure = output_failure(error, staging) if isinstance(error, Exception) else None
        if failure is not None:
            raise failure from error
        raise


def output_failure(error: BaseException, staging: str) -> StorageError | None:
    """A full disk or missing permission as one line (None for other errors): where it was the dataset being
    written, the message names the staging location and says that nothing was published."""
    failure = storage_failure(error)
    if failure is None or (failure.path and not failure.path.startswith(staging.rstrip("/"))):
        return failure  # an input or the tokenizer, named by the error
    return storage_failure(error, path=staging, doing="writing the dataset", fix="choose another --output",
                           note="nothing was published")


def _progress(progress: bool | None, steps: int):
    """A progress bar of ``steps`` steps on stderr: shown when ``progress``, or when None and stderr is a terminal."""
    from tqdm import tqdm

    show = progress if progress is not None else sys.stderr.isatty()
    tqdm.monitor_interval = 0  # no monitor thread: the local pool forks its workers only from a single thread
    return tqdm(total=steps, desc="preprocess", unit="stage", file=sys.stderr, disable=not show)


def run_on_beam(plan: Plan, options, log: WorkerLog, in_process: bool, bar) -> None:
    """The plan's stages on Beam's runner: as one pipeline, or (with parts) as several that meet at the work files.

    Args:
        in_process: the runner runs each pipeline entirely in this process (see ``beamrun.run_beam``).
    """
    def run(build) -> None:
        run_beam(options, build, log, in_process=in_process)

    file_parts = plan.file_parts()
    if plan.parts == 1:
        # One pipeline: worker processes start once, and the runner may overlap the stages.
        bar.set_postfix_str("documents → index → instances → shards")
        run(lambda p, lot: (p | "Files" >> beam.Create(file_parts[0], reshuffle=False)  # documents() spreads them
                            | plan.documents(0, lot) | plan.index(lot) | plan.instances(0, lot) | plan.shards(lot)))
        bar.update()
        return
    for part, files in enumerate(file_parts):
        bar.set_postfix_str(f"documents, part {part + 1}/{len(file_parts)}")
        run(lambda p, lot, part=part, files=files: (
            p | "Files" >> beam.Create(files, reshuffle=False) | plan.documents(part, lot)))
        bar.update()
    bar.set_postfix_str("index")
    run(lambda p, lot: p | "Start" >> beam.Create([None]) | plan.index(lot))
    bar.update()
    for part, units in enumerate(plan.instance_units(plan.parts)):
        bar.set_postfix_str(f"instances, part {part + 1}/{plan.parts}")
        if units:
            run(lambda p, lot, part=part, units=units: (
                p | "Units" >> beam.Create(units, reshuffle=False) | plan.instances(part, lot)))
        bar.update()
    bar.set_postfix_str("shards")
    run(lambda p, lot: p | "Start" >> beam.Create([None]) | plan.shards(lot))
    bar.update()


__all__ = ["run", "run_on_beam"]
