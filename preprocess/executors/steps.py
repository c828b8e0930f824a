"""One part of one step of the stage, for runs split over independent jobs (a Slurm job array, a Kubernetes
Indexed Job): ``python -m preprocess run ... --parts N --part K [--step documents|instances]`` and
``--step finish``.

A run with ``parts = N`` already works in three steps that meet at files under the output's work directory:

1. ``documents``: part K reads, cleans and tokenizes its share of the input files (a size-balanced split);
2. ``instances``: part K builds the instances of its range of document buckets (a random next segment may come
   from any part's documents, so this waits for every part's documents; the corpus index is built by whichever
   part gets there first, identically by all);
3. ``finish``: the globally shuffled shards, the manifest, and the atomic publish.

Here each step of each part can run as its own process, on its own machine and memory budget, and each leaves a
marker when it is complete. A step that finds its marker does nothing, so a resubmitted array redoes only the
parts that failed; a run whose work directory belongs to another run (other inputs, config or tokenizer) is
refused. Every part of a step writes files named by its part or its buckets, so a part that died midway is simply
run again. The dataset is byte-identical to a single ``python -m preprocess run`` of the same inputs.

Without ``--step``, ``--part K`` does part K of the first two steps, waiting (``--wait`` seconds) for the other
parts at each barrier, and part 0 finishes: the form for jobs whose parts all run at once.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from common import configlib, schema, storage
from common.errors import InputError
from common.preprocess_config import PreprocessConfig
from preprocess import docstore
from preprocess.executors import beamargs
from preprocess.executors.beamrun import WorkerLog, beam_options, run_beam
from preprocess.executors.evaluation import run_evaluation
from preprocess.executors.plan import Plan, resolve_inputs
from preprocess.executors.publish import publish_dataset, staging_for
from preprocess.layout import INDEX_NAME
from preprocess.readers.inputs import source_name
from preprocess.stages.barrier import read_metas

LOG = logging.getLogger("preprocess")
STEPS = ("documents", "instances", "finish")
RUN_IDENTITY = "run.json"
# The layout of the work directory's files, recorded in its identity: work of another layout is never mixed in.
# 2: the documents stage's counts in one file per part (doc_counts/), not one per bucket and part.
WORK_LAYOUT = 2
DEFAULT_WAIT_SECONDS = 24 * 3600  # all steps of one part: how long to wait for the other parts at a barrier
POLL_SECONDS = 10.0


def check_request(cfg: PreprocessConfig, step: str | None, part: int | None, beam_args: list[str],
                  overwrite: bool) -> None:
    """Refuse combinations that cannot work, before anything is read."""
    if step is not None and step not in STEPS:
        raise InputError(f"--step {step}: choose from {', '.join(STEPS)}")
    if step == "finish" and part is not None:
        raise InputError("--step finish takes no --part: it runs once, after every part's instances")
    if step in ("documents", "instances") and part is None:
        raise InputError(f"--step {step} needs --part K (0 <= K < parts)")
    if part is not None and not 0 <= part < cfg.parts:
        raise InputError(f"--part {part}: the run has {cfg.parts} part(s) (--parts N or parts in the config), "
                         f"so K goes from 0 to {cfg.parts - 1}")
    if cfg.max_memory is not None:
        raise InputError("max_memory chooses the parts of a whole run; --part/--step runs need a fixed --parts N "
                         "(a run with --max-memory and without --part says which N it would choose)")
    if beamargs.local_pool_size(beam_args):
        raise InputError("--part/--step run one part in this process (or on --runner), not in a pool of worker "
                         "processes (--direct_running_mode multi_processing): drop that option, or for all cores of "
                         "one machine drop --part/--step and use --direct_num_workers N --direct_running_mode "
                         "multi_processing")
    if overwrite:
        raise InputError("--overwrite cannot be combined with --part/--step (the parts run as separate jobs): "
                         "remove the old dataset first, then submit the parts")


def run_step(cfg: PreprocessConfig, *, step: str | None, part: int | None, wikipedia: list[str], books: list[str],
             tokenizer: str, output: str, beam_args: list[str] = (), wait_seconds: float | None = None,
             overwrite: bool = False, verbose: bool = False) -> dict:
    """Run ``step`` for ``part`` (all steps of ``part`` when ``step`` is None). Returns a summary dict; after
    ``finish`` it is the dataset's manifest."""
    from common.tokenizer import load_tokenizer

    check_request(cfg, step, part, list(beam_args), overwrite)
    if wait_seconds is None:
        wait_seconds = 0.0 if step is not None else DEFAULT_WAIT_SECONDS
    started = time.time()
    options, log = beam_options(list(beam_args), verbose), WorkerLog(verbose)
    sized = resolve_inputs(wikipedia, books, tuple(cfg.inputs))
    tok = load_tokenizer(tokenizer, lowercase=cfg.tokenizer.lowercase)
    staging = _staging(output)
    # The tokenizer is saved to the dataset by the finish step; the other steps use private copies.
    plan = Plan.build(cfg, sized, tok, staging, storage.join(staging, schema.TOKENIZER_DIR), slices=cfg.parts)
    _claim(plan.work, cfg, sized, tok, plan.bucket_bits)
    run = _Run(cfg, plan, tok, options, log, output, in_process=beamargs.runs_in_one_process(list(beam_args)))
    if step == "documents":
        return run.documents(part)
    if step == "instances":
        run.await_parts("documents", wait_seconds)
        return run.instances(part)
    if step == "finish":
        run.await_parts("instances", wait_seconds)
        return run.finish(started)
    run.documents(part)
    run.await_parts("documents", wait_seconds)
    summary = run.instances(part)
    if part != 0:
        return {**summary, "note": "part 0 writes the shards and publishes the dataset when every part is done"}
    run.await_parts("instances", wait_seconds)
    return run.finish(started)


