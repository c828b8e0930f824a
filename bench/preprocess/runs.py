"""The preprocessing benchmark's measured runs: one pipeline run, the irreducible work, the driver's start-up.

Each is a child process measured whole by ``bench.processes.run_measured`` (``os.wait4`` CPU of its tree, summed
RSS), started once the rest of the machine is quiet (``bench.cpu.wait_for_quiet``) and flagged as contended when
other processes used more than ``CONTENDED_LOAD`` cores meanwhile.
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.cpu import CONTENDED_LOAD, wait_for_quiet
from bench.processes import run_measured
from bench.record import REPO

CONFIG = "configs/preprocess/phase1_seq128.yaml"
MODES = {"workers_1": ["--direct_num_workers", "1"],
         "workers_2": ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]}
QUIET_WAIT = 10.0   # seconds to wait for other processes to calm down before a timed run


@dataclass(frozen=True)
class Setting:
    """What every run of one benchmark shares: the input files (``{"wiki": [...], "books": [...]}``), the tokenizer,
    the scratch directory (outputs under ``out/``, logs under ``logs/``), the wait for a quiet machine and the
    config (its ``inputs:`` sources are inputs too)."""

    inputs: dict
    tokenizer: Path
    work: Path
    quiet_wait: float = QUIET_WAIT
    config: str = CONFIG

    @property
    def logs(self) -> Path:
        return self.work / "logs"


def median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def mib(n: float) -> float:
    return round(n / 2**20, 1)


def pipeline_cmd(setting: Setting, output: Path, args: list[str], launcher: list[str] | None = None) -> list[str]:
    """``python -m preprocess run`` (or ``launcher`` + ``run``) of the benchmark's config on its inputs, with Beam's
    ``args``."""
    return [*(launcher or [sys.executable, "-m", "preprocess"]), "run", "--config", setting.config,
            *builtin_args(setting.inputs), "--tokenizer", str(setting.tokenizer), "--output", str(output),
            "--overwrite", *args]


def builtin_args(inputs: dict, flags: tuple[str, str] = ("--wikipedia", "--books")) -> list[str]:
    """The flags that pass the dumps and books of ``inputs`` (none for an empty list)."""
    out = []
    for flag, key in zip(flags, ("wiki", "books")):
        if inputs.get(key):
            out += [flag, *inputs[key]]
    return out


def run_pipeline(setting: Setting, output: Path, args: list[str], log: Path, tree: Path = REPO,
                 launcher: list[str] | None = None) -> dict:
    """One measured ``python -m preprocess run`` (of ``tree``'s code; started by ``launcher`` where given), with its
    manifest's figures."""
    shutil.rmtree(output, ignore_errors=True)   # not part of the measured run
    load_before = wait_for_quiet(setting.quiet_wait)
    result = run_measured(pipeline_cmd(setting, output, args, launcher), log, cwd=tree)
    result["foreign_load_before_cores"] = load_before
    result["contended"] = result["foreign_load_cores"] > CONTENDED_LOAD
    manifest = json.loads((output / "manifest.json").read_text())
    summary, docs = manifest["summary"], manifest["statistics"]["documents"]
    result.update({
        "corpus_tokens": summary["corpus_tokens"],
        "documents_used": summary["documents"],
        "documents_read": docs["read"],
        "instances": summary["instances"],
        "instance_tokens": summary["instance_tokens"],
        "parts": manifest["parameters"]["parts"],
        "layout": manifest["layout"],
        "shard_sha256": [s["sha256"] for s in manifest["shards"]],
    })
    result["cpu_accounting_check"] = cpu_check(result)
    return result


def cpu_check(run: dict) -> str:
    """"ok", or why the wait4 CPU of ``run`` may miss some of its tree: wait4 must cover the sampled CPU of every
    process (sampling can only see less), and every process must have been reaped."""
    if run["unreaped_processes"]:
        return f"FAIL: {run['unreaped_processes']} process(es) of the tree were not reaped"
    if run["cpu_s"] + 0.05 < run["sampled_tree_cpu_s"]:
        return "FAIL: wait4 CPU below the sampled tree CPU (some descendants were not reaped)"
    return "ok"


def startup_cost(log: Path, runs: int = 3) -> dict:
    """CPU of the CLI's interpreter start-up with the pipeline modules imported (``python -m bench.stage_imports
    preprocess``; paid once per run: the local pool forks its workers from the driver); median of ``runs``."""
    measured = [run_measured([sys.executable, "-m", "bench.stage_imports", "preprocess"], log) for _ in range(runs)]
    return {"driver_import_cpu_s": median(measured, "cpu_s"), "driver_import_wall_s": median(measured, "wall_s"),
            "driver_import_peak_rss_bytes": max(r["ru_maxrss_bytes"] for r in measured)}


def irreducible(setting: Setting, log: Path) -> dict:
    """The irreducible work done standalone: ``python -m bench.preprocess.irreducible`` as a child process, measured like the
    pipeline's process tree. Its own report splits off the CPU of the work itself and its phases."""
    cmd = [sys.executable, "-m", "bench.preprocess.irreducible", "--config", str(REPO / setting.config),
           "--tokenizer", str(setting.tokenizer), *builtin_args(setting.inputs, ("--wiki", "--books"))]
    load_before = wait_for_quiet(setting.quiet_wait)
    run = run_measured(cmd, log)
    work = json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][-1])
    return {"cpu_s": run["cpu_s"], "wall_s": run["wall_s"], **work,
            "startup_cpu_s": round(run["cpu_s"] - work["work_cpu_s"], 3),
            "foreign_load_before_cores": load_before, "foreign_load_cores": run["foreign_load_cores"],
            "contended": run["foreign_load_cores"] > CONTENDED_LOAD}
