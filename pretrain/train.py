"""The training loop: data, model and engine put together; checkpoints, resume, preemption, faults.

Exit statuses: 0 done; ``PREEMPTED`` (75) saved after SIGUSR1/SIGTERM and wants a requeue;
``DIVERGED`` (3) too many non-finite steps in a row; 1 any other failure.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common import configlib, writelock
from common.manifest import Manifest, ModelRequirements
from pretrain import checkpoints
from pretrain import engine as ds
from pretrain import resume as resume_check
from pretrain.config import PretrainConfig, batch_plan
from pretrain.data import PretrainingLoader, ShardedInstances
from pretrain.hf_compat import export, load_pretrained
from pretrain.launch import Rendezvous
from pretrain.model import BertForPreTraining, flops_per_token, preset
from pretrain.monitor import Monitor, log, peak_tflops
from pretrain.objective import STAT_NAMES, PretrainingObjective

PREEMPTED, DIVERGED = 75, 3
LOCK_NAME = "writer.lock"  # in output_dir while a run writes it
CLIENT_KEY = "bert_pipeline"  # our state inside DeepSpeed's client_state (its own keys share the dict)


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than ``faults.timeout_minutes``."""


class Diverged(RuntimeError):
    """Too many consecutive non-finite steps."""


class _StopFlag:
    """Set by SIGUSR1/SIGTERM; acted on at the next step boundary, once every rank agrees."""

    def __init__(self):
        self.signal = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGUSR1, signal.SIGTERM)}

    def _handle(self, signum, _frame):
        self.signal = signum

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def build_model(cfg: PretrainConfig, manifest: Manifest) -> BertForPreTraining:
    m = cfg.model
    if m.init_from:
        model, fresh = load_pretrained(_hf_directory(Path(m.init_from)))
        if fresh:
            log.info(f"initialised fresh (not in {m.init_from}): {', '.join(fresh)}")
        return model
    vocab = m.vocab_size or -(-manifest.tokenizer.vocab_size // 8) * 8  # a multiple of 8 for tensor cores
    overrides = {k: getattr(m, k) for k in ("hidden_dropout_prob", "attention_probs_dropout_prob")
                 if getattr(m, k) is not None}
    return BertForPreTraining(preset(m.preset, vocab_size=vocab, max_position_embeddings=m.max_position_embeddings,
                                     pad_token_id=manifest.tokenizer.special_ids["[PAD]"], **overrides))


def _hf_directory(path: Path) -> Path:
    """``init_from`` may name one of our run directories; its exported Hugging Face directory is used."""
    return path / "hf" if (path / "hf" / "config.json").is_file() else path


def _check_init_tokenizer(cfg: PretrainConfig, manifest: Manifest) -> None:
    if not cfg.model.init_from:
        return
    from common.tokenizer import load_tokenizer

    directory = _hf_directory(Path(cfg.model.init_from))
    for candidate in (directory / "tokenizer", directory / "vocab.txt"):
        if candidate.exists():
            theirs = load_tokenizer(str(candidate), lowercase=manifest.tokenizer.lowercase).identity()
            if theirs["vocab_sha256"] != manifest.tokenizer.vocab_sha256:
                raise ValueError(f"{candidate} is not the vocabulary the dataset {cfg.data.path} was made with; "
                                 "preprocess with the checkpoint's tokenizer to continue from it")
            return


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_everything(seed: int, rank: int) -> None:
    torch.manual_seed(seed * 1000 + rank)  # dropout differs per rank, reproducibly
    np.random.seed((seed * 1000 + rank) % 2 ** 32)
    random.seed(seed * 1000 + rank)


def run(cfg: PretrainConfig, rendezvous: Rendezvous, *, resume: bool) -> int:
    """Train (or resume) the run of ``cfg``; its exit status. Rank 0 holds the run directory's writer lock."""
    if rendezvous.rank != 0:
        return _run(cfg, rendezvous, resume=resume)
    with writelock.hold(Path(cfg.output_dir) / LOCK_NAME, f"the run directory {cfg.output_dir}"):
        return _run(cfg, rendezvous, resume=resume)


def _run(cfg: PretrainConfig, rendezvous: Rendezvous, *, resume: bool) -> int:
    rank, world = rendezvous.rank, rendezvous.world_size
    out = Path(cfg.output_dir)
    plan = batch_plan(cfg.train, world)
    data = ShardedInstances(cfg.data.path, verify=cfg.data.verify)
    _check_init_tokenizer(cfg, data.manifest)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every run
    model = build_model(cfg, data.manifest)
    data.check(ModelRequirements(model.config.vocab_size, model.config.max_position_embeddings,
                                          special_ids=data.manifest.tokenizer.special_ids))
    model.bert.encoder.gradient_checkpointing = cfg.model.activation_checkpointing
    ckpt_dir = out / "checkpoints"
    found = _resume_point(ckpt_dir, cfg.checkpoint.on_corrupt, rank) if resume else None
    if rank == 0:  # the rank that writes tokenizer/ (others could see it half copied)
        _check_run_tokenizer(out, data)
    if found is not None and "settings" in found.info:
        for change in resume_check.check(found.info["settings"], _settings(cfg, data.manifest), str(found.path)):
            log.info(f"resuming with a changed setting, applied from step {found.step} on: {change}")
    ds_config = ds.deepspeed_config(cfg, plan, out)
    load_from, timings = found, {}  # seconds of the checkpoint work, for summary.json
    if found is not None and found.info["world_size"] != world and cfg.zero.stage > 0:
        began = time.perf_counter()
        load_from = _universal(found, rank)
        timings["universal_conversion_s"] = round(time.perf_counter() - began, 2)
        ds_config["checkpoint"]["load_universal"] = True
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(configlib.to_yaml(cfg))
        (out / "deepspeed_config.json").write_text(json.dumps(ds_config, indent=2) + "\n")
        # The tokenizer travels with the run, so its checkpoints can be exported after the dataset is gone.
        shutil.copytree(data.tokenizer_dir, out / "tokenizer", dirs_exist_ok=True)
    seed_everything(cfg.seed, rank)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()} if cfg.model.init_from else None
    engine = ds.build(cfg, PretrainingObjective(model), ds_config)
    if initial is not None and found is None:
        ds.restore_fp32_weights(engine, initial)
    device = engine.device
    loader = PretrainingLoader(data, micro_batch=plan.micro_batch, accumulation=plan.accumulation, world_size=world,
                               rank=rank, seed=cfg.seed, window_batches=cfg.data.window_batches)
    step, consumed, skipped_total = 0, 0, 0
    if found is not None:
        began = time.perf_counter()
        state = ds.load(engine, load_from.directory, load_from.tag)[CLIENT_KEY]
        timings["checkpoint_load_s"] = round(time.perf_counter() - began, 2)
        ds.follow_schedule(engine, cfg.optimizer.lr)
        loader.load_state_dict(state["data"])
        step, consumed, skipped_total = state["step"], state["consumed_samples"], state["skipped_steps"]
        if state["world_size"] == world:
            set_rng_state(state["rng"][rank])
        else:
            seed_everything(cfg.seed + step, rank)  # a new world size cannot continue the old ranks' streams
        log.info(f"resumed from {found.path} at step {step} ({consumed:,} samples consumed) on {world} ranks")
    elif resume:
        log.info(f"no complete checkpoint in {ckpt_dir}; starting from scratch")
    monitor = Monitor(out if rank == 0 else None, total_steps=cfg.train.max_steps, start_step=step,
                      progress=cfg.logging.progress, ds_monitor=getattr(engine, "monitor", None))
    if step == 0:
        monitor.info(f"{plan.describe()}; {sum(p.numel() for p in model.parameters()):,} parameters; "
                     f"ZeRO {cfg.zero.stage}, {cfg.train.precision}, {cfg.optimizer.name}")
    stop = _StopFlag()
    peak = peak_tflops(torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    window = torch.zeros(len(STAT_NAMES), dtype=torch.float64)
    window_started, window_width, window_steps, consecutive = time.time(), 0, 0, 0
    status, started = 0, time.time()
    try:
        while step < cfg.train.max_steps:
            stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64, device=device)
            lr = engine.get_lr()[0]  # the rate this step uses
            for micro in loader.next_step():
                batch = {k: torch.as_tensor(v).to(device, non_blocking=True) for k, v in micro.items()}
                stats += ds.train_micro_batch(engine, batch).double()
                window_width += micro["input_ids"].shape[1]
            applied = engine.was_step_applied()
            # One small all-reduce per step: the statistics and each rank's view of the stop signal.
            flags = torch.tensor([float(stop.signal is not None)], dtype=torch.float64, device=device)
            reduced = torch.cat([stats, flags])
            dist.all_reduce(reduced)
            stats, signalled = reduced[:-1].cpu(), reduced[-1].item() > 0
            step += 1
            consumed += plan.global_batch
            loss_value = _loss(stats)
            if not applied:
                skipped_total, consecutive = skipped_total + 1, consecutive + 1
                monitor.info(f"step {step}: non-finite loss or gradient; step skipped "
                             f"({consecutive} in a row, {skipped_total} in all)")
                if consecutive >= cfg.faults.max_consecutive_skips:
                    raise Diverged(f"{consecutive} consecutive steps had a non-finite loss or gradient (limit "
                                   f"faults.max_consecutive_skips={cfg.faults.max_consecutive_skips}); stopping. "
                                   f"The last good checkpoint is kept in {ckpt_dir}: resume from it with a lower "
                                   "learning rate, or fp16 -> bf16")
            elif stats[STAT_NAMES.index("nonfinite_losses")] > 0 or not math.isfinite(loss_value):
                raise Diverged(f"step {step}: the loss is not finite and {cfg.train.precision} has no overflow "
                               "check to skip the step; the weights are no longer usable. The last good checkpoint "
                               f"is kept in {ckpt_dir}: resume with bf16 or fp16, or a lower learning rate")
            else:
                consecutive = 0
                window += stats
                window_steps += 1
            monitor.step(loss_value)
            last = step == cfg.train.max_steps
            if window_steps and (step % cfg.logging.log_every == 0 or last):
                elapsed = time.time() - window_started
                width = window_width / (window_steps * plan.accumulation)
                metrics = _metrics(window, step=step, lr=lr, grad_norm=ds.grad_norm(engine),
                                   loss_scale=ds.loss_scale(engine), skipped=skipped_total, elapsed=elapsed,
                                   consumed=consumed, flops_per_token=flops_per_token(model.config, int(width)),
                                   peak_tflops=cfg_peak(cfg, peak), world=world)
                monitor.record(metrics, line=True)
                window.zero_()
                window_started, window_width, window_steps = time.time(), 0, 0
            if signalled:
                name = signal.Signals(stop.signal).name if stop.signal else "a signal on another rank"
                monitor.info(f"received {name}: saving at step {step} and exiting for requeue")
                _save(engine, cfg, loader, out, step, consumed, skipped_total, world, monitor, timings)
                status = PREEMPTED
                break
            if last or (cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0):
                if consecutive:  # keep the last checkpoint from before the trouble as the newest
                    monitor.info(f"step {step}: not checkpointing during a run of skipped steps")
                else:
                    _save(engine, cfg, loader, out, step, consumed, skipped_total, world, monitor, timings)
        if status == 0 and not ds.weights_finite(engine):  # e.g. the last steps were skipped, so never saved
            raise Diverged(f"the final weights hold NaN or inf: the run is not done and {out / 'hf'} is not "
                           f"exported. The last good checkpoint is kept in {ckpt_dir}: resume from it with a lower "
                           "learning rate")
        if status == 0 and cfg.checkpoint.export_hf:
            began = time.perf_counter()
            _export(engine, model, data, out)
            timings["export_hf_s"] = round(time.perf_counter() - began, 2)
    except Diverged as error:
        monitor.info(str(error))
        status = DIVERGED
    except RuntimeError as error:  # torch's DistBackendError included
        if "timed out" not in str(error).lower() and "timeout" not in str(error).lower():
            raise
        raise CollectiveTimeout(
            f"step {step + 1}: a collective (the gradient reduction or the step's statistics) waited longer than "
            f"faults.timeout_minutes ({cfg.faults.timeout_minutes:g}): another rank stopped or hung; the job "
            "stops so that it can be restarted with --resume from the last checkpoint") from None
    finally:
        stop.restore()
        monitor.close()
    if rank == 0:
        summary = {"status": {0: "done", PREEMPTED: "preempted", DIVERGED: "diverged"}[status], "step": step,
                   "consumed_samples": consumed, "skipped_steps": skipped_total, "world_size": world,
                   "wall_seconds": round(time.time() - started, 1), "timings": timings}
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(f"{summary['status']}: step {step}/{cfg.train.max_steps}, {consumed:,} samples, "
                 f"{skipped_total} skipped steps, {summary['wall_seconds']} s on {world} ranks; outputs in {out}")
    return status


