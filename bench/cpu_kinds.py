"""What a user can expect on this kind of CPU: bf16 against fp32 matrix products, the precision ``auto`` picks, and
the wall time of the README's two commands from a fresh clone.

    python -m bench.cpu_kinds [--emulate-avx2] [--demo] [--suite] [--new-venv] [--results DIR]

``--emulate-avx2`` runs everything with ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` exported, which
makes torch on any x86-64 CPU behave as on one with AVX2 only (no AVX-512, no native bf16); the GEMM rates show
whether the emulation took. ``--demo`` times ``bash scripts/demo.sh`` in a fresh clone of HEAD; ``--suite`` times
``CI=true bash scripts/test.sh`` (what ``.ci/run`` runs) in another, and keeps its 40 slowest tests.
``--new-venv`` runs each in a new, empty virtual environment (its ``python3`` first on the PATH), as on a new
machine, instead of this interpreter's environment; the demo's own summary line gives its time after the install.
Results go to ``bench/results/cpu-kinds-<kind>-<machine>.json`` (kind: ``amx`` or ``bf16`` where the CPU computes bf16
natively, with AMX tiles or AVX-512 BF16, ``avx512`` or ``avx2`` otherwise), one entry per mode (native or AVX2-emulated), kept across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import record
from common import processes

EMULATION = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
GEMM_SIZE = 512
DEMO_TIMEOUT = 1800      # seconds; the goal is 150 on 2 AVX2-only cores
SUITE_TIMEOUT = 3 * 3600  # seconds; the goal is 1,800
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")

GEMM_PROBE = f"""
import json, time, torch
from pretrain import precision
torch.set_num_threads(1)
rates = {{}}
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    a, b = torch.randn({GEMM_SIZE}, {GEMM_SIZE}).to(dtype), torch.randn({GEMM_SIZE}, {GEMM_SIZE}).to(dtype)
    a @ b
    began, count = time.perf_counter(), 0
    while time.perf_counter() - began < 2.0:
        a @ b
        count += 1
    rates[name] = round(2 * {GEMM_SIZE} ** 3 * count / (time.perf_counter() - began) / 1e9, 2)
hardware = precision.cpu_hardware()
choice = precision.choose("auto", hardware, what="train.precision")
print(json.dumps({{"gemm_gflops_one_thread": rates, "bf16_slowdown": round(rates["fp32"] / rates["bf16"], 1),
                  "aten_capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": hardware.bf16,
                  "auto": choice.precision, "reason": choice.reason}}))
