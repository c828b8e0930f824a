"""Local multi-core execution: the stages as in-memory Beam pipelines in a pool of worker processes.

Beam's own multi-processing DirectRunner passes every element through the runner process over gRPC;
on a 2-core machine it ran this job no faster than one process. Here each worker process runs whole
in-memory pipelines: for the documents stage on input units it claims one at a time (files, byte ranges of
large dumps), for the instances stage on a range of document buckets, so data moves only through the work
files. The slices meet at the same files as the ``parts`` mode, hence the output is byte-identical to a
single in-memory run.
"""
from __future__ import annotations

import math
import multiprocessing
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

import apache_beam as beam

from common import storage, writelock
from preprocess import barriers, docstore, dumpsplit, shards, transforms
from preprocess.beamrun import beam_options, run_beam


def estimated_cost(kind: str, uri: str, size: int) -> float:
    """Relative cleaning work of a file: compressed dumps expand ~4x, and wikitext costs about twice as much per
    byte as book text (measured on the benchmark corpus)."""
    compressed = uri.endswith((".bz2", ".gz", ".xz", ".zst"))
    return size * (4.0 if compressed else 1.0) * (2.0 if kind == "wiki" else 1.0)


def plan_units(files: list[tuple[str, str, int]], slices: int, bucket_bits: int,
               cut=lambda uri, size, ranges: ranges) -> list[tuple[float, tuple]]:
    """The units of the documents stage, largest first: (estimated cost, (kind, uri, split)).

    A file worth more than half a slice's share is split: a .bz2 dump into byte ranges (``preprocess.dumpsplit``)
    of at most half a share each, which the processes claim one at a time with the smaller units, so that they
    balance; any other large file into one bucket range per slice (each read of it keeps the documents of its
    own buckets). No document is cleaned twice. Ranges are not cut finer: each boundary costs a whole bzip2 block
    decompressed twice (the range before it reads on to finish its last page), which doubled the decompression
    of a 7-block dump cut into 7 ranges.

    Args:
        cut: (uri, size, even byte ranges) -> the ranges to use; ``block_ranges`` moves them to block starts.
    """
    bucket_ranges = barriers.bucket_ranges(1 << bucket_bits, slices)
    costs = [(estimated_cost(*f), f) for f in files]
    share = sum(c for c, _ in costs) / slices
    units = []
    for cost, (kind, uri, size) in costs:
        large = slices > 1 and cost > share / 2
        pieces = (cut(uri, size, dumpsplit.byte_ranges(size, math.ceil(2 * cost / share)))
                  if large and dumpsplit.splittable(kind, uri) else [])
        if len(pieces) > 1:
            units.extend((cost * (hi - lo) / size, (kind, uri, ("bytes", lo, hi))) for lo, hi in pieces)
        elif large:
            units.extend((cost / slices, (kind, uri, ("buckets", bucket_bits, lo, hi))) for lo, hi in bucket_ranges)
        else:
            units.append((cost, (kind, uri, None)))
    return sorted(units, key=lambda u: (-u[0], u[1][1], u[1][2] or ()))


