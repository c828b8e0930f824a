"""Benchmarks of every stage, each a module run from the repository root (``bench/results/`` holds their figures):

    python -m bench.preprocess.scale                  the Beam job at scale: CPU against the irreducible work, 1 -> 2
                                                      workers, memory, Dask
    python -m bench.pretrain.loader                   the pretraining loader on 10 M and 100 M rows: memory per row,
                                                      first step, throughput
    python -m bench.pretrain.steps                    a training step against ``transformers``, padding share, loader
                                                      throughput (CPU)
    python -m bench.pretrain.bert_large               BERT-Large through every stage on CPU: phases 1 and 2, resume,
                                                      export, finetuning
    python -m bench.pretrain.gpu                      pretraining throughput and MFU on one GPU (``gpu_grid``: all
                                                      variants in one call)
    python -m bench.pretrain.objectives               the objectives menu side by side: same model, data and CPU
                                                      budget per recipe
    python -m bench.finetune.against_transformers     our task heads against ``transformers``' on GLUE, CoNLL-2003 and
                                                      SQuAD (CPU)
    python -m bench.finetune.deployment               exported encoders on CPU through ``transformers`` and ONNX
                                                      Runtime: latency, throughput, size on disk, peak memory
    python -m bench.cpu_kinds                         the demo's and the test suite's wall time on this kind of CPU
    python -m bench.fingerprints                      what the pipeline makes, to compare before and after a move

The benchmarks of a stage live in its folder, as the packages they measure: ``bench/preprocess/``
(``bench.preprocess.scale`` with its sections, ``calibrate``, ``layout``, ``irreducible``, ``docstore_load``),
``bench/pretrain/`` and ``bench/finetune/``. Each takes ``--help``; most have a ``--quick`` mode. What they share,
here at the top: ``record`` (paths, the machine, the versions, the results file), ``cpu`` (what other processes use
meanwhile), ``processes`` (a child process measured whole: ``os.wait4`` CPU of its tree, peak RSS), ``shards``
(pretraining shards built once from the real data) and ``stage_imports`` (a stage's start-up imports, measured as a
process of their own).

This file imports nothing: ``bench.preprocess.irreducible``, ``bench.preprocess.floor`` and ``bench.stage_imports``
are measured as whole processes.
"""
