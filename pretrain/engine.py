"""Everything that touches DeepSpeed: its config, process group, engine, checkpoints and conversions.

The DeepSpeed config is built from the run's typed config here and nowhere else; the rest of the
stage sees the small ``Engine`` wrapper (its step, statistics, collectives and checkpoint calls).
"""
from __future__ import annotations

import contextlib
import io
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from common.errors import ConfigError
from pretrain import peers, safe_loading
from pretrain.config import OptimizerConfig
from pretrain.lamb import Lamb
from pretrain.launch import Rendezvous
from pretrain.peers import unanswered_peers  # noqa: F401 - train.py asks the engine, its one door to the job
from pretrain.schedule import ScheduleConfig, lr_at
from pretrain.weight_decay import parameter_groups


def init_distributed(rendezvous: Rendezvous, timeout_minutes: float) -> None:
    import deepspeed

    rendezvous.export()
    accelerator = deepspeed.get_accelerator()
    if accelerator.device_name() != "cpu":
        accelerator.set_device(rendezvous.local_rank)
    backend = deepspeed.get_accelerator().communication_backend_name()
    _every_group_times_out_after(timedelta(minutes=timeout_minutes))
    with _quiet():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False,
                                   timeout=timedelta(minutes=timeout_minutes), rank=rendezvous.rank,
                                   world_size=rendezvous.world_size)
    if rendezvous.world_size > 1:
        peers.record_host(rendezvous.rank, rendezvous.world_size, timedelta(minutes=timeout_minutes))


def device_type() -> str:
    """The kind of device DeepSpeed's accelerator computes on here: "cuda", "cpu", ..."""
    import deepspeed

    return deepspeed.get_accelerator().device_name().split(":")[0]


def _every_group_times_out_after(timeout: timedelta) -> None:
    """Make ``timeout`` the default of every process group this process creates from now on.

    DeepSpeed creates its own groups without a timeout (the clone of the world group that carries ZeRO's
    gradient reduction, among others), and torch gives such a group its backend's default (30 minutes on
    gloo, 10 on NCCL), not the default group's: a stopped rank then held the others for half an hour. torch
    reads these two module defaults only when a group is created without a timeout.
    """
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timeout
    if isinstance(getattr(distributed_c10d, "default_pg_nccl_timeout", None), timedelta):
        distributed_c10d.default_pg_nccl_timeout = timeout


def barrier() -> None:
    """Wait for every rank (also before an ``Engine`` exists, e.g. while choosing the checkpoint to resume)."""
    dist.barrier()


def broadcast_object(value, src: int = 0):
    """Rank ``src``'s ``value`` (any picklable object) on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def shutdown() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def build(module: torch.nn.Module, ds_config: dict, *, optimizer: OptimizerConfig, schedule: ScheduleConfig):
    """The DeepSpeed engine, with our LR schedule as a LambdaLR that DeepSpeed steps and checkpoints."""
    opt, optimizer = optimizer, None
    if opt.name == "lamb":
        optimizer = Lamb(parameter_groups(module, opt.weight_decay), lr=opt.lr, betas=opt.betas, eps=opt.eps)
    peak = opt.lr

    def scheduler(optim):
        return torch.optim.lr_scheduler.LambdaLR(optim, lambda step: lr_at(step, peak, schedule) / peak)

    return initialize(module, ds_config, optimizer=optimizer, lr_scheduler=scheduler,
                      model_parameters=parameter_groups(module, opt.weight_decay) if optimizer is None else None)


def initialize(module: torch.nn.Module, ds_config: dict, **arguments):
    """``deepspeed.initialize`` of ``module`` (``arguments``: its optimizer, lr_scheduler, model_parameters),
    quietly; DeepSpeed's engine. Finetuning's engine (finetune/zero.py) is made here too."""
    import deepspeed

    try:
        with _quiet():
            engine, *_ = deepspeed.initialize(model=module, config=ds_config, **arguments)
    except ValueError as error:
        translated = _arch_list_error(error)
        if translated is None:
            raise
        raise translated from error
    return engine


def _arch_list_error(error: ValueError) -> ConfigError | None:
    """DeepSpeed 0.19 JIT-builds FusedAdam on first use and cannot parse an architecture with a suffix (``9.0a``),
    which some CUDA images put in TORCH_CUDA_ARCH_LIST: that cause and its fix in one line, not a deep traceback."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    suffixed = [a for a in archs.replace(";", " ").split() if not a.split("+")[0].replace(".", "").isdigit()]
    if not suffixed or "invalid literal for int()" not in str(error):
        return None
    return ConfigError(f"TORCH_CUDA_ARCH_LIST={archs!r}: DeepSpeed cannot JIT-build FusedAdam for "
                       f"{suffixed[0]!r}; set it without the suffix (e.g. TORCH_CUDA_ARCH_LIST=9.0) or "
                       f"optimizer.torch_adam: true")


