#!/usr/bin/env python
"""Benchmark of the preprocessing stage (the Apache Beam job) on the real shared data, at scale.

    python bench/preprocess.py [--quick] [--copies 8] [--reps 3] [--work DIR] [--data DIR]
    python bench/preprocess.py --against REF [--label NAME] [--pairs 3]

By default the input is the shared data (the Wikipedia dump slice and the books) copied 8 times with distinct
document ids (books under new names, dumps with a new <dbname>): about 56 MiB, where the interpreter's start-up
and imports are a few percent of a run. ``--quick``: the shared data once (about 2 minutes). Measured:

1. Irreducible work: decompress + XML parse + wikitext/book cleaning + sentence split + tokenize, done standalone
   by ``bench/irreducible.py`` (no Beam) in a child process whose whole CPU is counted, as the pipeline's is.
2. End to end: ``python -m preprocess run`` with the phase-1 config in-memory (``--direct_num_workers 1``) and with
   two worker processes (``--direct_num_workers 2 --direct_running_mode multi_processing``): wall time, CPU of
   the whole process tree (``os.wait4``), peak RSS summed over the tree, shard checksums. Each repetition runs
   item 1 right before the two pipeline runs; the CPU ratio is the median of the repetitions' own ratios (this
   VM's speed drifts by up to 30 % within minutes). Also: corpus tokens per CPU-second, peak RSS per input
   byte, and the share of the run that is interpreter start-up and imports.
3. Memory budget (not with --quick): ``--max-memory`` a quarter of the in-memory run's peak; the peak must stay
   under it and the shards must be byte-identical. When the CLI refuses it, also the smallest budget it accepts.
   And the floor under any budget: the peak of a process that imports the pipeline, loads the tokenizer and runs
   one trivial in-memory Beam pipeline.
4. Beam's DaskRunner (not with --quick): a scheduler and 2 single-threaded workers on 127.0.0.1, started for the
   run; CPU summed over scheduler, workers and driver; the shards must be byte-identical.

``--against REF`` measures instead paired runs (1 and 2 workers, alternating) of this tree and of REF (a git
commit or a directory holding ``preprocess/`` and ``configs/``), and adds them to the results file under
``comparisons.NAME``: how a change measured at scale.

Writes ``bench/results/preprocess-<machine>.json`` and prints a summary. Run it alone on the machine (other
processes' CPU during each run is recorded, and contended runs are flagged).
"""
from __future__ import annotations

import argparse
import bz2
import datetime
import glob
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is bench/, where this file would shadow the ``preprocess`` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

CONFIG = "configs/preprocess/phase1_seq128.yaml"
VOCAB_SIZE = 8000
TARGETS = {
    "cpu_ratio_max": 1.3,          # end-to-end CPU (all processes) / irreducible CPU
    "scaling_speedup_min": 1.8,    # wall(1 worker) / wall(2 workers)
    "startup_share_max": 0.05,     # interpreter start-up and imports / the run's CPU (large input)
}
MODES = {"workers_1": ["--direct_num_workers", "1"],
         "workers_2": ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]}
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
SAMPLE_INTERVAL = 0.1              # seconds between process-tree samples
QUIET_WAIT = 10.0                  # seconds to wait for other processes to calm down before a timed run
CONTENDED_LOAD = 0.25              # other processes using more cores than this during a run: flagged
RUN_TIMEOUT = 600                  # seconds; one pipeline run that takes longer is killed
WIKI_DBNAME = b"<dbname>enwiki</dbname>"
SEPARATE_SECTIONS = ("memory_calibration", "memory_stages", "profile_8x_workers_1")  # results not written here


# --------------------------------------------------------------------------------------------------
# Machine and inputs

def machine_info() -> dict:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "slug": f"cpu{os.cpu_count()}-{platform.machine()}",
        "cpu_model": model,
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": affinity,
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "hostname_sha256_8": hashlib.sha256(platform.node().encode()).hexdigest()[:8],
    }


