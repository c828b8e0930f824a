"""A pretraining run: set-up (data, model, engine, resume), then ``pretrain.loop``, then the export and summary.

Exit statuses: 0 done; ``PREEMPTED`` (75) saved after SIGUSR1/SIGTERM and wants a requeue;
``DIVERGED`` (3) too many non-finite steps in a row, or non-finite weights; 1 any other failure; and, ended by
``pretrain.preemption`` without a checkpoint, ``STOPPED`` (143) on a second SIGTERM and ``OUT_OF_GRACE`` (124).
"""
from __future__ import annotations

import contextlib
import functools
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common import configlib, storage, writelock
from common.manifest import Manifest, ModelRequirements
from models import attention
from pretrain import checkpoints, evaluation, families, loop, precision
from pretrain import engine as ds
from pretrain import resume as resume_check
from pretrain.checkpoints import export_directory, finished_export
from pretrain.compiling import RecompileLimitWatch, cache_counts, compile_module
from pretrain.compiling import describe as describe_compile
from pretrain.config import BatchPlan, PretrainConfig, batch_plan
from pretrain.data import PretrainingLoader, ShardedInstances
from pretrain.ds_config import deepspeed_config
from pretrain.dynamic_masking import DynamicMasking
from pretrain.families import Family
from pretrain.launch import Rendezvous
from pretrain.loop import DIVERGED, PREEMPTED, Diverged, LoopState, StopFlag
from pretrain.monitor import Monitor, log
from pretrain.preemption import StepStarts
from pretrain.recipe import resolve

