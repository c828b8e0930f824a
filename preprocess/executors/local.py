"""Local multi-core execution: the stages as in-memory Beam pipelines in a pool of worker processes.

Beam's own multi-processing DirectRunner passes every element through the runner process over gRPC, which
serialises the job on that process. Here each worker process runs whole
in-memory pipelines: for the documents stage on input units it claims one at a time (files, pieces of large
files), for the instances stage on a range of document buckets, so data moves only through the work
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

from common import writelock
from preprocess import dedup, readers
from preprocess.executors.beamrun import beam_options, run_beam
from preprocess.executors.plan import Plan, bucket_bits_for
from preprocess.layout import bucket_ranges


def estimated_cost(key: str, uri: str, size: int) -> float:
    """Relative cleaning work of a file (its reader's ``cost_per_byte``: a compressed file expands as it is read,
    and wikitext costs more per byte than book text; the factors come from the benchmark corpus)."""
    return size * readers.reader_of(key).cost_per_byte(uri)


def even_pieces(key: str, uri: str, size: int, count: int, inputs=()) -> list[tuple[float, tuple]]:
    """A file's pieces as its reader cuts them without reading it (``inputs``: the config's ``inputs:`` sources)."""
    return readers.reader_of(key).pieces(uri, size, count, readers.spec_of(key, inputs))


def exact_pieces(inputs=()):
    """(key, uri, size, count) -> a file's pieces with their cuts where the work is (a few small reads: a dump's
    block starts, a Parquet file's row groups, ...)."""
    return lambda key, uri, size, count: readers.reader_of(key).pieces(uri, size, count, readers.spec_of(key, inputs),
                                                                       exact=True)


def plan_units(files: list[tuple[str, str, int]], slices: int, bucket_bits: int,
               pieces=even_pieces) -> list[tuple[float, tuple]]:
    """The units of the documents stage, largest first: (estimated cost, (key, uri, piece)).

    A file worth more than half a slice's share is split: into its reader's pieces (``Reader.pieces``: a .bz2
    dump's byte ranges, ...) of at most half a share each, which the processes claim one at a time with the
    smaller units, so that they balance; a large file that its reader cannot cut into one bucket range per slice
    (each read of it keeps the documents of its own buckets). No document is cleaned twice. Pieces are not cut
    finer: for a dump each boundary costs a whole bzip2 block decompressed twice (the range before it reads on to
    finish its last page).

    Args:
        pieces: (key, uri, size, count) -> the file's pieces and their shares (``exact_pieces(inputs)`` gives a
            run's, reading a little of each file it cuts).
    """
    ranges = bucket_ranges(1 << bucket_bits, slices)
    costs = [(estimated_cost(*f), f) for f in files]
    share = sum(c for c, _ in costs) / slices
    units = []
    for cost, (key, uri, size) in costs:
        large = slices > 1 and cost > share / 2
        cut = pieces(key, uri, size, math.ceil(2 * cost / share)) if large else []
        if len(cut) > 1:
            units.extend((cost * fraction, (key, uri, piece)) for fraction, piece in cut)
        elif large:
            units.extend((cost / slices, (key, uri, ("buckets", bucket_bits, lo, hi))) for lo, hi in ranges)
        else:
            units.append((cost, (key, uri, None)))
    return sorted(units, key=lambda u: (-u[0], u[1][1], u[1][2] or ()))


def unit_shares(files: list[tuple[str, str, int]], inputs=()):
    """slices -> (uri, the share of its file) of each unit ``plan_units`` cuts for that many slices, with the
    readers' even pieces (what ``part_budget.pool_peak`` weighs; a Parquet file's footer is read once)."""
    costs = {uri: estimated_cost(key, uri, size) for key, uri, size in files}
    cut: dict[tuple, list] = {}

    def pieces(key: str, uri: str, size: int, count: int) -> list:
        if (uri, count) not in cut:
            cut[uri, count] = even_pieces(key, uri, size, count, inputs)
        return cut[uri, count]

    def shares(slices: int) -> list[tuple[str, float]]:
        units = plan_units(files, slices, bucket_bits_for(files, slices), pieces)
        return [(uri, cost / costs[uri] if costs[uri] else 1.0) for cost, (_, uri, _) in units]

    return shares


def _run(options_args: list[str], build) -> None:
    """One of this worker's pipelines: in-memory, so entirely in this process (payloads handed by reference)."""
    run_beam(beam_options(options_args), build, in_process=True)


# The pool's shared count of claimed document units, set in each worker by _init_worker: multiprocessing lets a
# shared Value reach a worker only through the pool's initializer, not inside a task.
_claimed = None


