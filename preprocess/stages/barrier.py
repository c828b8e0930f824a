"""What the barrier stages (index, shards) share: a barrier, the optional spreading of a stage's elements over the
workers, and reading the small files that stages hand on.

A barrier is a single-key GroupByKey that completes only when everything upstream has; what the stage after it
needs (the corpus index, the shard plan) is written as JSON under the work directory and read by that stage's DoFns.
So the whole job can run as one Beam pipeline, or as several (one per part) that meet at the same files, on any
runner and without side inputs.
"""
from __future__ import annotations

import apache_beam as beam

from common import storage


class Barrier(beam.PTransform):
    """One element, emitted only after every element of the input has been produced."""

    def expand(self, pcoll):
        return (pcoll | "One" >> beam.Map(lambda _: (0, None)) | "Wait" >> beam.GroupByKey()
                | "Done" >> beam.Map(lambda _: None))


def read_metas(prefix: str) -> dict[str, dict]:
    return {uri: storage.read_json(uri) for uri in storage.list_files(prefix) if uri.endswith(".json")}


def spread(pcoll, label: str, enabled: bool):
    """``pcoll`` redistributed over the runner's workers (a Reshuffle), or as it is where ``enabled`` is False:
    a runner with one worker in this process, where a Reshuffle only costs time (every element is encoded,
    buffered and decoded)."""
    return pcoll | label >> beam.Reshuffle() if enabled else pcoll