LOCK_NAME = "writer.lock"  # in output_dir while a run writes it
CLIENT_KEY = "bert_pipeline"  # our state inside DeepSpeed's client_state (its own keys share the dict)


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than ``faults.timeout_minutes``."""


def build_model(cfg: PretrainConfig, manifest: Manifest, family: Family | None = None) -> nn.Module:
    family = family or families.for_config(cfg)
    m = cfg.model
    if m.init_from:
        model, fresh = family.load_model(_init_directory(m.init_from))
        if fresh:
            log.info(f"initialised fresh (not in {m.init_from}): {', '.join(fresh)}")
        return model
    vocab = m.vocab_size or -(-manifest.tokenizer.vocab_size // 8) * 8  # a multiple of 8 for tensor cores
    return family.new_model(vocab_size=vocab, pad_token_id=manifest.tokenizer.special_ids["[PAD]"])


def _init_directory(init_from: str) -> Path:
    """``init_from`` may name one of our run directories; its finished Hugging Face export is used."""
    return finished_export(init_from) or Path(init_from)


def _check_init_tokenizer(cfg: PretrainConfig, manifest: Manifest) -> None:
    if not cfg.model.init_from:
        return
    from pretrain.recipe import other_vocabulary

    candidate = other_vocabulary(_init_directory(cfg.model.init_from), manifest)
    if candidate is not None:
        raise ValueError(f"{candidate} is not the vocabulary the dataset {cfg.data.path} was made with; "
                         "preprocess with the checkpoint's tokenizer to continue from it")


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


@dataclass
class Setup:
    """What set-up hands the loop: the built pieces and where the run stands."""

    model: nn.Module
    family: Family
    data: ShardedInstances
    engine: ds.Engine
    loader: PretrainingLoader
    plan: BatchPlan
    state: LoopState
    timings: dict = field(default_factory=dict)  # seconds of the checkpoint work, for summary.json
    split: ShardedInstances | None = None        # the held-out split evaluated on (None: evaluation off)
    layout: evaluation.Layout = evaluation.Layout()


def resolve_precision(cfg: PretrainConfig, rank: int) -> tuple[PretrainConfig, list[precision.Choice]]:
    """``cfg`` with its precisions resolved on this machine's device (``auto``: ``pretrain.precision``); rank 0 logs
    each choice and its reason, and every rank warns once of an explicit bf16 that this CPU emulates."""
    cfg, choices = precision.resolve_run(cfg, precision.detect(ds.device_type()))
    for choice in choices:
        if rank == 0:
            log.info(choice.line())
        precision.warn_once(choice, log)
    return cfg, choices


def _run(cfg: PretrainConfig, rendezvous: Rendezvous, *, resume: bool) -> int:
    rank, world, out = rendezvous.rank, rendezvous.world_size, Path(cfg.output_dir)
    cfg, choices = resolve_precision(cfg, rank)
    run = set_up(cfg, rendezvous, resume=resume, notes=[choice.line() for choice in choices])
    engine, state = run.engine, run.state
    monitor = Monitor(out if rank == 0 else None, total_steps=cfg.train.max_steps, start_step=state.step,
                      progress=cfg.logging.progress, ds_monitor=engine.monitor)
    if state.step == 0:
        monitor.info(f"{run.plan.describe()}; {run.family.describe(run.model)}; "
                     f"ZeRO {cfg.zero.stage}, {cfg.train.precision}, {cfg.optimizer.name}")
    scoring = evaluation.RunEvaluation.of(cfg, engine, run.family, run.split, run.layout, monitor)
    stop = StopFlag.of(cfg.faults, rank=rank, checkpoints=out / "checkpoints").install()
    starts = StepStarts(run.loader, rng_state)  # where each step began: an abandoned step is saved as not begun
    started = time.time()
    compiled = RecompileLimitWatch(monitor.info if rank == 0 else log.warning) if cfg.model.compile else None
    try:
        save = functools.partial(_save, engine=engine, cfg=cfg, loader=run.loader, starts=starts, world=world,
                                 monitor=monitor, timings=run.timings, scoring=scoring)
        if scoring is not None:
            scoring.started = time.time()
        with compiled or contextlib.nullcontext():
            # On a GPU each step's statistics are read once the next step is queued (the device never idles on
            # the host's read); on CPU the collectives are synchronous anyway, and each step is read at once.
            status = loop.train(state, engine, starts, monitor, settings=loop.LoopSettings.of(cfg),
                                plan=run.plan, family=run.family, model=run.model, rank=rank, stop=stop, save=save,
                                read_lag=1 if engine.device.type == "cuda" else 0, evaluation=scoring)
        stop.begin_save()  # the state is saved; a stop now leaves the export whole or absent, as ever
        if status == 0 and not engine.weights_finite():  # e.g. the last steps were skipped, so never saved
            monitor.info(f"the final weights hold NaN or inf: the run is not done and {export_directory(out)} is not "
                         f"exported. The last good checkpoint is kept in {out / 'checkpoints'}: resume from it with "
                         "a lower learning rate")
            status = DIVERGED
        if status == 0 and cfg.checkpoint.export_hf:
            began = time.perf_counter()
            _export(engine, run.family, run.model, out)
            run.timings["export_hf_s"] = round(time.perf_counter() - began, 2)
    except RuntimeError as error:  # torch's DistBackendError included
        if "timed out" not in str(error).lower() and "timeout" not in str(error).lower():
            raise
        raise CollectiveTimeout(
            f"step {state.step + 1}: a collective (the gradient reduction or the step's statistics) waited longer "
            f"than faults.timeout_minutes ({cfg.faults.timeout_minutes:g}): "
            f"{ds.unanswered_peers(rank, world, cfg.faults.timeout_minutes)}; the job "
            "stops so that it can be restarted with --resume from the last checkpoint") from None
    finally:
        stop.restore()
        monitor.close()
    if rank == 0:
        summary = {"status": {0: "done", PREEMPTED: "preempted", DIVERGED: "diverged"}[status], "step": state.step,
                   "consumed_samples": state.consumed, "skipped_steps": state.skipped, "world_size": world,
                   "precision": {choice.what: {"requested": choice.requested, "chosen": choice.precision,
                                               "reason": choice.reason} for choice in choices},
                   "wall_seconds": round(time.time() - started, 1), "timings": run.timings,
                   **(scoring.summary() if scoring is not None else {})}
        if compiled:
            summary["compile"] = {"graphs": compiled.graphs(), "recompile_limits_hit": compiled.limits_hit,
                                  "cache": cache_counts()}
        with storage.open_write(str(out / "summary.json"), binary=False) as handle:  # whole, even on a 2nd SIGTERM
            handle.write(json.dumps(summary, indent=2) + "\n")
        log.info(f"{summary['status']}: step {state.step}/{cfg.train.max_steps}, {state.consumed:,} samples, "
                 f"{state.skipped} skipped steps, {summary['wall_seconds']} s on {world} ranks; outputs in {out}"
                 + (scoring.last_line() if scoring is not None else ""))
    return status


def set_up(cfg: PretrainConfig, rendezvous: Rendezvous, *, resume: bool, notes: list[str] = ()) -> Setup:
    """The model, data, engine and loader of the run, at step 0 or at the resumed checkpoint's step; rank 0
    writes the run directory's config files (``notes`` as comments at the top of config.yaml) and tokenizer."""
    rank, world = rendezvous.rank, rendezvous.world_size
    out = Path(cfg.output_dir)
    plan = batch_plan(cfg.train, world)
    data = ShardedInstances(cfg.data.path, verify=cfg.data.verify)
    recipe = resolve(cfg.objective, data.manifest)
    if rank == 0:
        log.info(recipe.describe())
    _check_init_tokenizer(cfg, data.manifest)
    family = families.for_config(cfg)
    split = evaluation.open_split(cfg.eval, cfg.checkpoint, family, data.manifest, data_path=cfg.data.path,
                                  verify=cfg.data.verify)  # refused here, before the first step, if it cannot be
    layout = evaluation.Layout(cfg.data.pad_multiple, recipe.document_attention, cfg.model.padding_free)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every run
    model = build_model(cfg, data.manifest, family)
    data.check(ModelRequirements(family.vocab_size(model), family.positions(model),
                                 special_ids=data.manifest.tokenizer.special_ids))
    family.set_activation_checkpointing(model, cfg.model.activation_checkpointing)
    ckpt_dir = out / "checkpoints"
    found = _resume_point(ckpt_dir, cfg.checkpoint.on_corrupt, rank) if resume else None
    if rank == 0:  # the rank that writes tokenizer/ (others could see it half copied)
        _check_run_tokenizer(out, data)
    if found is not None and "settings" in found.info:
        for change in resume_check.check(found.info["settings"], _settings(cfg, data.manifest), str(found.path)):
            log.info(f"resuming with a changed setting, applied from step {found.step} on: {change}")
    ds_config = deepspeed_config(plan, out, train=cfg.train, optimizer=cfg.optimizer, zero=cfg.zero,
                                 logging=cfg.logging)
    load_from, timings = found, {}
    # Another world size, or another precision (pretrain.resume), loads through the universal format.
    if found is not None and cfg.zero.stage > 0 and (found.info["world_size"] != world or
                                                     found.info.get("precision", cfg.train.precision) !=
                                                     cfg.train.precision):
        began = time.perf_counter()
        load_from = _universal(found, rank)
        timings["universal_conversion_s"] = round(time.perf_counter() - began, 2)
        ds_config["checkpoint"]["load_universal"] = True
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text("".join(f"# {note}\n" for note in notes) + configlib.to_yaml(cfg))
        (out / "deepspeed_config.json").write_text(json.dumps(ds_config, indent=2) + "\n")
        # The tokenizer travels with the run, so its checkpoints can be exported after the dataset is gone.
        shutil.copytree(data.tokenizer_dir, out / "tokenizer", dirs_exist_ok=True)
    seed_everything(cfg.seed, rank)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()} if cfg.model.init_from else None
    objective = family.loss_module(model)
    if cfg.model.compile:
        objective = _compiled(objective, cfg.model, rank)
    engine = ds.Engine(ds.build(objective, ds_config, optimizer=cfg.optimizer, schedule=cfg.schedule))
    if cfg.model.padding_free:
        kernel, why = attention.configure(model, engine.device)
        if rank == 0:
            log.info(f"padding-free pretraining: attention kernel {kernel} ({why})")
    if initial is not None and found is None:
        engine.restore_fp32_weights(initial)
    masking = (DynamicMasking.for_dataset(recipe.dynamic_masking, data.tokenizer_dir, cfg.seed)
               if recipe.dynamic_masking is not None else None)
    loader = PretrainingLoader(data, micro_batch=plan.micro_batch, accumulation=plan.accumulation, world_size=world,
                               rank=rank, seed=cfg.seed, window_batches=cfg.data.window_batches, masking=masking,
                               global_sum=functools.partial(_sum_over_ranks, engine),
                               document_attention=recipe.document_attention, pad_multiple=cfg.data.pad_multiple,
                               padding_free=cfg.model.padding_free)
    state = LoopState()
    if found is not None:
        began = time.perf_counter()
        saved = engine.load(load_from.directory, load_from.tag)[CLIENT_KEY]
        timings["checkpoint_load_s"] = round(time.perf_counter() - began, 2)
        engine.follow_schedule(cfg.optimizer.lr)
        loader.load_state_dict(saved["data"])
        state = LoopState(step=saved["step"], consumed=saved["consumed_samples"], skipped=saved["skipped_steps"],
                          tokens=saved.get("tokens", 0))
        if saved["world_size"] == world:
            set_rng_state(saved["rng"][rank])
        else:
            seed_everything(cfg.seed + state.step, rank)  # a new world size cannot continue the old ranks' streams
        log.info(f"resumed from {found.path} at step {state.step} ({state.consumed:,} samples consumed) on {world} "
                 "ranks")
    elif resume:
        log.info(f"no complete checkpoint in {ckpt_dir}; starting from scratch")
    return Setup(model, family, data, engine, loader, plan, state, timings, split, layout)


