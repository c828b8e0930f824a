"""``model.compile``: the module a run trains, run through ``torch.compile`` (TorchInductor) in place.

What is compiled: the module DeepSpeed wraps, i.e. the family's objective (the model and its losses in one
graph), or in finetuning the task model. This is what DeepSpeed's own ``engine.compile()`` compiles too
(``self.module.compile(...)``); doing it before ``deepspeed.initialize`` keeps our engine wrapper the only holder
of DeepSpeed's object. ``nn.Module.compile`` compiles in place: the module stays the same object with the same
``state_dict`` names (no ``_orig_mod.`` prefix, which ``torch.compile(module)`` would add), so checkpoints and
Hugging Face exports of a compiled run are those of an eager run, and either resumes from the other.

Code that TorchDynamo cannot trace is not an error: the graph breaks there and that part runs eagerly (ELECTRA's
sampling from a ``torch.Generator``; a distillation teacher reached through a plain attribute is traced like any
other call). Activation checkpointing (``torch.utils.checkpoint``, non-reentrant) is traced as one region and
recomputed in backward as in eager mode.

Shapes: a micro-batch's width (its longest row, rounded up to 8) and its number of masked positions change from
batch to batch. Compiled with static shapes, every new (width, masked count) pair would compile another graph,
and after ``torch._dynamo.config.recompile_limit`` of them the module would silently run eagerly. Compiled with
``dynamic=True`` every size but the parameters' is symbolic from the first call, so one graph serves every
batch: a run compiles one graph for training and one for evaluation (no_grad), plus one where a size of 1
specialises (a last batch of one row), so the graph count does not need coarser widths
(tests/pretrain/test_compiling.py counts the graphs over many widths); a few static widths (``data.pad_multiple``)
are for what is planned per shape on a GPU (cuDNN attention plans, CUDA graphs), at the padding's cost. The packed
encoder (``pretrain.attention.Packing``: finetuning's heads by default, pretraining's ``model.padding_free``) reads
data-dependent sizes (the number of real tokens, the longest row), where the graph breaks: its forward is a few
graphs, compiled for the first batches and then reused for every width (tests/finetune/test_compiling.py).
"""
from __future__ import annotations

import os
import re

import torch
from torch import nn

BACKEND = "inductor"
ISA_PREFIX = "isa-"


def compile_module(module: nn.Module) -> nn.Module:
    """``module`` itself, compiled in place (its ``state_dict`` names unchanged) with symbolic sizes, its kernels
    cached per CPU instruction set (``key_cache_by_isa``)."""
    key_cache_by_isa()
    module.compile(backend=BACKEND, dynamic=True)
    return module


def key_cache_by_isa() -> str:
    """Point TorchInductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``) at a
    subdirectory named after the vector instruction set its CPU kernels are generated for; that directory.

    torch 2.13 does not key its cached kernels by that set: a kernel compiled under one (``ATEN_CPU_CAPABILITY=avx2``,
    the AVX2 emulation) and loaded under another returned wrong sums or crashed the process (a shared cache between
    machines of two CPU kinds would do the same; tests/pretrain/test_compiling.py shows it). The variable is the
    process's, read by torch whenever it looks for its cache; it is set once, before the first compile.
    """
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    base = cache_dir()
    if os.path.basename(base).startswith(ISA_PREFIX):
        return base
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        vector = str(pick_vec_isa() or "none")
    except ImportError:  # torch moved it: the ATen capability alone still tells the CPU kinds apart
        vector = "unknown"
    name = re.sub(r"[^a-z0-9]+", "_", f"{vector}-{torch.backends.cpu.get_cpu_capability()}".lower())
    keyed = os.path.join(base, ISA_PREFIX + name)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = keyed
    return keyed


def describe(module: nn.Module) -> str:
    """The log line of the compile choice, e.g. for rank 0 at start-up."""
    return (f"model.compile: torch.compile ({BACKEND}, dynamic shapes) of {type(module).__name__}, in place; the "
            "first steps compile its graphs")


def graphs_compiled() -> int:
    """Graphs TorchDynamo has compiled in this process so far (each recompilation counts)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` was compiled in place (``nn.Module.compile``)."""
    return getattr(module, "_compiled_call_impl", None) is not None


__all__ = ["BACKEND", "compile_module", "describe", "graphs_compiled", "is_compiled", "key_cache_by_isa"]
