"""The DeepSpeed JSON config of a run: batch sizes, ZeRO and offload, precision, optimizer and monitors, built from
the config sections that decide them. Plain data: it imports no DeepSpeed (``pretrain.engine`` hands it over)."""
from __future__ import annotations

from pathlib import Path

from pretrain.config import BatchPlan, LoggingConfig, OptimizerConfig, TrainConfig, ZeroConfig


def deepspeed_config(plan: BatchPlan, output_dir: str | Path, *, train: TrainConfig, optimizer: OptimizerConfig,
                     zero: ZeroConfig, logging: LoggingConfig) -> dict:
    """The DeepSpeed JSON config for this run at this world size (its precision resolved: ``pretrain.precision``)."""
    opt = optimizer
    if train.precision == "auto":
        raise ValueError("train.precision is auto: resolve it first (pretrain.precision.resolve_run)")
    ds: dict = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.accumulation,
        "gradient_clipping": train.gradient_clipping,
        "steps_per_print": 10 ** 9,          # we log ourselves
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": zero.stage},
        "checkpoint": {"load_universal": False},
    }
    if opt.name == "adamw":
        ds["optimizer"] = {"type": "AdamW", "params": {"lr": opt.lr, "betas": list(opt.betas), "eps": opt.eps,
                                                       "weight_decay": opt.weight_decay,
                                                       "torch_adam": opt.torch_adam, "adam_w_mode": True}}
    if zero.stage >= 1:
        ds["zero_optimization"].update(contiguous_gradients=True, overlap_comm=zero.stage >= 2,
                                       reduce_scatter=True)
        for which in ("optimizer", "param"):
            device = getattr(zero, f"offload_{which}")
            if device != "none":
                block = {"device": device, "pin_memory": True}
                if device == "nvme":
                    block["nvme_path"] = zero.nvme_path
                ds["zero_optimization"][f"offload_{which}"] = block
        if zero.offload_optimizer != "none" and opt.name == "adamw":
            ds["optimizer"]["params"].pop("torch_adam")  # DeepSpeedCPUAdam does the offloaded step
    if train.precision == "bf16":
        ds["bf16"] = {"enabled": True, "check_grad_overflow": True}
        ds["data_types"] = {"grad_accum_dtype": "fp32"}
    elif train.precision == "fp16":
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": train.initial_scale_power,
                      "loss_scale_window": train.loss_scale_window, "hysteresis": train.hysteresis,
                      "min_loss_scale": train.min_loss_scale}
    monitor_dir = str(Path(output_dir) / "monitor")
    if logging.tensorboard:
        ds["tensorboard"] = {"enabled": True, "output_path": monitor_dir, "job_name": "tensorboard"}
    if logging.csv:
        ds["csv_monitor"] = {"enabled": True, "output_path": monitor_dir, "job_name": "csv"}
    return ds