def cfg_peak(cfg: PretrainConfig, detected: float | None) -> float | None:
    return cfg.logging.peak_tflops or detected


def _loss(stats: torch.Tensor) -> float:
    s = dict(zip(STAT_NAMES, stats.tolist()))
    return s["mlm_loss_sum"] / max(1.0, s["mlm_tokens"]) + s["nsp_loss_sum"] / max(1.0, s["sequences"])


def _metrics(window, *, step, lr, grad_norm, loss_scale, skipped, elapsed, consumed, flops_per_token,
             peak_tflops, world) -> dict:
    s = dict(zip(STAT_NAMES, window.tolist()))
    tokens_per_second = s["tokens"] / max(elapsed, 1e-9)
    mfu = tokens_per_second * flops_per_token / (peak_tflops * 1e12 * world) if peak_tflops else None
    return {"step": step, "loss": _loss(window), "mlm_loss": s["mlm_loss_sum"] / max(1.0, s["mlm_tokens"]),
            "mlm_accuracy": s["mlm_correct"] / max(1.0, s["mlm_tokens"]),
            "nsp_loss": s["nsp_loss_sum"] / max(1.0, s["sequences"]),
            "nsp_accuracy": s["nsp_correct"] / max(1.0, s["sequences"]), "lr": lr, "grad_norm": grad_norm,
            "loss_scale": loss_scale, "skipped_steps": skipped, "tokens_per_second": tokens_per_second,
            "sequences_per_second": s["sequences"] / max(elapsed, 1e-9), "mfu": mfu, "consumed_samples": consumed}


