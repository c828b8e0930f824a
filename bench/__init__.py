"""Benchmarks of every stage, each a module run from the repository root (``bench/results/`` holds their figures):

    python -m bench.preprocess     the Beam job at scale: CPU against the irreducible work, 1 -> 2 workers, memory, Dask
    python -m bench.loader         the pretraining loader on 10 M and 100 M rows: memory per row, first step, throughput
    python -m bench.pretrain       a training step against ``transformers``, padding share, loader throughput (CPU)
    python -m bench.bert_large     BERT-Large through every stage on CPU: phases 1 and 2, resume, export, finetuning
    python -m bench.finetune       our task heads against ``transformers``' on GLUE, CoNLL-2003 and SQuAD (CPU)
    python -m bench.pretrain_gpu   pretraining throughput and MFU on one GPU
    python -m bench.objectives     the objectives menu side by side: same model, data and CPU budget per recipe

Each takes ``--help``; most have a ``--quick`` mode. What they share: ``record`` (paths, the machine, the versions,
the results file), ``cpu`` (what other processes use meanwhile), ``processes`` (a child process measured whole:
``os.wait4`` CPU of its tree, peak RSS), ``shards`` (pretraining shards built once from the real data) and
``stage_imports`` (a stage's start-up imports, measured as a process of their own). ``bench.preprocess`` is split
into ``preprocess_inputs`` (the 8x input), ``preprocess_runs``, ``preprocess_budget``, ``preprocess_floor``,
``preprocess_dask``, ``preprocess_compare`` and ``preprocess_report``.

This file imports nothing: ``bench.irreducible``, ``bench.preprocess_floor`` and ``bench.stage_imports`` are measured
as whole processes.
"""
