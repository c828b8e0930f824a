"""The index stage's DoFns (preprocess.stages.index), on files written by the tests."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.testing.util import assert_that, equal_to

from common.hashing import document_hash
from preprocess import docstore
from preprocess.stages import index
from tests.preprocess.stages.test_documents import test_pipeline


def test_count_bucket_drops_duplicate_ids_across_parts(tmp_path):
    work = str(tmp_path)
    row = lambda doc_id, source: (document_hash(doc_id), doc_id, source, np.arange(5, 15, dtype=np.uint16).tobytes(),
                                  np.asarray([4, 6], np.uint32).tobytes())
    docstore.write_table(f"{work}/docs/b000000/p0000.arrow",
                         docstore.documents_table([row("book:a.txt:00000", "a.txt"), row("book:b.txt:00000", "b.txt")], 100))
    docstore.write_table(f"{work}/docs/b000000/p0001.arrow",
                         docstore.documents_table([row("book:a.txt:00000", "a.txt")], 100))
    with test_pipeline() as p:
        counts = p | beam.Create([0]) | beam.ParDo(index.CountBucket(work))
        assert_that(counts, equal_to([(0, 2, [("book:a.txt:00000", "a.txt")])]))