def _settings(cfg: PretrainConfig, manifest: Manifest) -> dict:
    """What a checkpoint records of the run that wrote it, for ``pretrain.resume``."""
    return {**resume_check.flatten(configlib.to_dict(cfg)), **resume_check.dataset_identity(manifest)}


def _check_run_tokenizer(out: Path, data: ShardedInstances) -> None:
    """A run's ``tokenizer/`` is the vocabulary its weights learn: never replaced by another dataset's."""
    from common.tokenizer import load_tokenizer

    existing = out / "tokenizer"
    if not existing.is_dir():
        return
    ours = load_tokenizer(str(existing)).identity()["vocab_sha256"]
    theirs = data.manifest.tokenizer.vocab_sha256
    if ours != theirs:
        raise resume_check.ResumeError(
            f"{existing}: this run's vocabulary ({ours[:12]}…) is not the one {data.directory} was made with "
            f"({theirs[:12]}…); point data.path at a dataset made with {existing}, or start a new output_dir")


def _save(engine, cfg, loader, out, step, consumed, skipped, world, monitor, timings) -> None:
    ckpt_dir, tag = out / "checkpoints", checkpoints.tag_for(step)
    began = time.perf_counter()
    if engine.global_rank == 0 and (ckpt_dir / tag).exists():
        shutil.rmtree(ckpt_dir / tag)  # leftovers of a save that crashed before its marker
    dist.barrier()
    rngs = [None] * world
    dist.all_gather_object(rngs, rng_state())
    client_state = {CLIENT_KEY: {"data": loader.state_dict(), "step": step, "consumed_samples": consumed,
                                 "skipped_steps": skipped, "world_size": world, "rng": rngs,
                                 "config": configlib.to_dict(cfg)}}
    if not ds.weights_finite(engine):
        raise Diverged(f"step {step}: the weights hold NaN or inf; not saving {tag} (nor exporting). The last good "
                       f"checkpoint is kept in {ckpt_dir}: resume from it with a lower learning rate")
    ds.save(engine, ckpt_dir, tag, client_state)
    dist.barrier()  # every rank has written its part
    if engine.global_rank == 0:
        checkpoints.publish(ckpt_dir, tag, {"step": step, "consumed_samples": consumed, "world_size": world,
                                            "zero_stage": cfg.zero.stage, "precision": cfg.train.precision,
                                            "settings": _settings(cfg, loader.data.manifest)})
        checkpoints.prune(ckpt_dir, cfg.checkpoint.keep_last)
    dist.barrier()
    seconds = round(time.perf_counter() - began, 2)
    timings.setdefault("checkpoint_save_s", []).append(seconds)
    monitor.info(f"saved checkpoint {tag} in {seconds} s")