def _compiled(objective: torch.nn.Module, model_cfg, rank: int) -> torch.nn.Module:
    """``model.compile``: the loss module compiled in place (``pretrain.compiling``), and the choice in rank 0's log."""
    objective = compile_module(objective, cuda_graphs=model_cfg.compile_cuda_graphs, cache=model_cfg.compile_cache)
    if rank == 0:
        graphs = ""
        if model_cfg.compile_cuda_graphs:
            graphs = ("; CUDA graphs" if torch.cuda.is_available() else
                      "; model.compile_cuda_graphs has no effect here: there is no GPU")
        log.info(describe_compile(objective) + graphs)
    return objective


def _sum_over_ranks(engine: ds.Engine, count: int) -> int:
    """``count`` summed over every rank (the loader's masked count of a dynamically masked global batch)."""
    tensor = torch.tensor([count], dtype=torch.int64, device=engine.device)
    engine.all_reduce(tensor)
    return int(tensor.item())


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


def _save(state: LoopState, abandoned: bool = False, *, engine: ds.Engine, cfg: PretrainConfig,
          loader: PretrainingLoader, starts: StepStarts, world: int, monitor: Monitor, timings: dict,
          scoring: evaluation.RunEvaluation | None = None) -> None:
    """Every rank writes its part of the checkpoint of ``state.step``; rank 0 publishes it once all are done.
    ``abandoned``: the loop stopped the next step midway; the data position and random states are those from its
    start (``starts``), and the weights and optimizer are still those of ``state.step``."""
    step, consumed, skipped = state.step, state.consumed, state.skipped
    ckpt_dir, tag = Path(cfg.output_dir) / "checkpoints", checkpoints.tag_for(step)
    began = time.perf_counter()
    if engine.rank == 0 and (ckpt_dir / tag).exists():
        shutil.rmtree(ckpt_dir / tag)  # leftovers of a save that crashed before its marker
    engine.barrier()
    rngs = engine.all_gather(starts.rng if abandoned else rng_state())
    position = starts.position if abandoned else loader.state_dict()
    client_state = {CLIENT_KEY: {"data": position, "step": step, "consumed_samples": consumed,
                                 "skipped_steps": skipped, "tokens": state.tokens, "world_size": world, "rng": rngs,
                                 "config": configlib.to_dict(cfg)}}
    if not engine.weights_finite():
        raise Diverged(f"step {step}: the weights hold NaN or inf; not saving {tag} (nor exporting). The last good "
                       f"checkpoint is kept in {ckpt_dir}: resume from it with a lower learning rate")
    engine.save(ckpt_dir, tag, client_state)
    engine.barrier()  # every rank has written its part
    if engine.rank == 0:
        checkpoints.publish(ckpt_dir, tag, {"step": step, "consumed_samples": consumed, "world_size": world,
                                            "zero_stage": cfg.zero.stage, "precision": cfg.train.precision,
                                            "settings": _settings(cfg, loader.data.manifest),
                                            **(scoring.checkpoint_info(step) if scoring is not None else {})})
        checkpoints.prune(ckpt_dir, cfg.checkpoint.keep_last, cfg.checkpoint.keep_best)
    engine.barrier()
    seconds = round(time.perf_counter() - began, 2)
    timings.setdefault("checkpoint_save_s", []).append(seconds)
    monitor.info(f"saved checkpoint {tag} in {seconds} s")


