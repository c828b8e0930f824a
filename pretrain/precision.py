"""Which floating-point format a run computes in: ``precision: auto`` chosen from the hardware it runs on.

``auto`` (the default of pretraining, finetuning and the distillation teacher) resolves to

* bf16 on a CUDA GPU that computes it (Ampere on), fp16 with dynamic loss scaling on an older one;
* on a CPU, bf16 only where the CPU computes it natively (AVX-512 BF16 or AMX on x86-64, the BF16 extension on
  Arm), fp32 otherwise. Without native support torch emulates bf16's matrix product, several to tens of times slower
  than fp32 (bench/results/precision-*.json): far from saving time, bf16 there costs the most;
* fp32 where a run's optimizer keeps no fp32 master weights of bf16 ones (ZeRO stage 0), and fp16 instead on a GPU.

The detection reads the CPU's flags and honours the two variables that cap what torch uses, so that a machine
with native bf16 can stand in for one without: ``ONEDNN_MAX_CPU_ISA`` (oneDNN's matrix products) and
``ATEN_CPU_CAPABILITY`` (torch's own vectorised kernels); ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``
emulates an AVX2-only CPU, which resolves to fp32. An explicit ``bf16`` on such a CPU runs, with one warning.
"""
from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from typing import Mapping

from common.errors import ConfigError

REQUESTS = ("auto", "bf16", "fp16", "fp32")

# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) under which its bf16 kernels use native instructions.
_ONEDNN_BF16_ISAS = {"AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                     "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2",
                     "ALL", "DEFAULT"}
# ATen capabilities (ATEN_CPU_CAPABILITY) that leave torch's bf16 element-wise kernels unvectorised for bf16.
_ATEN_WITHOUT_BF16 = {"default", "avx2"}

_log = logging.getLogger("pretrain")
_warned: set[str] = set()


@dataclass(frozen=True)
class Hardware:
    """What the device a run computes on can do, and how that was found out."""

    kind: str          # "cuda" or "cpu"
    name: str          # the GPU's or the CPU's model name
    bf16: bool         # computes bf16 natively
    evidence: str      # why ``bf16`` is what it is, in words


@dataclass(frozen=True)
class Choice:
    """A resolved precision and the reason for it."""

    what: str          # the setting: train.precision, distillation.teacher_precision, ...
    requested: str
    precision: str     # bf16 | fp16 | fp32
    reason: str
    warning: str | None = None   # set when an explicit choice runs far slower than the alternative

    def line(self) -> str:
        source = "auto" if self.requested == "auto" else "set in the config"
        return f"{self.what}: {self.precision} ({source}; {self.reason})"


