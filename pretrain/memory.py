"""Per-GPU memory of the model states (parameters, gradients, optimizer states) at a ZeRO stage and precision.

The accounting is the ZeRO paper's (Rajbhandari et al. 2020, sections 3.1 and 5.1). Mixed-precision training
with Adam keeps, per parameter, 2 bytes of 16-bit weights, 2 bytes of 16-bit gradients and K = 12 bytes of
optimizer states (an fp32 master copy of the weights, and Adam's two fp32 moments, 4 bytes each). Over N
data-parallel ranks, ZeRO stage 1 partitions the optimizer states, stage 2 also the gradients, stage 3 also the
parameters; bytes per parameter on each GPU:

    stage 0: 2 + 2 + 12        stage 1: 2 + 2 + 12/N        stage 2: 2 + (2 + 12)/N        stage 3: (2 + 2 + 12)/N

fp32 training has no master copy: 4 + 4 + 8 bytes with the same partitioning. LAMB keeps the same two moments.

One term beyond the paper, because our DeepSpeed config asks for it: bf16 runs accumulate gradients in fp32
(``data_types.grad_accum_dtype``, pretrain/engine.py), and DeepSpeed then holds an fp32 gradient buffer: for
the whole model at stage 1 (its BF16_Optimizer), for the rank's partition at stage 2, and at stage 3 the
gradient partition itself is fp32 (in place of the 16-bit one). With ``zero.offload_optimizer`` the optimizer
states and the rank's fp32 gradient partition live in host memory (ZeRO-Offload), with ``zero.offload_param``
(stage 3) the parameter partition too; they appear in the host column.

A loss module's own trained parameters (``Family.loss_parameters``: SpanBERT's boundary head, TinyBERT's
projections) are trained like the model's and counted with them.

Weights a family holds outside DeepSpeed (``Family.frozen_weights``: a distillation run's teacher, on every rank in
``distillation.teacher_precision``, never trained nor partitioned) are each a line of their own, in the total but
not in the paper's figure.

Not counted: activations, DeepSpeed's communication buckets (``reduce_bucket_size``, ``allgather_bucket_size``),
the allocator's fragmentation and the framework's own memory (CUDA context, or on CPU the Python process).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MOMENT_BYTES = 8            # Adam's and LAMB's first and second moments, fp32
MASTER_BYTES = 4            # fp32 master weights of a 16-bit run
DEFAULT_VOCAB = 30528       # bert-base-uncased's 30,522 ids rounded up to a multiple of 8, as runs do
GIB = 2 ** 30


@dataclass(frozen=True)
class StateMemory:
    """One kind of model state: bytes on each GPU and in each rank's host memory."""

    name: str
    device_bytes: float
    host_bytes: float = 0.0
    zero_state: bool = True  # False: weights held outside DeepSpeed, which ZeRO neither partitions nor offloads


@dataclass(frozen=True)
class MemoryEstimate:
    parameters: int
    world_size: int
    zero_stage: int
    precision: str
    optimizer: str
    rows: tuple[StateMemory, ...]

    @property
    def device_bytes(self) -> float:
        return sum(row.device_bytes for row in self.rows)

    @property
    def host_bytes(self) -> float:
        return sum(row.host_bytes for row in self.rows)

    @property
    def paper_bytes(self) -> float:
        """The ZeRO paper's total (device and host), without DeepSpeed's fp32 gradient accumulation term and the
        weights held outside DeepSpeed."""
        return sum(r.device_bytes + r.host_bytes for r in self.rows
                   if r.name != "fp32 gradient accumulation" and r.zero_state)

    def row(self, name: str) -> StateMemory:
        return next(r for r in self.rows if r.name == name)

    def table(self) -> str:
        lines = [f"Model states per GPU: {self.parameters:,} parameters, ZeRO {self.zero_stage}, {self.precision}, "
                 f"{self.optimizer}, {self.world_size} data-parallel ranks (GiB)",
                 f"  {'':<28}{'per GPU':>10}{'host':>10}"]
        for r in (*self.rows, StateMemory("total", self.device_bytes, self.host_bytes)):
            lines.append(f"  {r.name:<28}{r.device_bytes / GIB:>10.2f}{r.host_bytes / GIB:>10.2f}")
        outside = "".join(f" and the {r.name}" for r in self.rows if not r.zero_state)
        lines.append(f"  (ZeRO paper accounting, without the fp32 gradient accumulation{outside}: "
                     f"{self.paper_bytes / GIB:.2f} GiB; activations and communication buckets not included)")
        return "\n".join(lines)


