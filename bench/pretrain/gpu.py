"""BERT pretraining throughput and MFU on one GPU, through the same DeepSpeed engine the runs use.

    python -m bench.pretrain.gpu                                   # BERT-Large, phase 1 and 2, bf16, ZeRO 1
    python -m bench.pretrain.gpu --data128 DIR --data512 DIR       # real shards instead of full-length rows
    python -m bench.pretrain.gpu --modes padded,padding-free,padded+compile,padding-free+compile
    DS_ACCELERATOR=cpu python -m bench.pretrain.gpu --preset tiny --steps 3 --warmup 1   # smoke run on CPU

Each phase: the model preset at that sequence length, one rank, bf16 (DeepSpeed's bf16 with ZeRO 1 and
fp32 master weights), AdamW; ``--warmup`` untimed steps, then ``--steps`` timed optimizer steps; once per mode:
``padded`` or ``padding-free`` (``model.padding_free``, with the attention kernel ``models.attention`` picks),
each eager or ``+compile`` (``model.compile``: regional, each layer kind compiled once; its compilation falls in the
warm-up steps) or ``+compile-whole`` (the whole objective as one graph, for comparison), ``+compile+cudagraphs``
adding CUDA graphs to the regions (``model.compile_cuda_graphs``). Phase 2's rows are
packed documents when ``--data512`` is a packed dataset (``full_sentences``, document attention).
Reports sequences/s, tokens/s and MFU = tokens/s x training FLOPs per token (the family's ``flops_per_token``)
/ the GPU's dense bf16 peak. Writes bench/results/pretrain-gpu-<device>.json with the machine (and its GPU) and
the versions.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench import record
from models import attention
from pretrain import compiling, families
from pretrain import config as config_module
from pretrain import engine as ds
from pretrain.compiling import compile_module
from pretrain.data import PretrainingLoader, ShardedInstances, host_unpadding
from pretrain.ds_config import deepspeed_config
from pretrain.dynamic_masking import DynamicMasking
from pretrain.launch import Rendezvous
from pretrain.loop import to_device
from pretrain.monitor import peak_tflops
from pretrain.recipe import resolve

# F.scaled_dot_product_attention's kernels, each alone (with BERT's attention dropout, where the kernel allows it)
SDPA = {"default": None, "flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION], "math": [SDPBackend.MATH]}
MODES = ("padded", "padding-free", "padded+compile", "padding-free+compile", "padded+compile-whole",
         "padded+compile+cudagraphs", "padding-free+compile+cudagraphs")


def synthetic_steps(micro: int, seq: int, vocab: int, accumulation: int, seed: int = 0, unpadding: bool = False):
    """Full-length rows with 15% of positions masked: the worst case for padding, the best for MFU; with
    ``unpadding`` the sizes the padding-free path takes from the loader (``pretrain.data.host_unpadding``)."""
    rng = np.random.default_rng(seed)
    per_row = max(1, int(0.15 * seq))
    while True:
        batches = []
        for _ in range(accumulation):
            positions = np.sort(rng.choice(seq, size=(micro, per_row)), axis=1) + np.arange(micro)[:, None] * seq
            batches.append({"input_ids": rng.integers(1000, vocab, size=(micro, seq)),
                            "token_type_ids": (np.arange(seq)[None] >= seq // 2).repeat(micro, 0).astype(np.int64),
                            "attention_mask": np.ones((micro, seq), np.int64),
                            "masked_positions": positions.reshape(-1).astype(np.int64),
                            "masked_labels": rng.integers(1000, vocab, size=micro * per_row),
                            "next_sentence_labels": rng.integers(0, 2, size=micro),
                            "mlm_loss_scale": np.float32(1.0 / (micro * per_row))})
            if unpadding:
                batches[-1].update(host_unpadding(np.arange(micro * seq), np.full(micro, seq),
                                                batches[-1]["masked_positions"]))
        yield batches


def measure(args, seq: int, micro: int, data_dir: str | None, mode: str) -> dict:
    padding_free, compiled = mode.startswith("padding-free"), "+compile" in mode
    regional = not mode.endswith("+compile-whole")
    cuda_graphs = mode.endswith("+cudagraphs")
    total_steps = args.warmup + args.steps + args.profile_steps
    torch_adam = args.torch_adam or not torch.cuda.is_available()
    # bf16 keeps fp32 master weights only under ZeRO >= 1: LAMB at ZeRO 0 trains in fp16 with loss scaling, as the
    # shipped phase configs resolve on a GPU (fp32 on CPU, which has no fp16 path: a smoke run only).
    precision = "bf16" if args.optimizer != "lamb" else "fp16" if torch.cuda.is_available() else "fp32"
    overrides = [f"model.preset={args.preset}", "model.max_position_embeddings=512", f"train.micro_batch_size={micro}",
                 f"train.global_batch_size={micro * args.accumulation}", f"train.precision={precision}",
                 # LAMB is a client optimizer of per-tensor trust ratios: ZeRO 0, as the shipped phase configs run it
                 f"zero.stage={0 if args.optimizer == 'lamb' else 1}",
                 f"optimizer.name={args.optimizer}", f"optimizer.torch_adam={str(torch_adam).lower()}",
                 f"train.max_steps={total_steps}", f"schedule.total_steps={total_steps}",
                 "logging.tensorboard=false", f"model.activation_checkpointing={str(args.checkpointing).lower()}",
                 f"model.padding_free={str(padding_free).lower()}", f"model.compile={str(compiled).lower()}",
                 f"model.compile_cuda_graphs={str(cuda_graphs).lower()}"]
    data = ShardedInstances(data_dir) if data_dir else None
    documents = data is not None and data.packed
    if documents:
        overrides += ["objective.attention=document", "objective.sentence_objective=none",
                      f"objective.masking={data.manifest.objective.masking}"]
    cfg = config_module.load(None, overrides)
    plan = config_module.batch_plan(cfg.train, 1)
    torch.manual_seed(0)
    family = families.for_config(cfg)
    model = family.new_model(vocab_size=30528, pad_token_id=0)
    family.set_activation_checkpointing(model, args.checkpointing)
    objective = family.loss_module(model)
    if compiled:
        compile_module(objective, regional=regional, cuda_graphs=cuda_graphs)
    ds_config = deepspeed_config(plan, record.WORK, train=cfg.train, optimizer=cfg.optimizer, zero=cfg.zero,
                                 logging=cfg.logging)
    if args.mixed == "torch-autocast":  # fp32 weights and gradients, the forward under torch.autocast (bf16)
        ds_config.pop("bf16", None), ds_config.pop("data_types", None)
        ds_config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    engine = ds.build(objective, ds_config, optimizer=cfg.optimizer, schedule=cfg.schedule)
    kernel = attention.configure(model, engine.device)[0] if padding_free else None
    if data is not None:
        masking = (DynamicMasking.for_dataset(resolve(cfg.objective, data.manifest).dynamic_masking,
                                              data.tokenizer_dir, 0) if cfg.objective.masking == "dynamic" else None)
        loader = PretrainingLoader(data, micro_batch=micro, accumulation=args.accumulation, world_size=1, rank=0,
                                   seed=0, masking=masking, document_attention=documents,
                                   pad_multiple=args.pad_multiple, padding_free=padding_free)
        steps = iter(loader.next_step, None)
    else:
        steps = synthetic_steps(micro, seq, 30528, args.accumulation, unpadding=padding_free)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    tokens = sequences = 0
    graphs_before, warmup_started = compiling.graphs_compiled(), time.perf_counter()
    # The loader pads a batch to its longest row (rounded up to --pad-multiple): a width met for the first time may
    # cost kernel planning (cuDNN attention graphs, GEMM heuristics) or, compiled, a recompilation; counted here.
    widths_warmup, widths_timed = set(), set()
    for index in range(args.warmup + args.steps):
        if index == args.warmup:
            sync()
            started, tokens, sequences = time.perf_counter(), 0, 0
            warmup_s = started - warmup_started
        for micro_batch in next(steps):
            ds.train_micro_batch(engine, to_device(micro_batch, engine.device))
            tokens += int(micro_batch["attention_mask"].sum())
            sequences += micro_batch["input_ids"].shape[0]
            (widths_timed if index >= args.warmup else widths_warmup).add(micro_batch["input_ids"].shape[1])
    sync()
    elapsed = time.perf_counter() - started
    graphs = compiling.graphs_compiled() - graphs_before
    profiled = (profile_steps(engine, steps, args.profile_steps, sync, args.results / f"profile-seq{seq}-{mode}.txt")
                if args.profile_steps else None)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    peak = peak_tflops(device_name if torch.cuda.is_available() else None)
    tokens_per_s = tokens / elapsed
    mfu = tokens_per_s * family.flops_per_token(model, seq, 0.15) / (peak * 1e12) if peak else None
    result = {"mode": mode, "attention_kernel": kernel, "packed_documents": documents, "seq": seq,
              "micro_batch": micro, "accumulation": args.accumulation, "steps": args.steps,
              "pad_multiple": args.pad_multiple if data is not None else None,
              "data": data_dir or "synthetic full-length rows", "dataset_rows": len(data) if data is not None else None,
              "optimizer": ("LAMB (foreach)" if args.optimizer == "lamb" else
                            "torch AdamW" if torch_adam else "DeepSpeed FusedAdam"),
              "mixed_precision": args.mixed, "precision": precision,
              "sequences_per_s": sequences / elapsed, "tokens_per_s": tokens_per_s, "mfu": mfu,
              "widths_in_warmup": len(widths_warmup),
              "widths_first_met_in_timed_steps": len(widths_timed - widths_warmup),
              "peak_tflops": peak, "step_s": elapsed / args.steps, "sdpa_backend": args.sdpa,
              # the warm-up's excess over as many timed steps: mostly compilation (and first-width planning)
              "compile_s": round(warmup_s - args.warmup * elapsed / args.steps, 2) if compiled else None,
              "graphs_compiled": graphs if compiled else None,
              "max_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else None,
              "profile": profiled}
    print(f"seq {seq} {mode}: {result['sequences_per_s']:,.1f} seq/s, {tokens_per_s:,.0f} tok/s"
          + (f", MFU {100 * mfu:.1f}%" if mfu else ""), flush=True)
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return result


def profile_steps(engine, steps, count: int, sync, path: Path) -> dict:
    """``count`` more optimizer steps under torch.profiler: where a step's time goes (the loader, forward, backward,
    the optimizer step, each as a span on the host) and how busy the GPU is (kernel time / wall). Writes the
    operator table to ``path``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available()
    spans = ("bench.next_batch", "bench.to_device", "bench.forward", "bench.backward", "bench.step")
    sync()
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(count):
            with record_function(spans[0]):
                micro_batches = next(steps)
            for micro_batch in micro_batches:
                with record_function(spans[1]):
                    batch = to_device(micro_batch, engine.device)
                with record_function(spans[2]):
                    loss, _ = engine(**batch)
                with record_function(spans[3]):
                    engine.backward(loss)
                with record_function(spans[4]):
                    engine.step()
        sync()
    wall = time.perf_counter() - started
    events = prof.key_averages()
    # Kernel time: the device-side events themselves (operators only attribute their kernels' time; the spans above
    # appear on the device too, as annotations).
    device_us = sum(e.time_range.elapsed_us() for e in prof.events()
                    if e.device_type == DeviceType.CUDA and not e.name.startswith("bench."))
    host_ms = {}
    for e in events:  # a span's key also names its annotation on the device, whose host time is 0
        if e.key in spans:
            host_ms[e.key] = max(host_ms.get(e.key, 0.0), e.cpu_time_total / 1e3 / count)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(events.table(sort_by=sort, row_limit=40) + "\n"
                    + events.table(sort_by="cpu_time_total", row_limit=25))
    return {"steps": count, "wall_s_per_step": wall / count,
            "gpu_kernel_share": device_us / 1e6 / wall if cuda else None, "host_ms_per_step": host_ms,
            "table": path.name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pretrain.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="large")
    # BERT-Large's micro-batches that fill an 80-141 GiB card, with accumulation as the shipped global batches need
    parser.add_argument("--micro128", type=int, default=256, help="micro-batch at seq 128")
    parser.add_argument("--micro512", type=int, default=64, help="micro-batch at seq 512")
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--pad-multiple", type=int, default=8,
                        help="data.pad_multiple of the loader (32 at seq 128 or 64 at seq 512: a few static widths)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    parser.add_argument("--data128")
    parser.add_argument("--data512")
    parser.add_argument("--modes", default="padded,padding-free",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after the timed steps, this many more under torch.profiler (a table beside the results)")
    parser.add_argument("--torch-adam", action="store_true",
                        help="torch's AdamW instead of DeepSpeed's FusedAdam (JIT-compiled with nvcc on first use)")
    parser.add_argument("--phases", default="128,512", help="sequence lengths to run, of 128 and 512")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "lamb"),
                        help="lamb: our foreach LAMB at ZeRO 0 in fp16 (the shipped phase configs' optimizer)")
    parser.add_argument("--mixed", default="deepspeed-bf16", choices=("deepspeed-bf16", "torch-autocast"),
                        help="DeepSpeed's bf16 optimizer (bf16 weights, fp32 master and accumulation) or its "
                             "torch_autocast mode (fp32 weights, bf16 autocast forward)")
    parser.add_argument("--sdpa", default="default", choices=sorted(SDPA),
                        help="limit F.scaled_dot_product_attention to one kernel (default: torch's choice)")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if set(modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    port = int(os.environ.get("MASTER_PORT", 29555))
    ds.init_distributed(Rendezvous(0, 1, 0, "127.0.0.1", port, "single"), timeout_minutes=10)
    wanted = {int(seq) for seq in args.phases.split(",")}
    with sdpa_kernel(SDPA[args.sdpa]) if SDPA[args.sdpa] else contextlib.nullcontext():
        phases = [measure(args, seq, micro, data, mode) for seq, micro, data in
                  ((128, args.micro128, args.data128), (512, args.micro512, args.data512)) if seq in wanted
                  for mode in modes]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    versions = record.versions(("torch", "deepspeed"), ("pretrain", "bench/pretrain/gpu.py"))
    result = {"benchmark": "pretrain-gpu", "date": record.utc_now(), "command": record.command_line(),
              "preset": args.preset, "machine": {**record.machine_info(), "device": device},
              "versions": {**versions, "cuda": torch.version.cuda},
              "phases": phases, "goal": "MFU >= 0.50 in bf16 (NVIDIA's PyTorch BERT: about 0.44 on A100)"}
    name = "pretrain-gpu-" + "".join(c if c.isalnum() else "-" for c in device.lower()).strip("-") + ".json"
    record.write_json(args.results / name, result)
    print(f"wrote {record.shown(args.results / name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
