"""One finetuning run: AdamW with linear warm-up and decay, evaluation on dev after every epoch.

The run keeps the epoch with the best dev score when ``select_best_epoch`` is set (the dev-set protocol
of the BERT paper's ablations and of every GLUE dev report); the report says so. Rank-free: finetuning a
BERT-Base/Large fits one GPU; larger models can
run through DeepSpeed ZeRO with the optimizer state offloaded to CPU memory (``deepspeed_zero_stage``).
"""
from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from finetune.config import TrainingConfig
from finetune.heads import pad_batch
from pretrain import precision
from pretrain.compiling import RecompileLimitWatch, compile_module
from pretrain.compiling import describe as describe_compile
from pretrain.schedule import ScheduleConfig, lr_at
from pretrain.weight_decay import parameter_groups

logger = logging.getLogger("finetune")


@dataclass
class RunResult:
    seed: int
    best_epoch: int
    metrics: dict                      # dev metrics of the kept epoch
    primary: float
    history: list = field(default_factory=list)
    train_seconds: float = 0.0
    steps: int = 0


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}  # None: no autocast
_told: set[str] = set()


def resolved_precision(setting: str) -> precision.Choice:
    """``training.precision`` (auto, bf16, fp16, fp32) resolved on this machine's device (``pretrain.precision``):
    logged once per process with its reason, and warned of once when it is a bf16 that this CPU emulates."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    choice = precision.choose(setting, precision.detect(device), what="training.precision")
    if choice.line() not in _told:
        _told.add(choice.line())
        logger.info(choice.line())
    precision.warn_once(choice, logger)
    return choice


def device_and_dtype(setting: str) -> tuple[torch.device, torch.dtype | None]:
    """The device a run computes on and its autocast dtype (None: fp32) for ``training.precision``."""
    return (torch.device("cuda" if torch.cuda.is_available() else "cpu"),
            AUTOCAST[resolved_precision(setting).precision])


def training_record(training: TrainingConfig) -> dict:
    """``training`` as the report records it: its precision resolved, with the reason."""
    choice = resolved_precision(training.precision)
    return {**training.__dict__, "precision": choice.precision, "precision_reason": choice.reason}


def predict(model: torch.nn.Module, rows: list[dict], batch_size: int, pad_id: int, device, dtype) -> list:
    """Model outputs row by row (the inputs without labels), in order."""
    model.eval()
    inputs = ("input_ids", "token_type_ids")
    outputs = []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            batch = pad_batch([{k: r[k] for k in inputs} for r in chunk], pad_id)
            result = model(**{k: v.to(device) for k, v in batch.items()})
            parts = result if isinstance(result, tuple) else (result,)
            for i, row in enumerate(chunk):
                length = len(row["input_ids"])
                per_row = [p[i, :length] if p.dim() >= 2 and p.shape[1] == batch["input_ids"].shape[1] else p[i]
                           for p in parts]
                outputs.append(tuple(p.float().cpu().numpy() for p in per_row) if len(per_row) > 1
                               else per_row[0].float().cpu().numpy())
    return outputs


def finetune(model: torch.nn.Module, train_rows: list[dict], evaluate: Callable[[torch.nn.Module], tuple[dict, float]],
             cfg: TrainingConfig, *, seed: int, pad_id: int, log_dir: Path, name: str) -> RunResult:
    """Train ``model`` on ``train_rows`` (feature dicts with their labels) and evaluate after each epoch."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    device, dtype = device_and_dtype(cfg.precision)
    model.to(device)
    if cfg.compile:  # in place, before DeepSpeed wraps it: the state_dict names stay the eager model's
        compile_module(model)
        logger.info(describe_compile(model))
        RecompileLimitWatch.for_process(logger.warning)
    engine, optimizer, dtype = _optimizer(model, cfg, dtype)
    # fp16 under autocast scales the loss so that small gradients survive (bf16 has fp32's range and needs none).
    scaler = torch.amp.GradScaler(device.type) if engine is None and dtype is torch.float16 else None
    steps_per_epoch = math.ceil(len(train_rows) / cfg.batch_size)
    total_steps = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    schedule = ScheduleConfig(total_steps=total_steps, warmup_proportion=cfg.warmup_proportion)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir / f"{name}-seed{seed}.jsonl").open("w")
    writer = _tensorboard(log_dir / "tensorboard" / f"{name}-seed{seed}")
    bar = _progress(total_steps, f"{name} seed {seed}")
    result = RunResult(seed=seed, best_epoch=-1, metrics={}, primary=-math.inf)
    best_state, step, started = None, 0, time.time()
    epoch = 0
    while step < total_steps:
        model.train()
        order = rng.permutation(len(train_rows))
        for start in range(0, len(order), cfg.batch_size):
            if step >= total_steps:
                break
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg.lr, schedule)
            batch = pad_batch([train_rows[i] for i in order[start:start + cfg.batch_size]], pad_id)
            inputs = {k: v.to(device) for k, v in batch.items()}
            loss = _step(model, engine, optimizer, scaler, inputs, dtype, cfg.max_grad_norm)
            step += 1
            if bar is not None:
                bar.update(1)
            if step % 50 == 0 or step == total_steps:
                record = {"step": step, "epoch": epoch, "loss": loss.item(), "lr": optimizer.param_groups[0]["lr"]}
                log.write(json.dumps(record) + "\n")
                if writer is not None:
                    writer.add_scalar("train/loss", record["loss"], step)
                    writer.add_scalar("train/lr", record["lr"], step)
        metrics, primary = evaluate(model)
        result.history.append({"epoch": epoch, "step": step, "metrics": metrics, "primary": primary})
        log.write(json.dumps({"epoch": epoch, "step": step, "dev": metrics}) + "\n")
        log.flush()
        if writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    writer.add_scalar(f"dev/{key}", value, step)
        if primary > result.primary or not cfg.select_best_epoch:
            result.best_epoch, result.metrics, result.primary = epoch, metrics, primary
            best_state = None  # dropped before the new copy is taken: one state dict held at most, never one per epoch
            if cfg.select_best_epoch and step < total_steps:
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        epoch += 1
    if best_state is not None:  # an earlier epoch won: hand back its weights
        model.load_state_dict(best_state)
    result.train_seconds, result.steps = time.time() - started, step
    log.close()
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close()
    return result