def _universal(found: checkpoints.Checkpoint, rank: int) -> checkpoints.Checkpoint:
    """A universal copy of ``found`` (made once, by rank 0) for loading on another world size."""
    target_dir = found.directory / "universal"
    if rank == 0 and not _intact(target_dir, found.tag):
        log.info(f"{found.path} was written by {found.info['world_size']} ranks in {found.info.get('precision')}: "
                 "converting it to a universal checkpoint to load on this world size and precision")
        shutil.rmtree(target_dir / found.tag, ignore_errors=True)
        ds.convert_to_universal(found.directory, found.tag, target_dir / found.tag)
        checkpoints.publish(target_dir, found.tag, found.info)
    ds.barrier()
    return checkpoints.Checkpoint(target_dir, found.tag, found.step, found.info)


def _resume_point(ckpt_dir: Path, on_corrupt: str, rank: int) -> checkpoints.Checkpoint | None:
    """The newest intact checkpoint (see ``checkpoints.newest_intact``), chosen by rank 0, which alone reads
    every file, and told to the other ranks; a refusal is raised on every rank."""
    choice = None
    if rank == 0:
        try:
            found = checkpoints.newest_intact(ckpt_dir, on_corrupt, check=lambda c: ds.refuse_unsafe(c.path),
                                              warn=log.warning)
            choice = ("tag", found.tag if found else None)
        except checkpoints.CheckpointError as error:
            choice = ("error", str(error))
    kind, value = ds.broadcast_object(choice, src=0)
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


def _export(engine: ds.Engine, family: Family, model: nn.Module, out: Path) -> None:
    """The final weights (checked finite by the caller) as a Hugging Face directory (rank 0), with the dataset's
    tokenizer."""
    state = engine.consolidated_state_dict()
    if engine.rank == 0:
        state = {k.removeprefix("model."): v for k, v in state.items()}
        family.export(family.model_from_state(state, model.config), export_directory(out), out / "tokenizer")
        log.info(f"exported the final weights to {export_directory(out)} (Hugging Face {family.architecture})")
    engine.barrier()
