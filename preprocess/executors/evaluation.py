"""The held-out split's own stages, once the training split's are done: its index, instances and shards
(``Plan.evaluation``) over the evaluation store the training index stage wrote (``preprocess.heldout``).

They run as one in-memory pipeline in the driver, whatever runner built the training split: the split is a count
or a small share of the documents, and its rows, like the training rows, depend on their keys alone, so the
evaluation shards are the same bytes for any workers, parts or runner.
"""
from __future__ import annotations

import apache_beam as beam

from preprocess.executors.beamrun import WorkerLog, beam_options, run_beam
from preprocess.executors.plan import Plan


def run_evaluation(plan: Plan, log: WorkerLog | None = None) -> None:
    """The evaluation shards of ``plan``'s held-out split (nothing without one)."""
    if not plan.heldout.enabled:
        return
    evaluation = plan.evaluation()
    run_beam(beam_options([]), lambda p, lot: (p | "Start" >> beam.Create([None]) | evaluation.index(lot)
                                               | evaluation.instances(0, lot) | evaluation.shards(lot)),
             log, in_process=True)


__all__ = ["run_evaluation"]