def block_ranges(uri: str, size: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` of a .bz2 dump moved to block boundaries (a few small reads), so their sizes are their work."""
    from preprocess.sources import open_uri

    with open_uri(uri, decompress=False) as raw:
        return dumpsplit.snap_to_blocks(raw, size, ranges)


def _run(options_args, build) -> None:
    run_beam(beam_options(options_args), build)


_claimed = None  # the pool's shared count of claimed document units (set in each worker by _init_worker)


def _init_worker(claimed) -> None:
    global _claimed
    _claimed = claimed
    writelock.end_with_parent()  # a worker never outlives its driver (nor keeps writing its output)


class ClaimUnits(beam.DoFn):
    """budget -> the next unclaimed (kind, uri, split) units of the shared list, until the list is exhausted or the
    claimed cost reaches ``budget`` (None: no limit).

    Units are claimed one at a time as the fused pipeline finishes the previous one, so a process that drew
    cheap units takes more of them: the work balances itself, whatever the estimates missed. Which process
    reads a unit changes nothing in the output (documents are ordered by hash).
    """

    def __init__(self, units: list[tuple[float, tuple]]):
        self._units = units

    def process(self, budget):
        taken = 0.0
        while budget is None or taken < budget:
            with _claimed.get_lock():
                index = _claimed.value
                _claimed.value += 1
            if index >= len(self._units):
                return
            cost, element = self._units[index]
            taken += cost
            yield element


def _documents_task(task) -> None:
    options_args, units, budget, sources_cfg, tokenizer_uri, bucket_bits, work, part, vocab_size = task
    _run(options_args, lambda p: p | "Budget" >> beam.Create([budget]) | "Claim" >> beam.ParDo(ClaimUnits(units))
         | transforms.BuildDocumentStore(sources_cfg, tokenizer_uri, bucket_bits, work, part, vocab_size,
                                         spread=False))


def _instances_task(task) -> None:
    options_args, buckets, tokenizer_uri, work, instances_cfg, seed, part, vocab_size, mask_id, provenance = task
    _run(options_args, lambda p: p | "Buckets" >> beam.Create(buckets, reshuffle=False) | transforms.CreateInstances(
        tokenizer_uri, work, instances_cfg, seed, part, vocab_size, mask_id, spread=False, provenance=provenance,
        by_reference=True))


def _count_task(task) -> list[tuple]:
    """The index stage's counts for a bucket range: (bucket, documents, duplicates), as ``CountBucket``."""
    work, lo, hi = task
    return [docstore.bucket_count(work, bucket) for bucket in range(lo, hi)]


def _shards_task(task) -> None:
    work, output_dir, shard_ids, num_shards, group_rows, output_schema = task
    for shard in shard_ids:
        entry = shards.assemble_shard(work, output_dir, shard, num_shards, group_rows, output_schema)
        storage.write_json(storage.join(work, "shards", f"s{shard:06d}.json"), entry)


def _start_method() -> str:
    """fork where it is safe, else spawn.

    A forked worker starts with this process's modules (Apache Beam and the tokenizers take about a second of CPU
    to import in each spawned one). Forking is safe while this process runs no other thread: the pool then starts
    before any Beam pipeline here has started runner or gRPC threads that a child would inherit half-way. A
    process that already runs threads (an earlier pipeline, a notebook) spawns, as does macOS, where system
    libraries forbid forking.
    """
    return "fork" if sys.platform.startswith("linux") and threading.active_count() == 1 else "spawn"


def run_stages(cfg, workers: int, options_args: list[str], files, bucket_bits: int, work: str, staging: str,
               tokenizer_uri: str, tok, output_schema, bar) -> None:
    """Documents, index, instances and shards with ``workers`` processes; slices = max(workers, parts).

    Args:
        files: (kind, uri, size in bytes) of every input file.
    """
    num_buckets = 1 << bucket_bits
    slices = max(workers, cfg.parts)
    ranges = barriers.bucket_ranges(num_buckets, slices)
    context = multiprocessing.get_context(_start_method())
    claimed = context.Value("q", 0)
    units = plan_units(files, slices, bucket_bits, block_ranges)
    # A slice's documents stay in its pipeline's memory until it ends: with more slices than processes (parts,
    # for a memory budget), each claims about its share; otherwise each runs until no unit is left.
    budget = None if slices == workers else sum(cost for cost, _ in units) / slices * (1 - 1e-9)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                             initargs=(claimed,)) as pool:
        bar.set_postfix_str(f"documents, {slices} slices on {workers} processes")
        list(pool.map(_documents_task, [(options_args, units, budget, cfg.sources, tokenizer_uri, bucket_bits, work,
                                         i, tok.vocab_size) for i in range(slices)]))
        if claimed.value < len(units):
            raise RuntimeError(f"only {claimed.value} of {len(units)} input units were read; nothing is published")
        bar.update()
        bar.set_postfix_str("index")
        # The index is a few counts: no pipeline of its own (starting one here would be serial time).
        counts = [row for rows in pool.map(_count_task, [(work, lo, hi) for lo, hi in ranges]) for row in rows]
        non_empty = set(barriers.write_index(counts, work, num_buckets, cfg.instances))
        bar.update()
        bar.set_postfix_str("instances")
        tasks = [(options_args, [b for b in range(lo, hi) if b in non_empty], tokenizer_uri, work, cfg.instances,
                  cfg.seed, i, tok.vocab_size, tok.mask_id, cfg.output.provenance) for i, (lo, hi) in enumerate(ranges)]
        list(pool.map(_instances_task, [t for t in tasks if t[1]]))
        bar.update()
        bar.set_postfix_str("shards")
        barriers.plan_shards(work, cfg.output)
        plan = storage.read_json(storage.join(work, barriers.SHARD_PLAN_NAME))
        ids = list(range(plan["num_shards"]))
        list(pool.map(_shards_task, [(work, staging, ids[i::workers], plan["num_shards"], plan["group_rows"],
                                      output_schema) for i in range(min(workers, len(ids)))]))
        bar.update()