class Engine:
    """DeepSpeed's engine as the run sees it: ``pretrain.loop.LoopEngine`` for the loop (a step, its learning rate,
    whether it was applied, the gradient norm, the loss scale, the per-step all-reduce), and the checkpoint and
    weight calls of ``pretrain.train``. Nothing outside this module holds DeepSpeed's own object."""

    def __init__(self, engine):
        self.deepspeed = engine
        self.device: torch.device = engine.device
        self.rank: int = engine.global_rank
        self.monitor = getattr(engine, "monitor", None)  # DeepSpeed's TensorBoard/CSV monitor, when it has one

    def lr(self) -> float:
        """The learning rate the next step uses."""
        return self.deepspeed.get_lr()[0]

    def train_micro_batch(self, batch: dict) -> torch.Tensor:
        return train_micro_batch(self.deepspeed, batch)

    def step_applied(self) -> bool:
        """False when the last step was skipped for a non-finite gradient (the bf16/fp16 overflow check)."""
        return self.deepspeed.was_step_applied()

    def grad_norm(self) -> float:
        """The global gradient norm of the last step (NaN when it is unknown)."""
        engine = self.deepspeed
        value = engine.get_global_grad_norm()
        if value is None:
            value = getattr(engine, "our_grad_norm", None)
        return float(value) if value is not None else float("nan")

    def loss_scale(self) -> float:
        optimizer = self.deepspeed.optimizer
        for name in ("cur_scale", "loss_scale"):
            value = getattr(optimizer, name, None)
            if isinstance(value, (int, float)):
                return float(value)
        scaler = getattr(optimizer, "loss_scaler", None)
        return float(getattr(scaler, "cur_scale", getattr(scaler, "loss_scale", 1.0)) or 1.0)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over all ranks, in place."""
        dist.all_reduce(tensor)

    def barrier(self) -> None:
        barrier()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @contextlib.contextmanager
    def evaluating(self):
        """Eval mode (no dropout) without gradients, train mode restored after (``pretrain.evaluation``)."""
        module, was = self.deepspeed, self.deepspeed.training
        module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            module.train(was)

    def forward(self, batch: dict) -> tuple:
        """The wrapped loss module's forward alone: no backward, no step (ZeRO 3 gathers the weights it needs)."""
        return self.deepspeed(**batch)

    def all_gather(self, value) -> list:
        """Every rank's ``value`` (any picklable object), in rank order."""
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, value)
        return gathered

    def save(self, directory: Path, tag: str, client_state: dict) -> None:
        save(self.deepspeed, directory, tag, client_state)

    def load(self, directory: Path, tag: str) -> dict:
        """Load ``directory/tag`` (model, optimizer and scheduler) after the safety scan; its client state."""
        refuse_unsafe(directory / tag)
        with _quiet(), weights_only_loading(directory / tag):
            path, client_state = self.deepspeed.load_checkpoint(str(directory), tag=tag)
        if path is None:
            raise FileNotFoundError(f"{directory / tag}: DeepSpeed found no checkpoint there")
        return client_state or {}

    def weights_finite(self) -> bool:
        """Whether every rank's weights (its part of the module and of the fp32 masters) are finite. A collective."""
        engine = self.deepspeed
        tensors = [getattr(p, "ds_tensor", p) for p in engine.module.parameters()]  # ZeRO 3: this rank's partition
        for name in _MASTER_ATTRIBUTES:
            groups = getattr(engine.optimizer, name, None) or []
            for group in groups:
                tensors.extend(group if isinstance(group, (list, tuple)) else [group])
        bad = any(isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
                  for t in tensors)
        flag = torch.tensor([float(bad)], device=engine.device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() == 0

    def follow_schedule(self, peak_lr: float) -> None:
        """Make the next step's learning rate this run's schedule's, after a checkpoint was loaded.

        The checkpoint brings its own run's rate for the next step (and that run's peak); a run resumed with another
        schedule (more steps, a new peak) would otherwise step at that stale rate, zero if the old schedule had ended.
        """
        scheduler = self.deepspeed.lr_scheduler
        scheduler.base_lrs = [peak_lr] * len(scheduler.base_lrs)
        rates = [peak_lr * rate(scheduler.last_epoch) for rate in scheduler.lr_lambdas]
        optimizers = (scheduler.optimizer.param_groups, self.deepspeed.optimizer.param_groups)
        for groups in {id(g): g for g in optimizers}.values():
            for group, lr in zip(groups, rates):
                group["lr"] = lr
        scheduler._last_lr = rates

    def restore_fp32_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Put full-precision weights into the optimizer's fp32 master copies. A collective: call on every rank.

        DeepSpeed casts the module to bf16/fp16 before it makes its master copies, so weights loaded from an
        fp32 checkpoint would start rounded to 16 bits; this restores them exactly.
        """
        from deepspeed.utils import safe_set_full_fp32_param

        engine = self.deepspeed
        if not (engine.bfloat16_enabled() or engine.fp16_enabled()):
            return
        masters = _unfused_fp16_masters(engine)
        for name, param in engine.module.named_parameters():
            key = name.removeprefix("model.")
            if key in state:
                value = state[key].to(param.device, torch.float32)
                if id(param) in masters:
                    masters[id(param)].data.copy_(value)
                else:
                    safe_set_full_fp32_param(param, value)

    def consolidated_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full fp32 weights of the wrapped module on rank 0 (None elsewhere). A collective: call on every rank.

        With ZeRO (and DeepSpeed's bf16 optimizer) the fp32 master weights live partitioned in the optimizer;
        ``safe_get_full_fp32_param`` reassembles each. Without it, the module's own weights are the masters.
        """
        from deepspeed.utils import safe_get_full_fp32_param

        engine = self.deepspeed
        state, masters = {}, _unfused_fp16_masters(engine)
        for name, param in engine.module.named_parameters():
            full = masters.get(id(param)) if id(param) in masters else safe_get_full_fp32_param(param)
            if engine.global_rank == 0:
                state[name] = (full if full is not None else param.detach()).float().cpu().clone()
        return state if engine.global_rank == 0 else None


def train_micro_batch(engine, batch: dict) -> torch.Tensor:
    """Forward, backward and (at the accumulation boundary) the optimizer step; returns the statistics."""
    loss, stats = engine(**batch)
    engine.backward(loss)
    if engine.is_gradient_accumulation_boundary() and engine.get_global_grad_norm() is None:
        # Without ZeRO or a loss scaler DeepSpeed does not report the norm; the gradients are reduced by now.
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        engine.our_grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    engine.step()
    return stats


def save(engine, directory: Path, tag: str, client_state: dict) -> None:
    """Every rank writes its part of ``directory/tag``; the caller publishes it once all are done.

    A save that fails for want of space or permission raises ``common.errors.StorageError``, one line naming the
    checkpoint and the cause (torch's C++ writer reports a full disk only as a failed write).
    """
    from pretrain.checkpoints import save_failure

    try:
        with _quiet():
            engine.save_checkpoint(str(directory), tag=tag, client_state=client_state, save_latest=False)
    except Exception as error:
        failure = save_failure(error, directory, tag)
        if failure is None:
            raise
        raise failure from error


# Where DeepSpeed's optimizers keep this rank's fp32 masters: ZeRO 1/2, bf16, ZeRO 3, fused and unfused fp16 (no ZeRO).
_MASTER_ATTRIBUTES = ("single_partition_of_fp32_groups", "fp32_groups_flat_partition", "fp32_partitioned_groups_flat",
                      "fp32_groups_flat", "fp32_groups")


def convert_to_universal(directory: Path, tag: str, output: Path) -> None:
    """DeepSpeed's universal checkpoint of ``directory/tag``, loadable on any number of ranks."""
    from argparse import Namespace

    from deepspeed.checkpoint import ds_to_universal

    args = Namespace(input_folder=str(directory / tag), output_folder=str(output), num_extract_workers=1,
                     num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    refuse_unsafe(directory / tag)
    with _quiet(), weights_only_loading(directory / tag):
        ds_to_universal.main(args)


def _unfused_fp16_masters(engine) -> dict[int, torch.Tensor]:
    """fp16 without ZeRO (the LAMB recipe): DeepSpeed's unfused fp16 optimizer keeps one fp32 copy per
    parameter in ``fp32_groups``, which its ``safe_*_full_fp32_param`` helpers do not reach."""
    optimizer = engine.optimizer
    if engine.zero_optimization_stage() != 0 or not hasattr(optimizer, "fp32_groups"):
        return {}
    return {id(low): high for lows, highs in zip(optimizer.fp16_groups, optimizer.fp32_groups)
            for low, high in zip(lows, highs)}


def consolidate_checkpoint(directory: Path, tag: str, zero_stage: int, scratch: Path) -> dict[str, torch.Tensor]:
    """The fp32 weights of a saved checkpoint (any ZeRO stage, any number of ranks), in one process.

    ZeRO 1-3: the checkpoint is converted to DeepSpeed's universal format under ``scratch``, which holds
    each parameter's fp32 master whole. Stage 0: the module's own weights (fp32 masters of an fp16 run
    when the optimizer kept them). The files are DeepSpeed pickles, read as weights only (``refuse_unsafe``).
    """
    if zero_stage > 0:
        convert_to_universal(directory, tag, scratch)
        state = {}
        with weights_only_loading(scratch):
            for param_dir in sorted(p for p in (scratch / "zero").iterdir() if p.is_dir()):
                saved = torch.load(param_dir / "fp32.pt", map_location="cpu", weights_only=True)
                # ZeRO 1/2 store {"param": tensor, ...}; ZeRO 3 the flat tensor (the caller restores shapes).
                state[param_dir.name] = saved["param"] if isinstance(saved, dict) else saved
        return state
    refuse_unsafe(directory / tag)
    with weights_only_loading(directory / tag):
        saved = torch.load(directory / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=True)
    state = {k: v.float() for k, v in saved["module"].items()}
    optimizer = saved.get("optimizer") or {}
    if "fp32_groups" in optimizer:  # fp16 without ZeRO: the optimizer's per-parameter fp32 masters
        names = [n for n, v in saved["module"].items() if v.dtype == torch.float16]
        masters = [t for group in optimizer["fp32_groups"] for t in group]
        if len(names) == len(masters):
            state.update({n: m.float() for n, m in zip(names, masters)})
    return state


# What DeepSpeed 0.19.8 checkpoints hold besides tensors and plain containers, allowed through torch's
# weights-only unpickler (which rebuilds these from their saved fields and calls nothing else):
#   numpy arrays and dtypes: our per-rank RNG state (np.random.get_state()) in the client state;
#   fragment_address: ZeRO 1/2 optimizer files record where each parameter lies in the flat partition;
#   ZeroStageEnum, LossScaler: ZeRO 2/3 optimizer files record the stage and the (static, for bf16) loss scaler.
_SAFE_GLOBALS_ADDED = False


def _allow_checkpoint_types() -> None:
    global _SAFE_GLOBALS_ADDED
    if _SAFE_GLOBALS_ADDED:
        return
    import numpy as np
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    torch.serialization.add_safe_globals([_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)),
                                          fragment_address, ZeroStageEnum, LossScaler])
    _SAFE_GLOBALS_ADDED = True


def refuse_unsafe(path: Path) -> None:
    """Refuse a checkpoint directory with a pickle that would load anything but weights (see safe_loading)."""
    _allow_checkpoint_types()
    safe_loading.refuse_unsafe(path)


def weights_only_loading(path: Path):
    """A context in which every ``torch.load``, DeepSpeed's included, loads weights only (see safe_loading)."""
    _allow_checkpoint_types()
    return safe_loading.weights_only_loading(path)


@contextlib.contextmanager
def _quiet():
    """DeepSpeed prints a lot at INFO on every rank; keep it to warnings unless DS_LOG_LEVEL says otherwise."""
    from deepspeed.utils import logger

    level = logger.level
    if os.environ.get("DS_LOG_LEVEL") is None:
        logger.setLevel("WARNING")
    try:
        with contextlib.redirect_stdout(io.StringIO()) if os.environ.get("DS_LOG_LEVEL") is None else contextlib.nullcontext():
            yield
    finally:
        logger.setLevel(level)
