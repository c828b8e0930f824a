"""The run's tokenizer in the DoFns that tokenize (the documents stage) or build instances from tokens (the instances
stage): loaded once per worker process, whatever the number of DoFns and pipelines.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.utils import shared

_TOKENIZERS = shared.Shared()  # one loaded tokenizer per process, whatever the number of DoFns and pipelines


def share_tokenizer(tokenizer_uri: str, tokenizer) -> None:
    """Offers an already loaded ``tokenizer`` to the DoFns of this process (and of processes forked from it) that
    would load ``tokenizer_uri``. The caller keeps it alive (the process-wide cache holds a weak reference)."""
    _TOKENIZERS.acquire(lambda: tokenizer, tag=tokenizer_uri)


class UsesTokenizer(beam.DoFn):
    """Gets the run's tokenizer once per worker process (DoFn.setup), not once per element or per DoFn."""

    def __init__(self, tokenizer_uri: str):
        self._tokenizer_uri = tokenizer_uri
        self.tokenizer = None

    def setup(self):
        from common.tokenizer import keep_batches_on_this_thread, load_tokenizer

        keep_batches_on_this_thread()  # a worker on any runner: one process per core already

        self.tokenizer = _TOKENIZERS.acquire(lambda: load_tokenizer(self._tokenizer_uri), tag=self._tokenizer_uri)