def versions() -> dict:
    out = {"python": platform.python_version(), "implementation": platform.python_implementation()}
    for dist in ("apache-beam", "pyarrow", "sentencepiece", "mwparserfromhell", "blingfire", "numpy",
                 "psutil", "tokenizers", "smart-open"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    try:
        out["repo_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                            text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "preprocess", "configs"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout
        out["repo_dirty"] = sorted(line[3:] for line in dirty.splitlines() if line.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    return out


def source_digest() -> str:
    """sha256 over the measured code (preprocess/*.py) and configs: tells whether the code changed mid-run."""
    digest = hashlib.sha256()
    for path in sorted([*REPO.glob("preprocess/**/*.py"), *REPO.glob("configs/preprocess/*.yaml")]):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def real_inputs(data: Path) -> dict:
    wiki = sorted(glob.glob(str(data / "wikipedia" / "*.bz2")))
    books = sorted(glob.glob(str(data / "books" / "*.txt")))
    if not wiki or not books:
        sys.exit(f"no real data under {data} (expected wikipedia/*.bz2 and books/*.txt); pass --data")
    return {"wiki": wiki, "books": books}


def describe_inputs(inputs: dict) -> dict:
    files = [{"kind": kind, "name": os.path.basename(f), "bytes": os.path.getsize(f)}
             for kind, key in (("wiki", "wiki"), ("book", "books")) for f in inputs[key]]
    return {"files": files, "file_count": len(files), "bytes": sum(f["bytes"] for f in files)}


def make_copies(inputs: dict, work: Path, copies: int) -> dict:
    """``copies`` copies of the inputs whose document ids differ (copy 1 is the originals): books under new file
    names, dumps with a new <dbname>, recompressed."""
    root = work / "input-copies"
    out = {"wiki": list(inputs["wiki"]), "books": list(inputs["books"])}
    for copy in range(2, copies + 1):
        for path in inputs["books"]:
            stem, ext = os.path.splitext(os.path.basename(path))
            target = root / "books" / f"{stem}.copy{copy}{ext}"
            if not target.exists() or target.stat().st_size != os.path.getsize(path):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            out["books"].append(str(target))
        for path in inputs["wiki"]:
            stem = os.path.basename(path)[:-len(".bz2")]
            target = root / "wikipedia" / f"{stem}.copy{copy}.bz2"
            if not target.exists():
                with bz2.open(path, "rb") as handle:
                    data = handle.read()
                if data.count(WIKI_DBNAME) != 1:
                    sys.exit(f"{path}: expected one {WIKI_DBNAME.decode()}, found {data.count(WIKI_DBNAME)}")
                data = data.replace(WIKI_DBNAME, WIKI_DBNAME.replace(b"enwiki", f"enwiki_copy{copy}".encode()))
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_suffix(".tmp")
                tmp.write_bytes(bz2.compress(data, 9))
                tmp.rename(target)
            out["wiki"].append(str(target))
    return out


# --------------------------------------------------------------------------------------------------
# Subprocess measurement

def child_env(tree: Path = REPO) -> dict:
    """The environment of a measured child: ``tree``'s ``preprocess`` package first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class TreeSampler(threading.Thread):
    """Samples a process tree: the sum of RSS (peak kept) and the last seen CPU time of every process."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.stop = threading.Event()
        self.peak_rss = 0
        self.peak_processes = 0
        self.samples = 0
        self.cpu: dict[tuple[int, float], float] = {}
        self.names: dict[tuple[int, float], str] = {}
        self.own_cpu = 0.0

    def run(self):
        started = time.thread_time()
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            rss, alive = 0, 0
            for proc in procs:
                try:
                    with proc.oneshot():
                        mem = proc.memory_info()
                        cpu = proc.cpu_times()
                        key = (proc.pid, proc.create_time())
                        if key not in self.names:
                            self.names[key] = " ".join(proc.cmdline()[:4])[:120]
                except psutil.Error:  # gone, zombie or denied between the listing and the read
                    continue
                rss += mem.rss
                alive += 1
                self.cpu[key] = cpu.user + cpu.system
            self.samples += 1
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_processes = max(self.peak_processes, alive)
            self.stop.wait(self.interval)
        self.own_cpu = time.thread_time() - started


def run_measured(cmd: list[str], log: Path, timeout: float = RUN_TIMEOUT, env: dict | None = None,
                 cwd: Path = REPO) -> dict:
    """Run ``cmd``; wall, CPU of the whole reaped tree (wait4), sampled tree CPU and RSS, ru_maxrss."""
    log.parent.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_before = _busy_cpu()
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(cwd) | (env or {}), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        sampler = TreeSampler(proc.pid, SAMPLE_INTERVAL)
        sampler.start()
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    busy_after = _busy_cpu()
    sampler.stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Anything the tree did not reap (a stray worker still running) would be missed by wait4.
    leftovers = [p.pid for p in psutil.process_iter(["pid"]) if _in_session(p, proc.pid)]
    if timed_out.is_set() or proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:6])}... failed (rc {proc.returncode}, timed out "
                           f"{timed_out.is_set()}); log {log}:\n{tail}")
    sampled_cpu = sum(sampler.cpu.values())
    wait4_cpu = usage.ru_utime + usage.ru_stime
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(wait4_cpu, 3),
        "cpu_user_s": round(usage.ru_utime, 3),
        "cpu_system_s": round(usage.ru_stime, 3),
        "rusage_children_delta_cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 3),
        "sampled_tree_cpu_s": round(sampled_cpu, 3),
        "processes_seen": len(sampler.cpu),
        # Per process, in start order (last sampled CPU): shows how the work spread over Beam's workers.
        "process_cpu_s": [{"cmd": sampler.names[key], "cpu_s": round(cpu, 2)}
                          for key, cpu in sorted(sampler.cpu.items(), key=lambda kv: kv[0][1]) if cpu >= 0.05],
        "peak_concurrent_processes": sampler.peak_processes,
        # The tree's sum is at least its largest process's high-water mark, which sampling can miss.
        "peak_tree_rss_bytes": max(sampler.peak_rss, usage.ru_maxrss * 1024),
        "sampled_peak_tree_rss_bytes": sampler.peak_rss,
        "ru_maxrss_bytes": usage.ru_maxrss * 1024,   # Linux reports KiB: the largest single process
        "samples": sampler.samples,
        "sampler_cpu_s": round(sampler.own_cpu, 3),
        "unreaped_processes": len(leftovers),
        # CPU that other processes of the machine used meanwhile (contention skews the wall times).
        "foreign_cpu_s": round(max(0.0, busy_after - busy_before - wait4_cpu - sampler.own_cpu), 3),
        "foreign_load_cores": round(max(0.0, busy_after - busy_before - wait4_cpu - sampler.own_cpu) / wall, 3),
        "log": str(log.relative_to(REPO)) if log.is_relative_to(REPO) else str(log),
    }


