"""The preprocessing driver: runs the Beam stages and publishes the dataset atomically.

Stages (see ``preprocess.transforms`` and ``preprocess.stages``):

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
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from common import configlib, schema, sizes, storage, writelock
from common.errors import InputError
from common.preprocess_config import PreprocessConfig
from preprocess import beamargs, handoff, local, memory, shards, sources, stages, transforms
from preprocess.memory import split_parts

LOG = logging.getLogger("preprocess")
FN_API_RUNNER = "apache_beam.runners.portability.fn_api_runner.fn_runner.FnApiRunner"
BYTES_PER_BUCKET = 256 << 10   # input bytes per document-store bucket: small units balance workers


def beam_options(beam_args: list[str], verbose: bool = False) -> PipelineOptions:
    """Pipeline options with the runner pinned: Beam's bare DirectRunner would try to fetch Prism."""
    args = list(beam_args)
    if not verbose and not any(a.startswith("--default_sdk_harness_log_level") for a in args):
        args.append("--default_sdk_harness_log_level=WARNING")  # worker processes otherwise log every bundle
    if not any(a.split("=", 1)[0] in ("--pipeline_type_check", "--no_pipeline_type_check") for a in args):
        # Our transforms declare no type hints, so construction-time checking only infers them from the lambdas'
        # bytecode: about half the time to build the pipeline, and it checks nothing a user can change.
        args.append("--no_pipeline_type_check")
    runner = None
    for i, arg in enumerate(args):
        if arg.startswith("--runner"):
            runner = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
    if "multi_threading" in args or "--direct_running_mode=multi_threading" in args:
        raise InputError("--direct_running_mode multi_threading is not supported: Beam's multi-threaded "
                         "FnApiRunner was seen to drop elements of large groups; use multi_processing")
    if runner is None:
        args.append(f"--runner={FN_API_RUNNER}")
    elif runner in ("DirectRunner", "direct"):
        args = [a for a in args if not a.startswith("--runner") and a != runner] + [f"--runner={FN_API_RUNNER}"]
    return PipelineOptions(args)


def _input_size(uri: str) -> int:
    try:
        return storage.size_of(uri)
    except Exception as exc:  # noqa: BLE001 - every backend words "missing" and "denied" differently
        raise InputError(f"cannot read {uri}: {exc.__class__.__name__}: {exc}; check that it exists and that "
                         "this machine's credentials may read it") from None


class WorkerLog:
    """Sends file descriptor 2 to a log file while Beam runs, unless verbose.

    Beam's multi-processing workers are subprocesses that inherit our stderr and log every start and stop at
    INFO before any option could quiet them. The log is kept only when the run fails.
    """

    def __init__(self, verbose: bool):
        self.path = None
        if not verbose:
            handle, self.path = tempfile.mkstemp(prefix="preprocess-beam-", suffix=".log")
            os.close(handle)

    def __enter__(self):
        if self.path:
            sys.stderr.flush()
            self._saved = os.dup(2)
            with open(self.path, "ab") as log:
                os.dup2(log.fileno(), 2)
        return self

    def __exit__(self, *exc):
        if self.path:
            sys.stderr.flush()
            os.dup2(self._saved, 2)
            os.close(self._saved)
        return False


def run_beam(options: PipelineOptions, log: WorkerLog, build) -> None:
    pipeline = beam.Pipeline(options=options)
    build(pipeline)
    try:
        with log:
            pipeline.run().wait_until_finish()
    finally:
        handoff.clear()  # payloads a failed pipeline left behind


def staging_for(output: str) -> str:
    """Where a run builds its dataset: DIR.incomplete next to a local DIR (renamed into place when complete);
    on object stores DIR itself, where the manifest, written last, marks a finished dataset."""
    if storage.is_local(output):
        staging = storage.local_path(output).rstrip("/") + ".incomplete"
        os.makedirs(staging, exist_ok=True)
        return staging
    return output