def _staging(output: str) -> str:
    """Where the parts meet: DIR.incomplete (renamed into place at the end) or, on object stores, DIR itself."""
    if storage.exists(storage.join(output, schema.MANIFEST_NAME)):
        raise InputError(f"{output} already holds a finished dataset; remove it (or choose another --output) "
                         "before running the parts of a new one")
    return staging_for(output)


def _claim(work: str, cfg: PreprocessConfig, sized, tok, bucket_bits: int) -> None:
    """Record which run the work directory belongs to, or check that it is this one."""
    identity = {"work_layout": WORK_LAYOUT, "parameters": configlib.to_dict(cfg), "bucket_bits": bucket_bits,
                "inputs": [[key, source_name(uri), size] for key, uri, size in sized],
                "tokenizer_vocab_sha256": tok.identity()["vocab_sha256"]}
    uri = storage.join(work, RUN_IDENTITY)
    if not storage.exists(uri):
        # Another part may be claiming at this moment: its identity file (being written, or just written) is fine.
        names = [f.replace("\\", "/").rsplit("/", 1)[-1] for f in storage.list_files(work)]
        if any(name != RUN_IDENTITY and not name.startswith(".tmp-") for name in names):
            raise InputError(f"{work} holds files of an interrupted run that was not split into parts; delete it, "
                             "then run the parts")
        storage.write_json(uri, identity)  # parts starting together write the same bytes
        return
    recorded = storage.read_json(uri)
    if recorded.get("work_layout") != WORK_LAYOUT:
        raise InputError(f"{work} holds the unfinished work of an older version of this pipeline (work layout "
                         f"{recorded.get('work_layout', 1)}, this one writes {WORK_LAYOUT}); delete that directory "
                         "and run every part again")
    if recorded != identity:
        differs = sorted(key for key in identity if recorded.get(key) != identity[key])
        raise InputError(f"{work} holds the unfinished work of another run (it differs in: {', '.join(differs)}); "
                         "give every part the same inputs, config and tokenizer, or delete that directory to "
                         "start over")


def marker(work: str, step: str, part: int) -> str:
    return storage.join(work, "steps", f"{step}-p{part:04d}.json")