def _busy_cpu() -> float:
    """Machine-wide non-idle CPU seconds so far (steal and iowait excluded)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0) - getattr(t, "guest", 0.0) \
        - getattr(t, "guest_nice", 0.0)


def wait_for_quiet(max_wait: float, threshold: float = 0.3) -> float:
    """Wait (up to ``max_wait`` s) until the rest of the machine uses under ``threshold`` cores; returns that load."""
    deadline = time.monotonic() + max_wait
    while True:
        busy0, own0, t0 = _busy_cpu(), time.process_time(), time.perf_counter()
        time.sleep(1.0)
        load = (_busy_cpu() - busy0 - (time.process_time() - own0)) / (time.perf_counter() - t0)
        if load < threshold or time.monotonic() >= deadline:
            return round(max(0.0, load), 3)


def _in_session(proc: psutil.Process, sid: int) -> bool:
    try:
        return os.getsid(proc.pid) == sid
    except OSError:
        return False


def pipeline_cmd(inputs: dict, tokenizer: Path, output: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "preprocess", "run", "--config", CONFIG, "--wikipedia", *inputs["wiki"],
            "--books", *inputs["books"], "--tokenizer", str(tokenizer), "--output", str(output), "--overwrite", *args]


def run_pipeline(inputs: dict, tokenizer: Path, output: Path, args: list[str], log: Path, tree: Path = REPO,
                 quiet_wait: float = QUIET_WAIT) -> dict:
    """One measured ``python -m preprocess run`` (of ``tree``'s code), with its manifest's figures."""
    shutil.rmtree(output, ignore_errors=True)   # not part of the measured run
    load_before = wait_for_quiet(quiet_wait)
    result = run_measured(pipeline_cmd(inputs, tokenizer, output, args), log, cwd=tree)
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
        "shard_sha256": [s["sha256"] for s in manifest["shards"]],
    })
    result["cpu_accounting_check"] = _cpu_check(result)
    return result


def _cpu_check(r: dict) -> str:
    """wait4 CPU must cover the sampled CPU of every process of the tree (sampling can only see less)."""
    if r["unreaped_processes"]:
        return f"FAIL: {r['unreaped_processes']} process(es) of the tree were not reaped"
    if r["cpu_s"] + 0.05 < r["sampled_tree_cpu_s"]:
        return "FAIL: wait4 CPU below the sampled tree CPU (some descendants were not reaped)"
    return "ok"


def startup_cost(log: Path, runs: int = 3) -> dict:
    """CPU of the CLI's interpreter start-up with the pipeline modules imported (paid once per run: the local
    pool forks its workers from the driver); median of ``runs``."""
    code = ("from preprocess import cli; cli.load_pipeline_modules(); "
            "import preprocess.transforms, common.tokenizer")
    measured = [run_measured([sys.executable, "-c", code], log) for _ in range(runs)]
    return {"driver_import_cpu_s": _median(measured, "cpu_s"), "driver_import_wall_s": _median(measured, "wall_s"),
            "driver_import_peak_rss_bytes": max(r["ru_maxrss_bytes"] for r in measured)}


def irreducible(inputs: dict, tokenizer: Path, log: Path) -> dict:
    """The irreducible work done standalone: ``bench/irreducible.py`` as a child process, measured like the
    pipeline's process tree. Its own report splits off the CPU of the work itself and its phases."""
    cmd = [sys.executable, str(REPO / "bench" / "irreducible.py"), "--config", str(REPO / CONFIG),
           "--tokenizer", str(tokenizer), "--wiki", *inputs["wiki"], "--books", *inputs["books"]]
    load_before = wait_for_quiet(QUIET_WAIT)
    run = run_measured(cmd, log)
    work = json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][-1])
    return {"cpu_s": run["cpu_s"], "wall_s": run["wall_s"], **work,
            "startup_cpu_s": round(run["cpu_s"] - work["work_cpu_s"], 3),
            "foreign_load_before_cores": load_before, "foreign_load_cores": run["foreign_load_cores"],
            "contended": run["foreign_load_cores"] > CONTENDED_LOAD}