"""


def environment(emulate: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in EMULATION}
    return env | EMULATION if emulate else env


def in_new_venv(env: dict, work: Path) -> dict:
    """``env`` with a new, empty virtual environment's ``python3`` first on the PATH (what a new machine has)."""
    venv = work / "venv"
    processes.run([sys.executable, "-m", "venv", str(venv)], timeout=300, check=True)
    clean = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return clean | {"PATH": f"{venv / 'bin'}:{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}


def gemm(emulate: bool) -> dict:
    """Single-thread GEMM rates in fp32 and bf16, and the precision ``auto`` picks, in a fresh process (torch and
    oneDNN read the emulation variables at start-up)."""
    result = processes.run([sys.executable, "-c", GEMM_PROBE], cwd=record.REPO, env=environment(emulate),
                           capture_output=True, text=True, timeout=300, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def cpu_flags() -> dict:
    with open("/proc/cpuinfo") as info:
        flags = next((set(line.split(":", 1)[1].split()) for line in info if line.startswith("flags")), set())
    return {flag: flag in flags for flag in FLAGS}


def cpu_kind(flags: dict) -> str:
    """The kind of CPU a result speaks for: native bf16, AVX-512 without it, or AVX2 only."""
    if flags["amx_bf16"]:
        return "amx"  # bf16 matrix tiles: a kind of its own beside AVX-512 BF16 (results kept apart)
    if flags["avx512_bf16"]:
        return "bf16"
    return "avx512" if flags["avx512f"] else "avx2"


def fresh_clone(into: Path) -> Path:
    """A clone of HEAD (committed code only, as CI and a new user get it), beside a link to this checkout's
    ``../shared`` (the real data the tests find next to the repository, as in CI)."""
    target = into / "clone"
    processes.run(["git", "clone", "--quiet", str(record.REPO), str(target)], timeout=300, check=True)
    shared = record.REPO.parent / "shared"
    if shared.is_dir():
        (into / "shared").symlink_to(shared)
    return target


def timed(argv: list[str], cwd: Path, env: dict, timeout: float, log: Path) -> dict:
    """Run ``argv`` to completion (output to ``log``); its wall seconds and exit status."""
    began = time.perf_counter()
    with open(log, "w") as out:
        try:
            status = processes.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            status = "timed out"
    return {"wall_s": round(time.perf_counter() - began, 1), "status": status, "log_tail": log.read_text()[-1500:]}


def demo(emulate: bool, work: Path, new_venv: bool) -> dict:
    clone = fresh_clone(work)
    env = in_new_venv(environment(emulate), work) if new_venv else environment(emulate)
    found = timed(["bash", "scripts/demo.sh", str(work / "demo-output")], clone, env, DEMO_TIMEOUT, work / "demo.log")
    log = (work / "demo.log").read_text()
    chosen = re.findall(r"train\.precision: (\w+) \(auto", log)
    after = re.findall(r"^demo: done in (\d+) s, (\d+) s of it after the install", log, flags=re.M)
    return found | {"precision_chosen": chosen[0] if chosen else None, "new_venv": new_venv,
                    "after_install_s": int(after[-1][1]) if after else None}


def suite(emulate: bool, work: Path, new_venv: bool) -> dict:
    clone = fresh_clone(work)
    env = (in_new_venv(environment(emulate), work) if new_venv else environment(emulate)) | {"CI": "true"}
    found = timed(["bash", "scripts/test.sh"], clone, env, SUITE_TIMEOUT, work / "suite.log")  # it prints the slowest
    log = (work / "suite.log").read_text()
    final = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    slowest = re.findall(r"^(\d+\.\d+)s (call|setup|teardown)\s+(\S+)$", log, flags=re.M)
    return found | {"summary": final[-1].strip("= ") if final else None, "new_venv": new_venv,
                    "slowest": [{"seconds": float(s), "phase": phase, "test": test} for s, phase, test in slowest]}


def reinstall_here() -> None:
    """Point the editable install back at this checkout (the clone's scripts installed theirs, now deleted)."""
    processes.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "-e", str(record.REPO)], timeout=600, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--emulate-avx2", action="store_true", help="export the AVX2 emulation variables")
    parser.add_argument("--demo", action="store_true", help="time scripts/demo.sh in a fresh clone")
    parser.add_argument("--suite", action="store_true", help="time CI's test command in a fresh clone")
    parser.add_argument("--new-venv", action="store_true", help="run them in a new, empty virtual environment")
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    mode = "avx2_emulated" if args.emulate_avx2 else "native"
    machine = record.machine_info()
    entry = {"measured_at": record.utc_now(), "command": record.command_line(), "cpu_flags": cpu_flags(),
             "environment": EMULATION if args.emulate_avx2 else {}, "gemm": gemm(args.emulate_avx2),
             "versions": record.versions(("torch", "deepspeed", "apache-beam", "transformers"),
                                         ("common", "preprocess", "pretrain", "finetune", "configs", "scripts"))}
    print(json.dumps(entry["gemm"]))
    for wanted, run in (("demo", demo), ("suite", suite)):
        if getattr(args, wanted):
            work = Path(tempfile.mkdtemp(prefix=f"cpu-kinds-{wanted}-"))
            try:
                entry[wanted] = {"measured_at": record.utc_now(), **run(args.emulate_avx2, work, args.new_venv)}
            finally:
                shutil.rmtree(work, ignore_errors=True)
                if not args.new_venv:
                    reinstall_here()
            print(f"{wanted}: {entry[wanted]['wall_s']} s, status {entry[wanted]['status']}")
    path = record.results_file(args.results, f"cpu-kinds-{cpu_kind(entry['cpu_flags'])}", machine)
    recorded = json.loads(path.read_text()) if path.exists() else {}
    recorded["machine"] = machine
    previous = recorded.get("modes", {}).get(mode, {})
    recorded.setdefault("modes", {})[mode] = {**previous, **entry}  # a GEMM-only run keeps the last demo/suite
    record.write_json(path, recorded)
    print(f"wrote {record.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
