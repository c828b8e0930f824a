"""DeepSpeed for finetuning: one process's engine for a model too large for plain AdamW on one device.

ZeRO 1-2 with the optimizer state offloaded to CPU memory (ZeRO-Offload) is what lets BERT-Large and larger
finetune on a small GPU. DeepSpeed itself is started and imported by ``pretrain.engine``; this module holds
what finetuning asks of it.
"""
from __future__ import annotations

import torch

from pretrain import engine as ds
from pretrain.launch import Rendezvous
from pretrain.weight_decay import parameter_groups


def finetuning_engine(module: torch.nn.Module, *, lr: float, weight_decay: float, max_grad_norm: float,
                      batch_size: int, zero_stage: int, offload_optimizer: bool, dtype: torch.dtype | None):
    """DeepSpeed's engine around ``module``: AdamW, gradient clipping, bf16 or fp16 (loss-scaled) when ``dtype``
    says so (None: fp32), and the offload.

    The caller sets the learning rate on ``engine.optimizer.param_groups`` every step. A process group of one
    is started here when there is none (finetuning runs in a single process).
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        import socket

        with socket.socket() as sock:  # a free port for the group of one
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ds.init_distributed(Rendezvous(0, 1, 0, "127.0.0.1", port, "single"), timeout_minutes=30)
    config = {"train_batch_size": batch_size, "train_micro_batch_size_per_gpu": batch_size,
              "gradient_accumulation_steps": 1, "gradient_clipping": max_grad_norm, "steps_per_print": 10 ** 9,
              "zero_optimization": {"stage": zero_stage},
              "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-6,
                                                        "weight_decay": weight_decay, "adam_w_mode": True}}}
    if offload_optimizer:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    else:
        config["optimizer"]["params"]["torch_adam"] = True  # no JIT build of FusedAdam for a finetuning run
    if dtype is torch.bfloat16:
        config["bf16"] = {"enabled": True}
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    elif dtype is torch.float16:
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    return ds.initialize(module, config, model_parameters=parameter_groups(module, weight_decay))