def prepare_tokenizer(inputs: dict, work: Path) -> tuple[Path, dict]:
    target = work / "tokenizer"
    stamp = {"vocab_size": VOCAB_SIZE, "lowercase": True,
             "inputs": [[os.path.basename(f), os.path.getsize(f)] for f in inputs["wiki"] + inputs["books"]]}
    stamp_file = work / "tokenizer.stamp.json"
    if (target / "tokenizer.json").exists() and stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return target, {"reused": True}
    shutil.rmtree(target, ignore_errors=True)
    cmd = [sys.executable, "-m", "preprocess", "tokenizer", "train", "--wikipedia", *inputs["wiki"],
           "--books", *inputs["books"], "--vocab-size", str(VOCAB_SIZE), "--lowercase", "--output", str(target)]
    result = run_measured(cmd, work / "logs" / "tokenizer-train.log")
    stamp_file.write_text(json.dumps(stamp))
    return target, {"reused": False, "wall_s": result["wall_s"], "cpu_s": result["cpu_s"]}


# --------------------------------------------------------------------------------------------------
# Memory budget and Dask

def budget_run(inputs: dict, tokenizer: Path, work: Path, unbudgeted: dict) -> dict:
    """The in-memory run under ``--max-memory`` a quarter of its unbudgeted peak; when the CLI refuses that (below
    its estimate for one input file per part), also under the smallest budget it accepts."""
    from preprocess import memory

    files = [("wiki", u, os.path.getsize(u)) for u in inputs["wiki"]] + \
            [("book", u, os.path.getsize(u)) for u in inputs["books"]]
    smallest = memory.estimated_peak(files, len(files))
    out = {"unbudgeted_peak_bytes": unbudgeted["peak_tree_rss_bytes"],
           "smallest_accepted_budget_bytes": smallest}
    budgets = {"quarter": unbudgeted["peak_tree_rss_bytes"] // 4, "smallest_accepted": smallest}
    for name, budget in budgets.items():
        log = work / "logs" / f"budget-{name}.log"
        try:
            r = run_pipeline(inputs, tokenizer, work / "out" / f"budget-{name}",
                             [*MODES["workers_1"], "--max-memory", str(budget)], log)
        except RuntimeError as exc:   # refused: the budget is below one input file per part
            out[name] = {"budget_bytes": budget, "refused": str(exc).strip().splitlines()[-1],
                         "under_budget": False, "shards_identical": False}
            continue
        chosen = re.search(r"max-memory \S+: \d+ parts? \(estimated peak \S+ per part\)", log.read_text())
        out[name] = {"budget_bytes": budget, "parts_chosen": r["parts"], "log_line": chosen and chosen.group(0),
                     "peak_tree_rss_bytes": r["peak_tree_rss_bytes"], "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
                     "peak_over_budget": round(r["peak_tree_rss_bytes"] / budget, 3),
                     "under_budget": r["peak_tree_rss_bytes"] <= budget,
                     "shards_identical": r["shard_sha256"] == unbudgeted["shard_sha256"], "run": r}
        if name == "quarter" and budget >= smallest:
            break
    if not out["quarter"]["under_budget"]:
        out["floor"] = memory_floor(tokenizer, work / "logs" / "memory-floor.log")
    return out


FLOOR_PROBE = """
import sys
import apache_beam as beam
from preprocess import cli
cli.load_pipeline_modules()
from common.tokenizer import load_tokenizer
from preprocess.beamrun import beam_options, run_beam
tokenizer = load_tokenizer(sys.argv[1])
run_beam(beam_options(["--direct_num_workers", "1"]), lambda p, lot: (
    p | beam.Create(range(100)) | beam.Map(lambda x: (x % 7, x)) | beam.GroupByKey()), in_process=True)
"""


def memory_floor(tokenizer: Path, log: Path, runs: int = 3) -> dict:
    """Peak RSS of a process that imports the pipeline, loads the tokenizer and runs one trivial in-memory Beam
    pipeline (Create, Map, GroupByKey): what every part of a budgeted run needs before it holds any data."""
    measured = [run_measured([sys.executable, "-c", FLOOR_PROBE, str(tokenizer)], log) for _ in range(runs)]
    return {"one_trivial_pipeline_peak_bytes": max(r["ru_maxrss_bytes"] for r in measured),
            "method": "max ru_maxrss of python -c: load_pipeline_modules(), load_tokenizer, one Create | Map | "
                      f"GroupByKey pipeline on the in-memory runner ({runs} runs)"}


def _describe_budget(name: str, b: dict) -> str:
    if "refused" in b:
        return f"{name} {_mib(b['budget_bytes'])} MiB: refused ({b['refused'][:160]})"
    return (f"{name} {_mib(b['budget_bytes'])} MiB: {b['parts_chosen']} parts, peak {_mib(b['peak_tree_rss_bytes'])} "
            f"MiB, under budget {b['under_budget']}, shards identical {b['shards_identical']}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop_and_reap(proc: subprocess.Popen) -> float:
    """SIGTERM, wait; the CPU of the process and of every descendant it reaped."""
    proc.terminate()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime


def dask_run(inputs: dict, tokenizer: Path, work: Path, workers: int = 2) -> dict:
    """The pipeline on Beam's DaskRunner against a scheduler and ``workers`` single-threaded workers, all on
    127.0.0.1 and started for this run; CPU summed over scheduler, workers (with their nannies) and driver."""
    logs = work / "logs"
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    started = time.perf_counter()

    def spawn(cmd: list[str], name: str) -> subprocess.Popen:
        with open(logs / f"dask-{name}.log", "wb") as log:
            return subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    cluster = [spawn(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                      "--dashboard-address", f"127.0.0.1:{_free_port()}"], "scheduler")]
    try:
        from distributed import Client

        for i in range(workers):
            cluster.append(spawn(["dask", "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                                  "--no-dashboard"], f"worker{i}"))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        ready = time.perf_counter() - started
        r = run_pipeline(inputs, tokenizer, work / "out" / "dask",
                         ["--runner", DASK_RUNNER, "--dask_client_address", address], logs / "dask-driver.log")
    finally:
        cluster_cpu = [_stop_and_reap(proc) for proc in cluster]
    return {"workers": workers, "address": "127.0.0.1 only", "cluster_start_wall_s": round(ready, 3),
            "driver_wall_s": r["wall_s"], "driver_cpu_s": r["cpu_s"],
            "scheduler_cpu_s": round(cluster_cpu[0], 3), "workers_cpu_s": [round(c, 3) for c in cluster_cpu[1:]],
            "cpu_s": round(r["cpu_s"] + sum(cluster_cpu), 3), "peak_driver_tree_rss_bytes": r["peak_tree_rss_bytes"],
            "shard_sha256": r["shard_sha256"], "contended": r["contended"], "run": r}


# --------------------------------------------------------------------------------------------------
# Paired comparison with another tree

def reference_tree(ref: str, work: Path) -> tuple[Path, str]:
    """A directory with ``preprocess/`` and ``configs/``: ``ref`` itself, or a git commit exported under work/."""
    if Path(ref).is_dir():
        return Path(ref).resolve(), str(Path(ref).resolve())
    commit = subprocess.run(["git", "rev-parse", ref], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    target = work / "trees" / commit[:12]
    if not (target / "preprocess").is_dir():
        archive = subprocess.run(["git", "archive", commit, "preprocess", "configs"], cwd=REPO,
                                 capture_output=True, check=True).stdout
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
    return target, commit


def compare(inputs: dict, tokenizer: Path, work: Path, ref: str, pairs: int, say) -> dict:
    """Paired runs of this tree and of ``ref``, alternating; the median of the pairs' differences."""
    tree, described = reference_tree(ref, work)
    out: dict = {"reference": described, "pairs": pairs, "input_bytes": describe_inputs(inputs)["bytes"]}
    for mode, args in MODES.items():
        rows = []
        for i in range(pairs):
            pair = {}
            for name, where in (("reference", tree), ("this_tree", REPO)):
                r = run_pipeline(inputs, tokenizer, work / "out" / f"compare-{name}", args,
                                 work / "logs" / f"compare-{mode}-{name}-{i}.log", tree=where)
                pair[name] = {k: r[k] for k in ("cpu_s", "wall_s", "peak_tree_rss_bytes", "shard_sha256", "contended")}
            rows.append(pair)
            say(f"compare {mode} #{i + 1}: reference {pair['reference']['cpu_s']:.2f} CPU-s "
                f"{pair['reference']['wall_s']:.2f} s, this tree {pair['this_tree']['cpu_s']:.2f} CPU-s "
                f"{pair['this_tree']['wall_s']:.2f} s")
        out[mode] = {
            f"{key}_change": round(statistics.median(p["this_tree"][key] / p["reference"][key] - 1 for p in rows), 4)
            for key in ("cpu_s", "wall_s", "peak_tree_rss_bytes")}
        out[mode]["shards_identical"] = len({tuple(p[n]["shard_sha256"]) for p in rows for n in p}) == 1
        out[mode]["pairs"] = rows
    return out


# --------------------------------------------------------------------------------------------------
# Main

def _median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def _mib(n: float) -> float:
    return round(n / 2**20, 1)


def summarize(runs: dict[str, list[dict]], irr_runs: list[dict], input_bytes: int, startup: dict) -> dict:
    """Per mode: medians, the paired CPU ratio, tokens per CPU-second, peak RSS per input byte, start-up share."""
    e2e = {}
    for mode, rs in runs.items():
        quiet = [r for r in rs if not r["contended"]]   # other processes skew wall time far more than CPU time
        cpu, wall = _median(quiet or rs, "cpu_s"), _median(quiet or rs, "wall_s")
        pairs = [(r, i) for r, i in zip(rs, irr_runs) if not (r["contended"] or i["contended"])] \
            or list(zip(rs, irr_runs))
        peak = int(statistics.median(r["peak_tree_rss_bytes"] for r in rs))
        e2e[mode] = {
            "beam_args": MODES[mode], "wall_s": wall, "cpu_s": cpu,
            "medians_over": f"{len(quiet)} uncontended run(s)" if quiet else f"all {len(rs)} runs (all contended)",
            "cpu_ratio_vs_irreducible": round(statistics.median(r["cpu_s"] / i["cpu_s"] for r, i in pairs), 3),
            "cpu_ratio_vs_irreducible_runs": [round(r["cpu_s"] / i["cpu_s"], 3) for r, i in pairs],
            "cpu_ratio_vs_irreducible_work_only": round(statistics.median(r["cpu_s"] / i["work_cpu_s"]
                                                                          for r, i in pairs), 3),
            "corpus_tokens_per_cpu_s": round(rs[0]["corpus_tokens"] / cpu, 1),
            "corpus_tokens_per_wall_s": round(rs[0]["corpus_tokens"] / wall, 1),
            "peak_tree_rss_bytes": peak,
            "peak_rss_per_input_byte": round(peak / input_bytes, 2),
            "startup_share_of_cpu": round(startup["driver_import_cpu_s"] / cpu, 4),
            "runs": rs,
        }
    return e2e


def main(argv=None) -> int:
    global QUIET_WAIT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the shared data once; no budget or Dask run")
    parser.add_argument("--copies", type=int, help="copies of the shared data (default 8; 1 with --quick)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of items 1-2 (default 3)")
    parser.add_argument("--against", metavar="REF", help="only paired runs against REF (a commit or a directory)")
    parser.add_argument("--label", help="name of the --against comparison in the results (default: REF)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs per mode with --against (default 3)")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "work" / "preprocess",
                        help="scratch dir (default bench/work/preprocess)")
    parser.add_argument("--data", type=Path, default=(REPO / ".." / "shared" / "data").resolve(),
                        help="real data dir with wikipedia/ and books/ (default ../shared/data)")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--note", help="free text recorded in the results")
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT,
                        help="seconds to wait, before each timed run, for other processes to go quiet (default 10)")
    args = parser.parse_args(argv)
    QUIET_WAIT = args.quiet_wait
    copies = args.copies or (1 if args.quick else 8)
    work = args.work.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    begun = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - begun:6.1f}s] {message}", flush=True)

    machine = machine_info()
    source_at_start = source_digest()
    shared = real_inputs(args.data)
    tokenizer, tok_info = prepare_tokenizer(shared, work)
    inputs = make_copies(shared, work, copies)
    described = describe_inputs(inputs)
    say(f"machine {machine['slug']}: {machine['cpu_model']}; input {copies}x: {described['file_count']} files, "
        f"{_mib(described['bytes'])} MiB; tokenizer {'reused' if tok_info['reused'] else 'trained'}")
    args.results.mkdir(parents=True, exist_ok=True)
    out_file = args.results / f"preprocess-{machine['slug']}.json"
    previous = json.loads(out_file.read_text()) if out_file.exists() else {}

    if args.against:
        label = args.label or args.against
        result = compare(inputs, tokenizer, work, args.against, args.pairs, say)
        result |= {"date": _now(), "copies": copies, "versions": versions(), "note": args.note}
        previous.setdefault("comparisons", {})[label] = result
        out_file.write_text(json.dumps(previous, indent=2) + "\n")
        for mode in MODES:
            say(f"{label}, {mode}: CPU {result[mode]['cpu_s_change']:+.1%}, wall {result[mode]['wall_s_change']:+.1%},"
                f" peak RSS {result[mode]['peak_tree_rss_bytes_change']:+.1%} (this tree against {args.against}); "
                f"shards identical: {result[mode]['shards_identical']}")
        return 0

    startup = startup_cost(logs / "startup.log")
    say(f"start-up: driver imports {startup['driver_import_cpu_s']:.2f} CPU-s")
    irr_runs: list[dict] = []
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for rep in range(args.reps):
        r = irreducible(inputs, tokenizer, logs / f"irreducible-{rep}.log")
        irr_runs.append(r)
        say(f"irreducible #{rep + 1}: {r['cpu_s']:.2f} CPU-s (work {r['work_cpu_s']:.2f}), "
            f"{r['corpus_tokens']:,} tokens")
        for mode, beam in MODES.items():
            r = run_pipeline(inputs, tokenizer, work / "out" / mode, beam, logs / f"{mode}-{rep}.log")
            runs[mode].append(r)
            say(f"{mode} #{rep + 1}: wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s, peak tree RSS "
                f"{_mib(r['peak_tree_rss_bytes'])} MiB; cpu check {r['cpu_accounting_check']}; "
                f"other load {r['foreign_load_cores']:.2f} cores")
    irr = {key: _median(irr_runs, key) for key in ("cpu_s", "wall_s", "work_cpu_s", "startup_cpu_s", "read_cpu_s",
                                                    "clean_split_cpu_s", "tokenize_cpu_s")}
    irr |= {"corpus_tokens": irr_runs[0]["corpus_tokens"], "documents": irr_runs[0]["documents"], "runs": irr_runs}
    e2e = summarize(runs, irr_runs, described["bytes"], startup)
    w1, w2 = e2e["workers_1"], e2e["workers_2"]
    speedup = round(w1["wall_s"] / w2["wall_s"], 3)

    budget = dask = None
    if not args.quick:
        budget = budget_run(inputs, tokenizer, work, {"peak_tree_rss_bytes": w1["peak_tree_rss_bytes"],
                                                      "shard_sha256": runs["workers_1"][0]["shard_sha256"]})
        say("; ".join(_describe_budget(name, budget[name]) for name in ("quarter", "smallest_accepted")
                      if name in budget))
        if "floor" in budget:
            say(f"memory floor (imports, tokenizer, one trivial pipeline): "
                f"{_mib(budget['floor']['one_trivial_pipeline_peak_bytes'])} MiB")
        dask = dask_run(inputs, tokenizer, work)
        dask["cpu_ratio_vs_irreducible"] = round(dask["cpu_s"] / irr["cpu_s"], 3)
        dask["shards_identical"] = dask["shard_sha256"] == runs["workers_1"][0]["shard_sha256"]
        say(f"dask: wall {dask['driver_wall_s']:.2f} s, CPU {dask['cpu_s']:.2f} s (ratio "
            f"{dask['cpu_ratio_vs_irreducible']:.2f}), identical {dask['shards_identical']}")

    all_sha = {tuple(r["shard_sha256"]) for rs in runs.values() for r in rs}
    checks = {
        "shards_identical_1_vs_2_workers": len(all_sha) == 1,
        "shard_sha256": runs["workers_1"][0]["shard_sha256"],
        "irreducible_tokens_equal_pipeline_corpus_tokens":
            irr["corpus_tokens"] == runs["workers_1"][0]["corpus_tokens"],
        "cpu_accounting": sorted({r["cpu_accounting_check"] for rs in runs.values() for r in rs}),
        "contended_runs": [f"{mode} #{i + 1}" for mode, rs in runs.items() for i, r in enumerate(rs) if r["contended"]]
                          + [f"irreducible #{i + 1}" for i, r in enumerate(irr_runs) if r["contended"]],
    }
    if budget:
        for name in ("quarter", "smallest_accepted"):
            if name in budget:
                checks[f"budget_{name}_under_budget"] = budget[name]["under_budget"]
                checks[f"budget_{name}_shards_identical"] = budget[name]["shards_identical"]
    if dask:
        checks["dask_shards_identical"] = dask["shards_identical"]
    targets = {
        "cpu_ratio_workers_1": (w1["cpu_ratio_vs_irreducible"], "<=", TARGETS["cpu_ratio_max"]),
        "cpu_ratio_workers_2": (w2["cpu_ratio_vs_irreducible"], "<=", TARGETS["cpu_ratio_max"]),
        "speedup_1_to_2_workers": (speedup, ">=", TARGETS["scaling_speedup_min"]),
        "startup_share_workers_1": (w1["startup_share_of_cpu"], "<=", TARGETS["startup_share_max"]),
    }
    targets = {name: {"value": v, "target": f"{op} {t}", "pass": v <= t if op == "<=" else v >= t}
               for name, (v, op, t) in targets.items()}
    if args.quick:
        targets.pop("startup_share_workers_1")   # the 1x input is too small for start-up to be a small share

    results = {
        "benchmark": "preprocess", "date": _now(), "mode": "quick" if args.quick else "large",
        "copies": copies, "repetitions": args.reps, "machine": machine, "versions": versions(),
        "source_sha256": source_at_start, "source_changed_during_run": source_digest() != source_at_start,
        "note": args.note, "config": CONFIG,
        "tokenizer": {"kind": "sentencepiece", "vocab_size": VOCAB_SIZE, "lowercase": True, **tok_info},
        "input": described | {"copies": copies, "corpus_tokens": runs["workers_1"][0]["corpus_tokens"],
                              "documents_used": runs["workers_1"][0]["documents_used"],
                              "instances": runs["workers_1"][0]["instances"]},
        "method": {
            "irreducible": "bench/irreducible.py as a child process, measured like the pipeline (os.wait4 rusage): "
                           "interpreter, the imports the work needs, tokenizer load, read + clean + split + tokenize",
            "pipeline_cpu": "os.wait4 rusage of the `python -m preprocess run` child and every descendant it reaped",
            "peak_rss": f"max over psutil samples every {SAMPLE_INTERVAL} s of the summed RSS of the process tree "
                        "(at least the largest process's ru_maxrss)",
            "cpu_ratio": "median over the repetitions of pipeline CPU / irreducible CPU of the same repetition",
            "startup_share": "CPU of `python -c` importing the CLI and the pipeline modules (median of 3) / the "
                             "run's CPU; the local pool forks its workers from the driver, so it is paid once",
            "budget": "--max-memory a quarter of the median peak of the in-memory (1 worker) runs, 1 worker; "
                      "when refused, also the smallest budget the estimate accepts (one input file per part)",
            "dask": "DaskRunner, `dask scheduler` and 2 `dask worker --nthreads 1` on 127.0.0.1 started for the run; "
                    "CPU of scheduler, workers (nannies and their worker processes) and the driver's tree",
        },
        "startup": startup, "irreducible": irr, "end_to_end": e2e,
        "scaling": {"speedup_wall_1_over_2_workers": speedup, "wall_1_worker_s": w1["wall_s"],
                    "wall_2_workers_s": w2["wall_s"]},
        "memory_budget": budget, "dask": dask, "checks": checks, "targets": targets,
        "all_checks_pass": all(v is not False for k, v in checks.items() if k != "contended_runs")
                           and checks["cpu_accounting"] == ["ok"],
        "comparisons": previous.get("comparisons", {}) if previous.get("machine", {}).get("slug") == machine["slug"]
                       else {},
        # Measured separately (each says how), kept until measured again.
        **{key: previous[key] for key in SEPARATE_SECTIONS
           if key in previous and previous.get("machine", {}).get("slug") == machine["slug"]},
        "bench_wall_s": round(time.perf_counter() - begun, 1),
    }
    out_file.write_text(json.dumps(results, indent=2) + "\n")

    ok = lambda t: "PASS" if targets[t]["pass"] else "MISS"  # noqa: E731
    print()
    print(f"Preprocess benchmark, {machine['slug']} ({machine['cpu_model']}), {results['mode']}, {args.reps} rep(s)")
    print(f"  input: {copies}x, {described['file_count']} files, {_mib(described['bytes'])} MiB, "
          f"{runs['workers_1'][0]['corpus_tokens']:,} corpus tokens")
    print(f"  irreducible: {irr['cpu_s']:.2f} CPU-s (the work alone {irr['work_cpu_s']:.2f})")
    for mode, name in (("workers_1", "cpu_ratio_workers_1"), ("workers_2", "cpu_ratio_workers_2")):
        m = e2e[mode]
        print(f"  {mode}: wall {m['wall_s']:.2f} s, CPU {m['cpu_s']:.2f} s, ratio {m['cpu_ratio_vs_irreducible']:.2f} "
              f"[{ok(name)} <= {TARGETS['cpu_ratio_max']}], {m['corpus_tokens_per_cpu_s']:,.0f} tokens/CPU-s, peak "
              f"{_mib(m['peak_tree_rss_bytes'])} MiB = {m['peak_rss_per_input_byte']:.1f} B per input byte, start-up "
              f"{m['startup_share_of_cpu']:.1%}")
    print(f"  speed-up 1 -> 2 workers: {speedup:.2f} [{ok('speedup_1_to_2_workers')} >= "
          f"{TARGETS['scaling_speedup_min']}]; shards identical: {checks['shards_identical_1_vs_2_workers']} "
          f"({checks['shard_sha256'][0][:16]}...)")
    if budget:
        print(f"  memory budget (unbudgeted peak {_mib(budget['unbudgeted_peak_bytes'])} MiB): "
              + "; ".join(_describe_budget(n, budget[n]) for n in ("quarter", "smallest_accepted") if n in budget))
        if "floor" in budget:
            print(f"  memory floor (imports, tokenizer, one trivial pipeline): "
                  f"{_mib(budget['floor']['one_trivial_pipeline_peak_bytes'])} MiB")
    if dask:
        print(f"  dask (2 workers): wall {dask['driver_wall_s']:.2f} s, CPU {dask['cpu_s']:.2f} s, ratio "
              f"{dask['cpu_ratio_vs_irreducible']:.2f}, identical {dask['shards_identical']}")
    if results["source_changed_during_run"]:
        print("  WARNING: preprocess/ or configs/ changed while the benchmark ran: the figures mix code versions")
    if checks["contended_runs"]:
        print(f"  WARNING: other processes were busy during {', '.join(checks['contended_runs'])}")
    print(f"  results: {out_file.relative_to(REPO) if out_file.is_relative_to(REPO) else out_file}")
    return 0 if results["all_checks_pass"] else 1


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
