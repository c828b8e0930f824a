"""The model families: each folder holds one family's model, its Hugging Face import and export and its parity
constants (``bert/``, ``albert/``, ``electra/``), beside what every family shares: the attention kernels and the
unpadded layout (``attention.py``) and Hugging Face directory I/O (``hf_io.py``). ``registry.py`` finds the families
by their ``model_type`` for pretraining, export and finetuning alike.

Pretraining, finetuning and the export import from here; nothing here imports them, DeepSpeed or
torch.distributed (tests/test_import_boundaries.py).
"""
