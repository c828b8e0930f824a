"""``model.compile``: the module a run trains, run through ``torch.compile`` (TorchInductor) in place, by region.

What is compiled: the regions of the module DeepSpeed wraps (the family's objective, or in finetuning the task
model), as PyTorch's regional compilation does. A transformer is one block repeated: every block of a
``ModuleList`` of one class (BERT's encoder layers, ALBERT's shared layer group, ELECTRA's generator and
discriminator layers) is compiled on its own, and since TorchDynamo treats a module's parameters as inputs, the
graph compiled for the first block serves every other one: BERT-Large compiles one layer, not 24. Beside the blocks,
the modules hanging off their ancestors (embeddings, pooler, prediction heads) are compiled one by one; the
objective's glue (gathering masked positions, the losses, ELECTRA's sampling from a ``torch.Generator``) runs
eagerly between them. A module held in a plain attribute (a distillation teacher, kept out of DeepSpeed's reach) is
compiled by the same rule. ``regional=False`` compiles the whole module as one graph (longer to compile, one fusion
scope): the GPU benchmark compares the two.

``nn.Module.compile`` compiles in place: every module stays the same object with the same ``state_dict`` names (no
``_orig_mod.`` prefix, which ``torch.compile(module)`` would add), so checkpoints and Hugging Face exports of a
compiled run are those of an eager run, and either resumes from the other. Activation checkpointing
(``torch.utils.checkpoint``, non-reentrant) calls the compiled block again in backward.

Shapes: a micro-batch's width (its longest row, rounded up to ``data.pad_multiple``) and its number of masked
positions change from batch to batch. Compiled with static shapes, every new (width, masked count) pair would compile
another graph, and after ``torch._dynamo.config.recompile_limit`` of them the region would run eagerly. Compiled with
``dynamic=True`` every size but the parameters' is symbolic from the first call, so one graph per region serves
every batch (one more where a size of 1 specialises, e.g. a last batch of one row); tests/pretrain/test_compiling.py
counts the graphs over many widths. ``RecompileLimitWatch`` counts them during a run, and says so in the log when
TorchDynamo gave up on a region (its recompile limit) and left it eager. The padding-free encoder
(``models.attention.Unpadding``: finetuning's heads by default, pretraining's ``model.padding_free``) reads
data-dependent sizes (the number of real tokens, the longest row) in the eager glue, so the compiled blocks see only
tensors.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Callable

import torch
from torch import nn

BACKEND = "inductor"
ISA_PREFIX = "isa-"
# Graphs a kind of region may compile before TorchDynamo runs it eagerly. Sizes are symbolic, so what adds graphs is
# a new configuration, not a new width: train and eval, grad and no_grad, a size of 1, and one per distinct width of
# the parameters (ELECTRA's generator and discriminator layers, a distillation teacher's and student's) - past
# torch's default of 8 for the two-model families.
RECOMPILE_LIMIT = 16


def compile_module(module: nn.Module, regional: bool = True, *, cuda_graphs: bool = False,
                   cache: str | None = None) -> nn.Module:
    """``module`` itself, its regions (or, with ``regional=False``, all of it) compiled in place with symbolic sizes,
    the kernels cached per CPU instruction set (``key_cache_by_isa``) under ``cache`` (``use_cache``) or torch's
    default directory. ``cuda_graphs``: the compiled graphs replay as CUDA graphs (``mode="reduce-overhead"``), one
    launch each instead of one per kernel; each call of ``module`` (a micro-batch) starts a new step of torch's CUDA
    graph trees, whose buffers the previous micro-batch's backward has finished with. Graphs on CPU tensors run as
    without it."""
    if cache is not None:
        use_cache(cache)
    key_cache_by_isa()
    mode = {"mode": "reduce-overhead"} if cuda_graphs else {}
    if cuda_graphs:
        module.register_forward_pre_hook(_new_cuda_graph_step)
    if not regional:
        module.compile(backend=BACKEND, dynamic=True, **mode)
        return module
    for part in regions(module):
        # The region's own ``forward``, not ``nn.Module.compile``'s ``_call_impl``: TorchDynamo keeps its graphs and
        # counts its recompile limit per code object, and ``_call_impl`` is one code object for every module class,
        # so embeddings, layers and heads of all families in a process would share one limit of 8. A class's
        # ``forward`` is shared by its instances only: the layers reuse one graph, and each kind of region has a
        # limit of its own (its hooks still run, eagerly, around it).
        part.forward = torch.compile(part.forward, backend=BACKEND, dynamic=True, recompile_limit=RECOMPILE_LIMIT,
                                     **mode)
    return module


def _new_cuda_graph_step(module: nn.Module, args) -> None:
    torch.compiler.cudagraph_mark_step_begin()


def use_cache(directory: str) -> str:
    """Keep TorchInductor's compiled kernels (and its FX graph and AOTAutograd caches) in ``directory``, so that a
    later run that finds them there (another node on a shared file system, a resumed job) starts warm.

    What the cache holds is code that the process loads and runs, so the directory must be one only this user can
    write: owned by this user, not writable by group or others (created so when missing). A directory anyone else
    could write is refused (``ValueError``), since whoever writes it chooses the code our ranks run.
    """
    path = os.path.abspath(os.path.expanduser(directory))
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        owner = "owned by another user" if info.st_uid != os.getuid() else "writable by group or others"
        raise ValueError(f"model.compile_cache {path} is {owner}; compiled kernels are code every run loads from it: "
                         "use a directory only you can write (mkdir -m 700 DIR)")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path  # read by torch whenever it looks for its cache
    return path


def cache_counts() -> dict[str, int]:
    """Hits and misses of TorchInductor's FX graph cache and of the AOTAutograd cache in this process so far: a
    warm start compiles with hits only."""
    from torch._dynamo.utils import counters

    return {"fx_graph_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
            "fx_graph_misses": int(counters["inductor"]["fxgraph_cache_miss"]),
            "autograd_hits": int(counters["aot_autograd"]["autograd_cache_hit"]),
            "autograd_misses": int(counters["aot_autograd"]["autograd_cache_miss"])}


def regions(module: nn.Module) -> list[nn.Module]:
    """What regional compilation compiles in ``module``: every block of a ``ModuleList`` of one class (the outermost
    such list on a path), and each module with parameters that hangs off the blocks' ancestors (embeddings, heads);
    the same for modules held in plain attributes. A module with no repeated block is one region."""
    found: dict[int, nn.Module] = {}
    for root in [module, *_held(module)]:
        blocks, ancestors = _blocks(root)
        if not blocks:
            found.setdefault(id(root), root)
            continue
        for name, child in root.named_modules(remove_duplicate=False):
            parent = name.rpartition(".")[0] if name else None
            if name in blocks or (parent in ancestors and name not in ancestors and not isinstance(child, nn.ModuleList)
                                  and any(True for _ in child.parameters())):
                for part in _callable(child):
                    found.setdefault(id(part), part)
    return list(found.values())


def _callable(module: nn.Module) -> list[nn.Module]:
    """``module``, or where it only holds modules that are called one by one (no ``forward`` of its own, e.g. BERT's
    pre-training heads), those of its children that have parameters, by the same rule."""
    if type(module).forward is not nn.Module.forward:
        return [module]
    return [part for child in module.children() if any(True for _ in child.parameters()) for part in _callable(child)]


def _blocks(root: nn.Module) -> tuple[set[str], set[str]]:
    """The names of ``root``'s repeated blocks, and of their ancestors ("" for ``root`` itself)."""
    blocks: set[str] = set()
    for name, child in root.named_modules(remove_duplicate=False):  # outer modules first
        if any(name.startswith(f"{block}.") for block in blocks):
            continue  # inside a block already found
        if isinstance(child, nn.ModuleList) and len(child) and len({type(c) for c in child}) == 1:
            blocks.update(f"{name}.{i}" if name else str(i) for i in range(len(child)))
    ancestors = {""}
    for block in blocks:
        parts = block.split(".")
        ancestors.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return blocks, ancestors


