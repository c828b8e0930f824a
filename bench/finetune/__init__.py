"""Benchmarks of the finetuning stage: ours against ``transformers``' task models (``against_transformers``), and
the exported encoders deployed on CPU through ``transformers`` and ONNX Runtime (``deployment``)."""
