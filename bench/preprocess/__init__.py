"""Benchmarks of the preprocessing stage (the Apache Beam job), each run as ``python -m bench.preprocess.<name>`` from
the repository root: ``scale`` (the job at scale: CPU against the irreducible work, 1 -> 2 workers, memory, Dask; its
sections ``inputs``, ``runs``, ``budget``, ``floor``, ``dask_runner``, ``compare`` and ``report``), ``calibrate``
(the ``--max-memory`` estimate), ``layout`` (the instance stage at the full corpus's group count), ``irreducible``
(read + clean + split + tokenize alone) and ``docstore_load`` (document-store loading against another tree)."""