def key_cache_by_isa() -> str:
    """Point TorchInductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``) at a
    subdirectory named after the vector instruction set its CPU kernels are generated for; that directory.

    torch 2.13 does not key its cached kernels by that set: a kernel compiled under one (``ATEN_CPU_CAPABILITY=avx2``,
    the AVX2 emulation) and loaded under another returned wrong sums or crashed the process (a shared cache between
    machines of two CPU kinds would do the same; tests/pretrain/test_compiling.py shows it). The variable is the
    process's, read by torch whenever it looks for its cache; it is set once, before the first compile.
    """
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    base = cache_dir().rstrip(os.sep)
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
    compiled = [part for part in [module, *module.modules(), *_plain_modules(module)] if is_compiled(part)]
    kinds = sorted({type(part).__name__ for part in compiled})
    scope = "whole module" if compiled == [module] else f"{len(compiled)} regions ({', '.join(kinds)})"
    return (f"model.compile: torch.compile ({BACKEND}, dynamic shapes) of {type(module).__name__}, in place, "
            f"{scope}; the first steps compile its graphs")


def graphs_compiled() -> int:
    """Graphs TorchDynamo has compiled in this process so far (each recompilation counts)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class RecompileLimitWatch(logging.Handler):
    """Says, through ``report``, when TorchDynamo stops compiling a region because it reached its recompile limit
    (the region then runs eagerly for the rest of the process, which torch only mentions in its own log), and keeps
    the graph count since it was made. Attach with ``with RecompileLimitWatch(report):``."""

    LOGGER = "torch._dynamo.convert_frame"

    def __init__(self, report: Callable[[str], None]):
        super().__init__(logging.WARNING)
        self.report, self.limits_hit, self.graphs_before = report, 0, graphs_compiled()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("torch._dynamo hit config."):
            self.limits_hit += 1
            first, _, rest = message.partition("\n")
            where = next((line.split(":", 1)[1].strip() for line in rest.splitlines() if "function:" in line), "?")
            self.report(f"model.compile: TorchDynamo reached its {first.removeprefix('torch._dynamo hit ')} for {where}: "
                        "that code runs eagerly from here on (fewer shapes: a larger data.pad_multiple)")

    def graphs(self) -> int:
        return graphs_compiled() - self.graphs_before

    def __enter__(self) -> "RecompileLimitWatch":
        logging.getLogger(self.LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(self.LOGGER).removeHandler(self)

    @classmethod
    def for_process(cls, report: Callable[[str], None]) -> None:
        """Attach one for the rest of the process, unless one is attached (finetuning compiles a model per run)."""
        if not any(isinstance(handler, cls) for handler in logging.getLogger(cls.LOGGER).handlers):
            cls(report).__enter__()


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` itself was compiled in place (as a region, or whole by ``nn.Module.compile``)."""
    return (getattr(module, "_compiled_call_impl", None) is not None
            or hasattr(vars(module).get("forward"), "_torchdynamo_orig_callable"))


def any_compiled(module: nn.Module) -> bool:
    """Whether ``module`` or any of its regions was compiled in place."""
    return any(is_compiled(part) for part in [module, *module.modules(), *_plain_modules(module)])


def _held(module: nn.Module) -> list[nn.Module]:
    """Modules held in ``module``'s plain attributes, not as submodules (a distillation teacher)."""
    return [value for value in vars(module).values() if isinstance(value, nn.Module)]


def _plain_modules(module: nn.Module) -> list[nn.Module]:
    """The modules of ``_held(module)``, theirs included."""
    return [part for held in _held(module) for part in held.modules()]


__all__ = ["BACKEND", "RecompileLimitWatch", "any_compiled", "cache_counts", "compile_module", "describe",
           "graphs_compiled", "is_compiled", "key_cache_by_isa", "regions", "use_cache"]