def cpu_bf16(flags: set[str], env: Mapping[str, str], machine: str) -> tuple[bool, str]:
    """Whether a CPU with these ``/proc/cpuinfo`` flags (x86 ``flags`` or Arm ``Features``) computes bf16 natively
    for torch under the caps in ``env``; and the evidence."""
    if machine in ("aarch64", "arm64"):
        return ("bf16" in flags, "the CPU has Arm's BF16 extension" if "bf16" in flags
                else "the CPU lacks Arm's BF16 extension")
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if not native:
        return False, "the CPU has neither AVX-512 BF16 nor AMX"
    isa = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if isa and isa not in _ONEDNN_BF16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={isa} keeps oneDNN below its bf16 instructions"
    aten = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in _ATEN_WITHOUT_BF16:
        return False, f"ATEN_CPU_CAPABILITY={aten} keeps torch's kernels below AVX-512"
    return True, f"the CPU has {' and '.join(native)}"


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[set[str], str]:
    """(the first processor's flags, its model name) from ``path``; empty where it cannot be read."""
    flags: set[str] = set()
    name = platform.processor() or platform.machine()
    try:
        with open(path, encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("flags", "features") and not flags:
                    flags = set(value.split())
                elif key == "model name":
                    name = value.strip()
    except OSError:
        pass
    return flags, name


def cpu_hardware(env: Mapping[str, str] | None = None, cpuinfo: str = "/proc/cpuinfo") -> Hardware:
    flags, name = _cpuinfo(cpuinfo)
    native, evidence = cpu_bf16(flags, os.environ if env is None else env, platform.machine().lower())
    return Hardware("cpu", name, native, evidence)


def detect(device_type: str) -> Hardware:
    """The hardware of ``device_type`` ("cuda" or "cpu") on this machine."""
    if device_type != "cuda":
        return cpu_hardware()
    import torch

    name = torch.cuda.get_device_name()
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch < 2.4 has no including_emulation and answers for native support
        native = torch.cuda.is_bf16_supported()
    major, minor = torch.cuda.get_device_capability()
    return Hardware("cuda", name, native, f"{name} (compute capability {major}.{minor}) "
                                          f"{'computes' if native else 'does not compute'} bf16")


def choose(requested: str, hardware: Hardware, *, master_weights: bool = True, what: str = "precision") -> Choice:
    """Resolve ``requested`` (auto, bf16, fp16 or fp32) on ``hardware``. ``master_weights``: the optimizer keeps
    fp32 master weights of bf16 ones (DeepSpeed at ZeRO 1-3; a no-grad forward needs none). fp16 on a CPU is refused
    (DeepSpeed's CPU accelerator and torch's CPU autocast do not scale the loss)."""
    if requested not in REQUESTS:
        raise ConfigError(f"{what} is {requested!r}; choose one of {', '.join(REQUESTS)}")
    if requested == "fp16" and hardware.kind == "cpu":
        raise ConfigError(f"{what} fp16 needs a CUDA GPU (on a CPU there is no loss-scaled fp16): set {what} to "
                          "auto, bf16 or fp32")
    if requested != "auto":
        warning = None
        if requested == "bf16" and hardware.kind == "cpu" and not hardware.bf16:
            warning = (f"{what} bf16 on a CPU without native bf16 ({hardware.evidence}): torch emulates it, "
                       f"and a matrix product runs {gemm_slowdown():.0f}x slower than in fp32 here; set {what} to "
                       "auto or fp32")
        return Choice(what, requested, requested, hardware.evidence, warning)
    if hardware.bf16 and master_weights:
        return Choice(what, requested, "bf16", hardware.evidence)
    if hardware.kind == "cuda":
        why = hardware.evidence + (", but bf16 without ZeRO keeps no fp32 master weights" if hardware.bf16 else "")
        return Choice(what, requested, "fp16", f"{why}; fp16 with dynamic loss scaling")
    if not hardware.bf16:
        return Choice(what, requested, "fp32", f"{hardware.evidence}, so torch would emulate bf16, several to tens "
                                         "of times slower than fp32")
    return Choice(what, requested, "fp32", f"{hardware.evidence}, but bf16 without ZeRO keeps no fp32 master weights")


PLANNED_GPU = Hardware("cuda", "a GPU with bf16", True, "planned for a GPU with bf16 (this machine has no CUDA "
                                                      "device); set the precision for any other")


def planning_hardware() -> Hardware:
    """The GPU a plan (``--dry-run``, the memory estimate) is made for: this machine's, else ``PLANNED_GPU``."""
    import torch

    return detect("cuda") if torch.cuda.is_available() else PLANNED_GPU


def resolve_run(cfg, hardware: Hardware):
    """``cfg`` (a ``PretrainConfig``) with ``train.precision`` and ``distillation.teacher_precision`` resolved on
    ``hardware``, and the choices made (the run's, then the teacher's when it distils)."""
    from dataclasses import replace

    train = choose(cfg.train.precision, hardware, master_weights=cfg.zero.stage > 0, what="train.precision")
    choices = [train]
    distillation = cfg.distillation
    if distillation.teacher:
        teacher = choose(distillation.teacher_precision, hardware, master_weights=True,
                         what="distillation.teacher_precision")
        choices.append(teacher)
        distillation = replace(distillation, teacher_precision=teacher.precision)
    return replace(cfg, train=replace(cfg.train, precision=train.precision), distillation=distillation), choices


def gemm_slowdown(size: int = 256, repeats: int = 3) -> float:
    """How many times longer a ``size``-square matrix product takes in bf16 than in fp32 on this CPU (the best of
    ``repeats`` each, one thread): a few milliseconds where bf16 is native, some tens where it is emulated."""
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.ones(size, size, dtype=dtype), torch.ones(size, size, dtype=dtype)
            a @ b  # the first call plans the kernel
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - began)
            best[dtype] = min(times)
    finally:
        torch.set_num_threads(threads)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


def warn_once(choice: Choice, logger: logging.Logger = _log) -> None:
    """Log ``choice.warning`` the first time this process sees it."""
    if choice.warning and choice.warning not in _warned:
        _warned.add(choice.warning)
        logger.warning(choice.warning)


__all__ = ["Choice", "Hardware", "PLANNED_GPU", "REQUESTS", "choose", "resolve_run", "cpu_bf16", "cpu_hardware", "detect", "gemm_slowdown", "planning_hardware",
           "warn_once"]