def estimate(parameters: int, *, world_size: int, zero_stage: int, precision: str, optimizer: str = "adamw",
             offload_optimizer: bool = False, offload_param: bool = False,
             frozen: tuple[tuple[str, int, int], ...] = ()) -> MemoryEstimate:
    """Bytes of model states per GPU (and per rank in host memory) for ``parameters`` trainable parameters, and
    a line for each of ``frozen``'s (what, parameters, bytes per parameter): whole on every GPU, whatever the stage."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero stage must be 0, 1, 2 or 3, got {zero_stage}")
    if precision not in BYTES:
        raise ValueError(f"precision must be one of {sorted(BYTES)}, got {precision!r}")
    if optimizer not in ("adamw", "lamb"):
        raise ValueError(f"optimizer must be adamw or lamb, got {optimizer!r}")
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    n, ranks, width = parameters, world_size, BYTES[precision]
    mixed = precision != "fp32"
    fp32_accumulation = precision == "bf16"  # pretrain/engine.py sets grad_accum_dtype fp32 for bf16 only

    params = n * width / (ranks if zero_stage == 3 else 1)
    grad_width = 4 if zero_stage == 3 and fp32_accumulation else width
    grads = n * grad_width / (ranks if zero_stage >= 2 else 1)
    states = n * (MOMENT_BYTES + (MASTER_BYTES if mixed else 0)) / (ranks if zero_stage >= 1 else 1)
    if offload_optimizer and zero_stage in (1, 2):
        accumulation = 4 * n / ranks  # the fp32 gradient partition that the CPU optimizer steps from
    elif fp32_accumulation and zero_stage in (0, 1):
        accumulation = 4 * n            # BF16_Optimizer's fp32 gradients of the whole model
    elif fp32_accumulation and zero_stage == 2:
        accumulation = 4 * n / ranks
    else:
        accumulation = 0.0              # stage 3 counts its fp32 partition as the gradients

    def placed(name: str, size: float, on_host: bool) -> StateMemory:
        return StateMemory(name, 0.0, size) if on_host else StateMemory(name, size)

    rows = (placed("parameters", params, offload_param and zero_stage == 3),
            placed("gradients", grads, offload_optimizer and zero_stage == 3),
            placed("optimizer states", states, offload_optimizer and zero_stage > 0),
            placed("fp32 gradient accumulation", accumulation, offload_optimizer and zero_stage > 0),
            *(StateMemory(what, float(count * width), zero_state=False) for what, count, width in frozen))
    return MemoryEstimate(n, ranks, zero_stage, precision, optimizer, rows)


def planned_model_config(model, vocab_size: int | None):
    """The ``BertConfig`` a run with this ``ModelConfig`` builds (as pretrain.train.build_model does), for a
    dataset vocabulary of ``vocab_size`` ids (default: bert-base-uncased's). ``init_from`` wins when readable."""
    from pathlib import Path

    from models.bert.hf import load_config
    from models.bert.model import preset
    from pretrain.checkpoints import finished_export

    if model.init_from:
        directory = finished_export(model.init_from) or Path(model.init_from)
        if (directory / "config.json").is_file():
            return load_config(directory)
    vocab = model.vocab_size or (-(-vocab_size // 8) * 8 if vocab_size else DEFAULT_VOCAB)
    config = preset(model.preset, vocab_size=vocab, max_position_embeddings=model.max_position_embeddings)
    return replace(config, **model.dropout_overrides())


def _family_parameters(family, cfg, vocab_size: int | None) -> int:
    """Trainable parameters of the model ``family`` builds for ``cfg`` (on the meta device)."""
    import torch

    vocab = cfg.model.vocab_size or (-(-vocab_size // 8) * 8 if vocab_size else DEFAULT_VOCAB)
    with torch.device("meta"):
        model = family.new_model(vocab_size=vocab, pad_token_id=0)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trained + family.loss_parameters(getattr(model, "config", None))


def estimate_for_run(cfg, world_size: int, vocab_size: int | None = None) -> MemoryEstimate:
    """The estimate for a ``PretrainConfig`` at ``world_size`` ranks, with the family's frozen weights (a
    distillation teacher) on a line of their own; ``auto`` precisions as they resolve on the planned GPU."""
    from models.bert.model import count_parameters
    from pretrain import families
    from pretrain.precision import planning_hardware, resolve_run

    cfg, _ = resolve_run(cfg, planning_hardware())
    family = families.for_config(cfg)
    if cfg.model.family == "bert" and not cfg.distillation.teacher:
        config = planned_model_config(cfg.model, vocab_size)
        parameters = count_parameters(config) + family.loss_parameters(config)  # SpanBERT's boundary head
    else:
        parameters = _family_parameters(family, cfg, vocab_size)
    return estimate(parameters, world_size=world_size, zero_stage=cfg.zero.stage, precision=cfg.train.precision,
                    optimizer=cfg.optimizer.name, offload_optimizer=cfg.zero.offload_optimizer != "none",
                    offload_param=cfg.zero.offload_param != "none", frozen=family.frozen_weights())