def _optimizer(model: torch.nn.Module, cfg: TrainingConfig, dtype: torch.dtype | None):
    """(DeepSpeed's engine or None, the optimizer, the autocast dtype): DeepSpeed owns the optimizer, precision and
    clipping when ``deepspeed_zero_stage`` is set (its 16-bit weights need no autocast on top), else AdamW."""
    if cfg.deepspeed_zero_stage >= 0:
        from finetune.zero import finetuning_engine

        engine = finetuning_engine(model, lr=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                                   batch_size=cfg.batch_size, zero_stage=cfg.deepspeed_zero_stage,
                                   offload_optimizer=cfg.offload_optimizer, dtype=dtype)
        return engine, engine.optimizer, None
    return None, torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.999),
                                   eps=1e-6), dtype


def _step(model, engine, optimizer, scaler, inputs: dict, dtype: torch.dtype | None,
          max_grad_norm: float) -> torch.Tensor:
    """One optimizer step on one batch (through DeepSpeed's engine when there is one); its loss."""
    if engine is not None:
        loss, _ = engine(**inputs)
        engine.backward(loss)
        engine.step()
        return loss
    with torch.autocast(inputs["input_ids"].device.type, dtype=dtype, enabled=dtype is not None):
        loss, _ = model(**inputs)
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)  # skipped when the scaled gradients overflowed
        scaler.update()
    else:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    return loss


def _progress(total: int, label: str):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="step", dynamic_ncols=True)


def _tensorboard(path: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional for finetuning
        return None
    return SummaryWriter(str(path))