def _init_worker(claimed) -> None:
    global _claimed
    _claimed = claimed
    writelock.end_with_parent()  # a worker never outlives its driver (nor keeps writing its output)


class ClaimUnits(beam.DoFn):
    """budget -> the next unclaimed (key, uri, piece) units of the shared list, until the list is exhausted or the
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
    plan, options_args, units, budget, part = task
    _run(options_args, lambda p, lot: (p | "Budget" >> beam.Create([budget]) | "Claim" >> beam.ParDo(ClaimUnits(units))
                                       | plan.documents(part, lot)))


def _instances_task(task) -> None:
    plan, options_args, units, part = task
    _run(options_args, lambda p, lot: (p | "Units" >> beam.Create(units, reshuffle=False)
                                       | plan.instances(part, lot)))


def _count_task(task) -> list[tuple]:
    plan, lo, hi = task
    return plan.count_buckets(lo, hi)


def _dedup_keys_task(task) -> int:
    plan, lo, hi = task
    return plan.dedup_keys(lo, hi)


def _duplicates_task(task) -> tuple[int, int]:
    plan, dedup_task = task
    return plan.find_duplicates(dedup_task)


def _split_task(task) -> list[dict]:
    plan, lo, hi, selection = task
    return plan.split_buckets(lo, hi, selection)


def _shards_task(task) -> None:
    plan, shard_ids = task
    for shard in shard_ids:
        plan.write_shard(shard)


def _start_method() -> str:
    """fork where it is safe, else spawn.

    A forked worker starts with this process's modules (a spawned one imports Apache Beam and the tokenizers
    again). Forking is safe while this process runs no other thread: the pool then starts
    before any Beam pipeline here has started runner or gRPC threads that a child would inherit half-way. A
    process that already runs threads (an earlier pipeline, a notebook) spawns, as does macOS, where system
    libraries forbid forking.
    """
    return "fork" if sys.platform.startswith("linux") and threading.active_count() == 1 else "spawn"


def run_stages(plan: Plan, workers: int, options_args: list[str], bar) -> None:
    """The plan's stages with ``workers`` processes; slices = max(workers, parts).

    Args:
        options_args: Beam options for the workers' in-memory pipelines (without the ones that ask for workers).
    """
    slices = max(workers, plan.parts)
    context = multiprocessing.get_context(_start_method())
    claimed = context.Value("q", 0)
    units = plan_units(list(plan.files), slices, plan.bucket_bits, exact_pieces(plan.inputs))
    # A slice's documents stay in its pipeline's memory until it ends: with parts (for a memory budget), each
    # claims about its share (part_budget.pool_peak counts on it); otherwise each runs until no unit is left.
    budget = None if plan.parts == 1 else sum(cost for cost, _ in units) / slices * (1 - 1e-9)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                             initargs=(claimed,)) as pool:
        bar.set_postfix_str(f"documents, {slices} slices on {workers} processes")
        list(pool.map(_documents_task, [(plan, options_args, units, budget, i) for i in range(slices)]))
        if claimed.value < len(units):
            raise RuntimeError(f"only {claimed.value} of {len(units)} input units were read; nothing is published")
        bar.update()
        bar.set_postfix_str("index")
        # The index is a few counts: no pipeline of its own (starting one here would be serial time).
        ranges = bucket_ranges(plan.num_buckets, slices)
        if plan.dedup.enabled:  # duplicates of text first: nothing after sees them
            documents = sum(pool.map(_dedup_keys_task, [(plan, lo, hi) for lo, hi in ranges]))
            tasks = dedup.tasks(documents, plan.dedup)
            list(pool.map(_duplicates_task, [(plan, task) for task in tasks]))
            plan.merge_duplicates(dedup.partition_bits(documents))
        if plan.heldout.enabled:  # the held-out split first: training is counted without its text
            selection = plan.select_heldout()
            plan.write_split([result for results in pool.map(_split_task, [(plan, lo, hi, selection)
                                                                           for lo, hi in ranges])
                              for result in results])
        plan.write_index([row for rows in pool.map(_count_task, [(plan, lo, hi) for lo, hi in ranges]) for row in rows])
        bar.update()
        bar.set_postfix_str("instances")
        list(pool.map(_instances_task, [(plan, options_args, units, i)
                                        for i, units in enumerate(plan.instance_units(slices)) if units]))
        bar.update()
        bar.set_postfix_str("shards")
        shard_ids = list(range(plan.plan_shards()))
        list(pool.map(_shards_task, [(plan, shard_ids[i::workers]) for i in range(min(workers, len(shard_ids)))]))
        bar.update()
