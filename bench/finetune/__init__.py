"""Benchmarks of the finetuning stage: ours against ``transformers``' task models (``against_transformers``)."""