def prepare_output(output: str, overwrite: bool) -> str:
    """Return an empty staging location; refuse to clobber a finished dataset unless asked to."""
    if storage.exists(storage.join(output, schema.MANIFEST_NAME)) and not overwrite:
        raise InputError(f"{output} already holds a finished dataset; pass --overwrite or choose another --output")
    if storage.is_local(output):
        storage.remove_tree(storage.local_path(output).rstrip("/") + ".incomplete")  # left by an interrupted run
    else:
        storage.remove_tree(output)  # object stores: files without a manifest are an unfinished run
    return staging_for(output)


def publish(staging: str, output: str) -> None:
    if staging == output:
        return
    output = storage.local_path(output).rstrip("/")
    trash = None
    if os.path.exists(output):
        trash = f"{output}.old-{uuid.uuid4().hex[:8]}"
        os.rename(output, trash)
    os.rename(staging, output)
    if trash:
        storage.remove_tree(trash)


def resolve_inputs(wikipedia: list[str], books: list[str]) -> list[tuple[str, str, int]]:
    """(kind, uri, size in bytes) of every input file; refuses no input, unreadable inputs and clashing names."""
    files = [("wiki", u) for u in sources.expand_inputs(list(wikipedia))] + \
            [("book", u) for u in sources.expand_inputs(list(books))]
    if not files:
        raise InputError("no input files: pass --wikipedia and/or --books")
    names = [sources.source_name(u) for _, u in files]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"input files share a name ({', '.join(dup)}): document ids come from file names, "
                         "so rename one of them")
    return [(kind, uri, _input_size(uri)) for kind, uri in files]


def bucket_bits_for(sized: list[tuple[str, str, int]], slices: int) -> int:
    """Document-store buckets: enough for every slice, and about BYTES_PER_BUCKET of input each."""
    input_bytes = sum(size for _, _, size in sized)
    return min(16, max(stages.bits_for(slices), stages.bits_for(input_bytes / BYTES_PER_BUCKET)))


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
    except BaseException:
        discard_failed(staging, output, log)
        raise


def discard_failed(staging: str, output: str, log: "WorkerLog") -> None:
    """After a failure: remove what would look like a dataset, point at Beam's log."""
    if staging != output or not storage.exists(storage.join(output, schema.MANIFEST_NAME)):
        storage.remove_tree(staging)
    if log.path and os.path.getsize(log.path):
        LOG.warning("Apache Beam's log of this run: %s", log.path)


def publish_dataset(cfg: PreprocessConfig, tok, sized, bucket_bits: int, work: str, staging: str, output: str,
                    started: float, log: "WorkerLog") -> dict:
    """After the shards are written: dead letters, config and manifest (written last), then publish."""
    index_data = storage.read_json(storage.join(work, transforms.INDEX_NAME))
    counts = {b: (c, d) for b, c, d in index_data["counts"]}
    num_docs, corpus, group_bits = index_data["bucket_offsets"][-1], index_data["corpus"], index_data["group_bits"]
    doc_metas = list(stages.read_metas(storage.join(work, "docs")).values())
    stats: dict = {}
    for meta in stages.read_metas(storage.join(work, "pieces")).values():
        stats = shards.merge_counts(stats, meta["stats"])
    total_rows = sum(storage.read_json(storage.join(work, stages.SHARD_PLAN_NAME))["group_rows"])
    shard_meta_dir = storage.join(work, "shards")
    shard_entries = sorted(stages.read_metas(shard_meta_dir).values(), key=lambda e: e["name"])

    dead_letters = sorted((dl for m in doc_metas for dl in m["dead_letters"]),
                          key=lambda d: (d["source"], d["doc_id"]))
    with storage.open_write(storage.join(staging, schema.DEAD_LETTERS_NAME), binary=False) as handle:
        for letter in dead_letters:
            handle.write(json.dumps(letter, sort_keys=True) + "\n")
    with storage.open_write(storage.join(staging, schema.CONFIG_NAME), binary=False) as handle:
        handle.write(configlib.to_yaml(cfg))

    manifest = _manifest(cfg, tok, sized, doc_metas, counts, num_docs, corpus, stats, shard_entries,
                         total_rows, bucket_bits, group_bits)
    storage.remove_tree(work)
    manifest["summary"]["wall_seconds"] = round(time.time() - started, 3)
    manifest["summary"]["corpus_tokens_per_second"] = round(corpus["tokens"] / max(1e-9, time.time() - started), 1)
    storage.write_json(storage.join(staging, schema.MANIFEST_NAME), manifest)  # written last: marks completion
    publish(staging, output)
    if log.path:
        os.unlink(log.path)
    return manifest


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

    index = stages.IndexCorpus(work, num_buckets, cfg.instances, spread=spread)
    write_shards = stages.WriteShards(work, staging, cfg.output, out_schema, spread=spread)
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
            run_beam(options, log, lambda p: (
                p | "Files" >> beam.Create(file_parts[0], reshuffle=False)  # documents() spreads the files
                | documents(0) | index | instances(0) | write_shards))
            bar.update()
            return
        for part, part_files in enumerate(file_parts):
            bar.set_postfix_str(f"documents, part {part + 1}/{len(file_parts)}")
            run_beam(options, log, lambda p, part=part, part_files=part_files: (
                p | "Files" >> beam.Create(part_files, reshuffle=False) | documents(part)))
            bar.update()
        bar.set_postfix_str("index")
        run_beam(options, log, lambda p: p | "Start" >> beam.Create([None]) | index)
        bar.update()
        counts = storage.read_json(storage.join(work, transforms.INDEX_NAME))["counts"]
        non_empty = {bucket for bucket, count, _ in counts if count}
        for part, (lo, hi) in enumerate(stages.bucket_ranges(num_buckets, cfg.parts)):
            bar.set_postfix_str(f"instances, part {part + 1}/{cfg.parts}")
            part_buckets = [b for b in range(lo, hi) if b in non_empty]
            if part_buckets:
                run_beam(options, log, lambda p, part=part, part_buckets=part_buckets: (
                    p | "Buckets" >> beam.Create(part_buckets, reshuffle=False) | instances(part)))
            bar.update()
        bar.set_postfix_str("shards")
        run_beam(options, log, lambda p: p | "Start" >> beam.Create([None]) | write_shards)
        bar.update()