class _Run:
    """The steps of one part, run by this process on Beam's runner.

    Args:
        in_process: the runner runs each step's pipeline entirely in this process (see ``beamrun.run_beam``).
    """

    def __init__(self, cfg: PreprocessConfig, plan: Plan, tok, options: PipelineOptions, log: WorkerLog,
                 output: str, in_process: bool):
        self.cfg, self.plan, self.tok, self.options, self.log = cfg, plan, tok, options, log
        self.work, self.output, self.in_process = plan.work, output, in_process

    def _with_tokenizer_copy(self, name: str) -> Plan:
        """The plan with a private copy of the tokenizer for this process's workers: parts never write the same
        file at once."""
        uri = storage.join(self.work, "tokenizers", name)
        self.tok.save(uri)
        return dataclasses.replace(self.plan, tokenizer_uri=uri)

    def _done(self, step: str, part: int) -> dict | None:
        uri = marker(self.work, step, part)
        return storage.read_json(uri) if storage.exists(uri) else None

    def documents(self, part: int) -> dict:
        previous = self._done("documents", part)
        if previous:
            return {**previous, "skipped": "already done"}
        started = time.time()
        file_parts = self.plan.file_parts()
        files = file_parts[part] if part < len(file_parts) else []
        if files:
            plan = self._with_tokenizer_copy(f"documents-p{part:04d}")
            self._beam(lambda p, lot: p | "Files" >> beam.Create(files, reshuffle=False) | plan.documents(part, lot))
        counts = docstore.counts_uri(self.work, part)
        counts = storage.read_json(counts) if storage.exists(counts) else docstore.no_counts()
        summary = {"step": "documents", "part": part, "parts": self.cfg.parts, "files": len(files),
                   "documents": counts["documents"], "tokens": counts["tokens"],
                   "started": started, "seconds": round(time.time() - started, 3)}
        storage.write_json(marker(self.work, "documents", part), summary)
        return summary

    def instances(self, part: int) -> dict:
        previous = self._done("instances", part)
        if previous:
            return {**previous, "skipped": "already done"}
        started = time.time()
        if not storage.exists(storage.join(self.work, INDEX_NAME)):
            # Whichever part gets here first builds it; all compute the same bytes, written atomically.
            self._beam(lambda p, lot: p | "Start" >> beam.Create([None]) | self.plan.index(lot))
        units = self.plan.instance_units(self.plan.parts)[part]
        if units:
            plan = self._with_tokenizer_copy(f"instances-p{part:04d}")
            self._beam(lambda p, lot: (p | "Units" >> beam.Create(units, reshuffle=False)
                                       | plan.instances(part, lot)))
        rows = sum(meta["rows"] for uri, meta in read_metas(storage.join(self.work, "pieces")).items()
                   if uri.replace("\\", "/").endswith(f"/p{part:04d}.json"))
        summary = {"step": "instances", "part": part, "parts": self.cfg.parts, "units": len(units),
                   "instances": rows, "started": started, "seconds": round(time.time() - started, 3)}
        storage.write_json(marker(self.work, "instances", part), summary)
        return summary

    def finish(self, started: float) -> dict:
        # The run began when its first part did: the manifest's wall time and throughput cover all the steps.
        started = min([started] + [storage.read_json(uri).get("started", started)
                                   for uri in storage.list_files(storage.join(self.work, "steps"))])
        self.tok.save(self.plan.tokenizer_uri)
        # A finish that died midway left no manifest, so nothing looks complete; running it again redoes the shards.
        self._beam(lambda p, lot: p | "Start" >> beam.Create([None]) | self.plan.shards(lot))
        run_evaluation(self.plan, self.log)
        return publish_dataset(self.cfg, self.tok, self.plan, self.output, started, self.log)

    def await_parts(self, step: str, wait_seconds: float) -> None:
        """Return when every part has finished ``step``; wait up to ``wait_seconds`` for the missing ones."""
        deadline, said = time.time() + wait_seconds, 0.0
        while True:
            missing = [k for k in range(self.cfg.parts) if not storage.exists(marker(self.work, step, k))]
            if not missing:
                return
            if time.time() >= deadline:
                raise InputError(f"step {step!r} is not done for part(s) {_spans(missing)} of {self.cfg.parts} in "
                                 f"{self.work}: run `--step {step} --part K` for them first (or pass --wait SECONDS "
                                 "to wait for them)")
            if time.time() - said >= 300:
                print(f"waiting for step {step!r} of part(s) {_spans(missing)}", file=sys.stderr, flush=True)
                said = time.time()
            time.sleep(min(POLL_SECONDS, max(0.1, deadline - time.time())))

    def _beam(self, build) -> None:
        try:
            run_beam(self.options, build, self.log, in_process=self.in_process)
        except BaseException:
            if self.log.path:
                LOG.warning("Apache Beam's log of this step: %s", self.log.path)
            raise


def _spans(parts: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans, start = [], None
    for i, part in enumerate(parts):
        if start is None:
            start = part
        if i + 1 == len(parts) or parts[i + 1] != part + 1:
            spans.append(f"{start}-{part}" if part != start else f"{part}")
            start = None
    return ", ".join(spans)
