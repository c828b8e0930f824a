"""Local multi-core execution: the stages as in-memory Beam pipelines in a pool of worker processes.

Beam's own multi-processing DirectRunner passes every element through the runner process over gRPC;
on a 2-core machine it ran this job no faster than one process. Here each worker process runs whole
in-memory pipelines on a slice of the document buckets (documents are filtered by bucket before they
are cleaned), so data moves only through the work files. The slices meet at the same files as the
``parts`` mode, hence the output is byte-identical to a single in-memory run.
"""
from __future__ import annotations

import multiprocessing
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

import apache_beam as beam

from preprocess import shards, stages, storage, transforms


def wants_local_pool(beam_args: list[str]) -> int:
    """N when the local runner is asked for N > 1 worker processes, else 0."""
    args = " ".join(beam_args).replace("=", " ").split()
    runner = args[args.index("--runner") + 1] if "--runner" in args else "DirectRunner"
    if runner not in ("DirectRunner", "direct") or "--direct_num_workers" not in args:
        return 0
    workers = int(args[args.index("--direct_num_workers") + 1])
    mode = args[args.index("--direct_running_mode") + 1] if "--direct_running_mode" in args else "in_memory"
    return workers if workers > 1 and mode == "multi_processing" else 0


def in_memory_args(beam_args: list[str]) -> list[str]:
    """The user's options without the ones that ask for Beam's own worker processes."""
    drop = {"--direct_num_workers", "--direct_running_mode", "--runner"}
    out, skip = [], False
    for arg in beam_args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in drop:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def estimated_cost(kind: str, uri: str, size: int) -> float:
    """Relative cleaning work of a file: compressed dumps expand ~4x and wikitext costs more per byte."""
    compressed = uri.endswith((".bz2", ".gz", ".xz", ".zst"))
    return size * (4.0 if compressed else 1.0) * (1.5 if kind == "wiki" else 1.0)


def assign_files(files: list[tuple[str, str, int]], slices: int, bucket_bits: int) -> list[list[tuple]]:
    """Per slice, the (kind, uri, bucket filter) elements to read.

    A file worth more than half a slice's share is read by every slice, each keeping the documents of its
    own buckets; smaller files go whole to the least-loaded slice. No document is cleaned twice.
    """
    ranges = stages.bucket_ranges(1 << bucket_bits, slices)
    costs = [(estimated_cost(*f), f) for f in files]
    share = sum(c for c, _ in costs) / slices
    load = [0.0] * slices
    assigned: list[list[tuple]] = [[] for _ in range(slices)]
    for cost, (kind, uri, _) in sorted(costs, key=lambda c: (-c[0], c[1][1])):
        if cost > share / 2:
            for i, (lo, hi) in enumerate(ranges):
                assigned[i].append((kind, uri, (bucket_bits, lo, hi)))
                load[i] += cost / slices
        else:
            target = min(range(slices), key=lambda i: (load[i], i))
            assigned[target].append((kind, uri, None))
            load[target] += cost
    return assigned


def _run(options_args, build) -> None:
    from preprocess.pipeline import beam_options, skip_interactive_probe

    skip_interactive_probe()  # a spawned worker (not forked) starts without the driver's setting

    pipeline = beam.Pipeline(options=beam_options(options_args))
    build(pipeline)
    pipeline.run().wait_until_finish()


def _documents_task(task) -> None:
    options_args, files, sources_cfg, tokenizer_uri, bucket_bits, work, part, vocab_size = task
    _run(options_args, lambda p: p | "Files" >> beam.Create(files) | transforms.BuildDocumentStore(
        sources_cfg, tokenizer_uri, bucket_bits, work, part, vocab_size))


def _instances_task(task) -> None:
    options_args, buckets, tokenizer_uri, work, instances_cfg, seed, part, vocab_size, mask_id = task
    _run(options_args, lambda p: p | "Buckets" >> beam.Create(buckets) | transforms.CreateInstances(
        tokenizer_uri, work, instances_cfg, seed, part, vocab_size, mask_id))


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
    ranges = stages.bucket_ranges(num_buckets, slices)
    context = multiprocessing.get_context(_start_method())
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        bar.set_postfix_str(f"documents, {slices} slices on {workers} processes")
        tasks = [(options_args, slice_files, cfg.sources, tokenizer_uri, bucket_bits, work, i, tok.vocab_size)
                 for i, slice_files in enumerate(assign_files(files, slices, bucket_bits))]
        list(pool.map(_documents_task, [t for t in tasks if t[1]]))
        bar.update()
        bar.set_postfix_str("index")
        _run(options_args, lambda p: p | "Start" >> beam.Create([None])
             | stages.IndexCorpus(work, num_buckets, cfg.instances))
        bar.update()
        counts = storage.read_json(storage.join(work, transforms.INDEX_NAME))["counts"]
        non_empty = {bucket for bucket, count, _ in counts if count}
        bar.set_postfix_str("instances")
        tasks = [(options_args, [b for b in range(lo, hi) if b in non_empty], tokenizer_uri, work, cfg.instances,
                  cfg.seed, i, tok.vocab_size, tok.mask_id) for i, (lo, hi) in enumerate(ranges)]
        list(pool.map(_instances_task, [t for t in tasks if t[1]]))
        bar.update()
        bar.set_postfix_str("shards")
        stages.plan_shards(work, cfg.output)
        plan = storage.read_json(storage.join(work, stages.SHARD_PLAN_NAME))
        ids = list(range(plan["num_shards"]))
        list(pool.map(_shards_task, [(work, staging, ids[i::workers], plan["num_shards"], plan["group_rows"],
                                      output_schema) for i in range(min(workers, len(ids)))]))
        bar.update()
