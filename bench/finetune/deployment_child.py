"""One measurement of the deployment benchmark, in a fresh process: load one encoder in one runtime, run it on
random token ids of one shape, and print one JSON line (per-iteration seconds, memory, CPU).

    python -m bench.finetune.deployment_child --runtime torch|onnxruntime --model PATH --batch 1 --seq 128
                                              --threads 2 --warmup 3 --iterations 20

``torch``: ``transformers.AutoModel`` of a Hugging Face directory, eval mode, fp32, under ``torch.inference_mode``.
``onnxruntime``: an ONNX Runtime CPU session of a .onnx file; this process then imports neither torch nor
``transformers``, as a deployment on ONNX Runtime would not. Threads are fixed (``--threads`` intra-op, one
inter-op); the parent also sets OMP_NUM_THREADS and MKL_NUM_THREADS to the same count.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

RUNTIMES = ("torch", "onnxruntime")


def _kib_field(name: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(name))


def _load(runtime: str, model: str, threads: int):
    """A function of the inputs (NumPy arrays) and what the loaded model is."""
    if runtime == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        from bench.finetune.deployment_models import load_transformers

        encoder = load_transformers(model)

        def run(inputs):
            with torch.inference_mode():
                return encoder(**{name: torch.from_numpy(value) for name, value in inputs.items()})

        about = {"parameters": sum(p.numel() for p in encoder.parameters()), "class": type(encoder).__name__,
                 "attention": getattr(encoder.config, "_attn_implementation", None),
                 "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()}
        return run, about
    from bench.finetune.deployment_models import ort_session

    session = ort_session(model, threads)
    options = session.get_session_options()
    about = {"class": "onnxruntime.InferenceSession", "providers": session.get_providers(),
             "threads": options.intra_op_num_threads, "interop_threads": options.inter_op_num_threads}
    return (lambda inputs: session.run(None, inputs)), about


def measure(runtime: str, model: str, batch: int, seq: int, threads: int, warmup: int, iterations: int) -> dict:
    imported = _kib_field("VmRSS")
    started = time.perf_counter()
    run, about = _load(runtime, model, threads)
    load_s = time.perf_counter() - started
    from bench.finetune.deployment_models import example_inputs

    inputs = example_inputs(batch, seq)
    loaded_hwm = _kib_field("VmHWM")
    for _ in range(warmup):
        run(inputs)
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        run(inputs)
        times.append(time.perf_counter() - started)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"runtime": runtime, "batch": batch, "seq": seq, "warmup": warmup, "iterations_s": times,
            "load_s": round(load_s, 3), "rss_before_load_bytes": imported, "hwm_after_load_bytes": loaded_hwm,
            "peak_rss_bytes": _kib_field("VmHWM"), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "torch_imported": "torch" in sys.modules, **about}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", choices=RUNTIMES, required=True)
    parser.add_argument("--model", required=True, help="a Hugging Face directory (torch) or a .onnx file")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args(argv)
    result = measure(args.runtime, args.model, args.batch, args.seq, args.threads, args.warmup, args.iterations)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
