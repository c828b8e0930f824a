"""Benchmarks of the pretraining stage: the CPU step (``steps``), the GPU step and its grid (``gpu``, ``gpu_grid``,
``gpu_session.sh``), BERT-Large through every stage (``bert_large``), compilation, the loader, padding, the objectives
menu and distillation. Each is run as ``python -m bench.pretrain.<name>`` from the repository root."""