def _fraction(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 6) if denominator else 0.0


def _manifest(cfg, tok, sized, doc_metas, counts, num_docs, corpus, stats, shard_entries, total_rows,
              bucket_bits, group_bits) -> dict:
    skipped, failed = {}, {}
    for meta in doc_metas:
        skipped = shards.merge_counts(skipped, meta["skipped"])
        failed = shards.merge_counts(failed, meta["failed"])
    duplicates = sum(len(dups) for _, dups in counts.values())
    if duplicates:
        skipped["duplicate_id"] = skipped.get("duplicate_id", 0) + duplicates
    read = num_docs + sum(skipped.values()) + sum(failed.values())
    masked = stats.get("masked", {})
    nsp = stats.get("next_sentence", {})
    positions = masked.get("positions", 0)
    return {
        "format": schema.FORMAT_NAME,
        "format_version": schema.FORMAT_VERSION,
        "tokenizer": {**tok.identity(), "dir": schema.TOKENIZER_DIR},
        "token_dtype": schema.token_numpy_dtype(tok.vocab_size),
        "max_seq_length": cfg.instances.max_seq_length,
        "parameters": configlib.to_dict(cfg),
        "inputs": [{"kind": kind, "name": sources.source_name(uri), "bytes": size} for kind, uri, size in sized],
        "rows": total_rows,
        "tokens": stats.get("tokens", 0),
        "shards": shard_entries,
        "layout": {"bucket_bits": bucket_bits, "group_bits": group_bits},
        "statistics": {
            "documents": {"read": read, "used": num_docs, "skipped": skipped, "failed": failed},
            "corpus": corpus,
            "instances": stats,
            "next_sentence_random_fraction": _fraction(nsp.get("random", 0), total_rows),
            "masked_fraction": _fraction(positions, stats.get("tokens", 0)),
            "mask_split": {k: _fraction(masked.get(k, 0), positions) for k in ("mask_token", "random_token", "unchanged")},
            "truncated_fraction": _fraction(stats.get("truncated", 0), total_rows),
        },
        "summary": {"documents": num_docs, "instances": total_rows, "corpus_tokens": corpus["tokens"],
                    "instance_tokens": stats.get("tokens", 0), "shards": len(shard_entries)},
    }


__all__ = ["run", "beam_options"]
