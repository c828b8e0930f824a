"""The preprocessing driver: runs the Beam stages and publishes the dataset atomically.

Stages (see ``preprocess.transforms`` and ``preprocess.barriers``):

1. documents: read, clean, split, tokenize -> a document store partitioned into hash buckets;
2. index: count each bucket's documents (duplicate ids dropped) -> every document's global index;
3. instances: BERT instances; a random next segment comes from any document of the corpus through a
   keyed join -> key-range pieces, sorted;
4. shards: equal-size, globally shuffled Arrow shards; then the manifest, written last.

With ``parts == 1`` all four run as one Beam pipeline. With ``parts > 1`` the documents and
instances stages run once per part (input files, then bucket ranges), so the DirectRunner holds one
part at a time. Every random choice is keyed by (seed, document, duplicate, index) and documents are
ordered by hash, so the dataset is byte-identical whatever the parts, workers or runner.
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
from preprocess import barriers, beamargs, local, memory, transforms
from preprocess.beamrun import WorkerLog, beam_options, run_beam
from preprocess.memory import split_parts
from preprocess.plan import bucket_bits_for, resolve_inputs
from preprocess.publish import discard_failed, prepare_output, publish_dataset

LOG = logging.getLogger("preprocess")


def fit_memory_budget(cfg: PreprocessConfig, sized: list[tuple[str, str, int]],
                      beam_args: list[str]) -> PreprocessConfig:
    """``cfg`` with the parts that ``max_memory`` asks for (unchanged without it); logs the choice. The local pool
    runs one part per worker process at a time, so each process gets its share of the budget."""
    if cfg.max_memory is None:
        return cfg
    processes = max(1, beamargs.local_pool_size(beam_args))
    budget = sizes.parse_size(cfg.max_memory)
    choice = memory.choose_parts(sized, budget // processes)
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
    options = beam_options(list(beam_args), verbose)
    log = WorkerLog(verbose)
    sized = resolve_inputs(wikipedia, books)
    cfg = fit_memory_budget(cfg, sized, list(beam_args))
    tok = load_tokenizer(tokenizer, lowercase=cfg.tokenizer.lowercase)
    staging = prepare_output(output, overwrite)
    try:
        tokenizer_uri = storage.join(staging, schema.TOKENIZER_DIR)
        tok.save(tokenizer_uri)
        transforms.share_tokenizer(tokenizer_uri, tok)  # in-process and forked workers need not load it again
        work = storage.join(staging, "_work")
        file_parts = split_parts(sized, min(cfg.parts, len(sized)))
        bucket_bits = bucket_bits_for(sized, max(cfg.parts, beamargs.local_pool_size(list(beam_args))))
        _run_stages(cfg, options, log, file_parts, bucket_bits, work, staging, tokenizer_uri, tok, progress,
                    list(beam_args), sized)
        return publish_dataset(cfg, tok, sized, bucket_bits, work, staging, output, started, log)
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


def _run_stages(cfg: PreprocessConfig, options, log, file_parts, bucket_bits: int, work: str, staging: str,
                tokenizer_uri: str, tok, progress: bool | None, beam_args: list[str], sized_files) -> None:
    """Run the stages: as one Beam pipeline, or (with parts) as several that meet at the work files."""
    from tqdm import tqdm

    num_buckets = 1 << bucket_bits
    out_schema = schema.instance_schema(tok.vocab_size, cfg.output.provenance, {
        "max_seq_length": cfg.instances.max_seq_length, "vocab_sha256": tok.identity()["vocab_sha256"]})

    spread = not beamargs.runs_in_one_process(beam_args)

    def documents(part):
        return transforms.BuildDocumentStore(cfg.sources, tokenizer_uri, bucket_bits, work, part, tok.vocab_size,
                                             spread=spread)

    def instances(part):
        return transforms.CreateInstances(tokenizer_uri, work, cfg.instances, cfg.seed, part, tok.vocab_size,
                                          tok.mask_id, spread=spread, provenance=cfg.output.provenance,
                                          by_reference=not spread)

    index = barriers.IndexCorpus(work, num_buckets, cfg.instances, spread=spread)
    write_shards = barriers.WriteShards(work, staging, cfg.output, out_schema, spread=spread)
    pool_workers = beamargs.local_pool_size(beam_args)
    steps = 4 if pool_workers else 1 if cfg.parts == 1 else len(file_parts) + cfg.parts + 2
    show = progress if progress is not None else sys.stderr.isatty()
    tqdm.monitor_interval = 0  # no monitor thread: the local pool forks its workers only from a single thread
    with tqdm(total=steps, desc="preprocess", unit="stage", file=sys.stderr, disable=not show) as bar:
        if pool_workers:
            with log:
                local.run_stages(cfg, pool_workers, beamargs.without_worker_options(beam_args), sized_files,
                                 bucket_bits, work, staging, tokenizer_uri, tok, out_schema, bar)
            return
        if cfg.parts == 1:
            # One pipeline: worker processes start once, and the runner may overlap the stages.
            bar.set_postfix_str("documents → index → instances → shards")
            run_beam(options, lambda p: (
                p | "Files" >> beam.Create(file_parts[0], reshuffle=False)  # documents() spreads the files
                | documents(0) | index | instances(0) | write_shards), log)
            bar.update()
            return
        for part, part_files in enumerate(file_parts):
            bar.set_postfix_str(f"documents, part {part + 1}/{len(file_parts)}")
            run_beam(options, lambda p, part=part, part_files=part_files: (
                p | "Files" >> beam.Create(part_files, reshuffle=False) | documents(part)), log)
            bar.update()
        bar.set_postfix_str("index")
        run_beam(options, lambda p: p | "Start" >> beam.Create([None]) | index, log)
        bar.update()
        counts = storage.read_json(storage.join(work, transforms.INDEX_NAME))["counts"]
        non_empty = {bucket for bucket, count, _ in counts if count}
        for part, (lo, hi) in enumerate(barriers.bucket_ranges(num_buckets, cfg.parts)):
            bar.set_postfix_str(f"instances, part {part + 1}/{cfg.parts}")
            part_buckets = [b for b in range(lo, hi) if b in non_empty]
            if part_buckets:
                run_beam(options, lambda p, part=part, part_buckets=part_buckets: (
                    p | "Buckets" >> beam.Create(part_buckets, reshuffle=False) | instances(part)), log)
            bar.update()
        bar.set_postfix_str("shards")
        run_beam(options, lambda p: p | "Start" >> beam.Create([None]) | write_shards, log)
        bar.update()


__all__ = ["run"]