def _universal(found: checkpoints.Checkpoint, rank: int) -> checkpoints.Checkpoint:
    """A universal copy of ``found`` (made once, by rank 0) for loading on another world size."""
    target_dir = found.directory / "universal"
    if rank == 0 and not _intact(target_dir, found.tag):
        log.info(f"{found.path} was written by {found.info['world_size']} ranks: converting it to a universal "
                 "checkpoint to load on this world size")
        shutil.rmtree(target_dir / found.tag, ignore_errors=True)
        ds.convert_to_universal(found.directory, found.tag, target_dir / found.tag)
        checkpoints.publish(target_dir, found.tag, found.info)
    dist.barrier()
    return checkpoints.Checkpoint(target_dir, found.tag, found.step, found.info)


def _resume_point(ckpt_dir: Path, on_corrupt: str, rank: int) -> checkpoints.Checkpoint | None:
    """The newest intact checkpoint (see ``checkpoints.newest_intact``), chosen by rank 0, which alone reads
    every file, and told to the other ranks; a refusal is raised on every rank."""
    choice: list = [None]
    if rank == 0:
        try:
            found = checkpoints.newest_intact(ckpt_dir, on_corrupt, check=lambda c: ds.refuse_unsafe(c.path),
                                              warn=log.warning)
            choice = [("tag", found.tag if found else None)]
        except checkpoints.CheckpointError as error:
            choice = [("error", str(error))]
    dist.broadcast_object_list(choice, src=0)
    kind, value = choice[0]
    if kind == "error":
        raise checkpoints.CorruptCheckpoint(value)
    return next((c for c in checkpoints.complete(ckpt_dir) if c.tag == value), None)


def _intact(directory: Path, tag: str) -> bool:
    found = next((c for c in checkpoints.complete(directory) if c.tag == tag), None)
    try:
        return found is not None and checkpoints.verify(found) >= 0
    except checkpoints.CorruptCheckpoint as error:
        log.warning(f"{error}; converting again")
        return False


def _export(engine, model, data, out) -> None:
    """The final weights (checked finite by the caller) as a Hugging Face directory (rank 0), with the dataset's
    tokenizer."""
    state = ds.consolidated_state_dict(engine)
    if engine.global_rank == 0:
        state = {k.removeprefix("model."): v for k, v in state.items()}
        cpu_model = BertForPreTraining(model.config)
        missing = cpu_model.load_state_dict(state, strict=False).missing_keys
        if set(missing) - {"cls.predictions.decoder.weight"}:
            raise RuntimeError(f"export: weights missing from the engine: {missing[:5]}")
        export(cpu_model, out / "hf", tokenizer_dir=out / "tokenizer")
        log.info(f"exported the final weights to {out / 'hf'} (Hugging Face BertForPreTraining)")
    dist.barrier()
