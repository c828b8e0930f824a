#!/usr/bin/env python
"""Benchmark of the preprocessing stage (the Apache Beam job) on the real shared data.

    python bench/preprocess.py [--quick] [--work DIR] [--data DIR] [--diagnose | --no-diagnose]

Measures, on this machine (3.5 to 7 minutes on 2 cores; --quick: one repetition, about 1.5 minutes):

1. Irreducible work: decompress + XML parse + wikitext/book cleaning + sentence split + tokenize of
   the inputs, done standalone by ``bench/irreducible.py`` (no Beam) in a child process whose whole CPU
   is counted, as the pipeline's is; its report also gives the CPU of the work alone. Each repetition
   runs it right before the pipeline runs of item 2, and the CPU ratio is the median of the
   repetitions' own ratios (this VM's speed drifts by up to 30 % within minutes).
2. End to end: ``python -m preprocess run`` with the phase-1 config, in-memory (``--direct_num_workers
   1``) and with two worker processes (``--direct_num_workers 2 --direct_running_mode
   multi_processing``): wall time, CPU time of the whole process tree (``os.wait4``: the CPU of every
   descendant the tree reaped; cross-checked against a psutil sample of the tree), peak RSS summed
   over the tree, and the shard checksums of both runs (they must agree).
3. Memory: the inputs copied four times under distinct names, run with ``--parts 4`` (and, unless
   ``--quick``, ``--parts 1``); peak tree RSS against the 1x run.
4. Diagnostics (by default in full mode when a CPU or scaling target is missed): CPU and wall per
   Beam pipeline (documents, index, instances, shards) in both modes, the speed-up on the 4x input,
   and a cProfile of the in-memory run summarised by package and by function.

Before each timed run it waits (briefly) for the rest of the machine to go quiet, and it records the
CPU other processes used during each run: on a shared machine, contended runs are flagged.

Writes ``bench/results/preprocess-<machine>.json`` and prints a summary and a README table row.
Only the standard library, psutil and the project's modules are used.
"""
from __future__ import annotations

import argparse
import bz2
import datetime
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
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
    "cpu_ratio_max": 1.5,          # end-to-end CPU (all processes) / irreducible CPU
    "scaling_speedup_min": 1.6,    # wall(1 worker) / wall(2 workers)
    "memory_ratio_max": 1.25,      # peak tree RSS, 4x input with --parts 4 / 1x input with --parts 1
}
SAMPLE_INTERVAL = 0.1              # seconds between process-tree samples
QUIET_WAIT = 10.0                  # seconds to wait for other processes to calm down before a timed run
QUIET_BUDGET = [90.0]              # seconds of such waiting in all (keeps the whole benchmark bounded)
CONTENDED_LOAD = 0.25              # other processes using more cores than this during a run: flagged
RUN_TIMEOUT = 420                  # seconds; one pipeline run that takes longer is killed
WIKI_DBNAME = b"<dbname>enwiki</dbname>"


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


def make_x4(inputs: dict, work: Path) -> dict:
    """Four copies of the inputs whose document ids differ (copy 1 is the originals)."""
    root = work / "input-x4"
    out = {"wiki": list(inputs["wiki"]), "books": list(inputs["books"])}
    for copy in (2, 3, 4):
        for path in inputs["books"]:
            stem, ext = os.path.splitext(os.path.basename(path))
            target = root / "books" / f"{stem}.copy{copy}{ext}"
            if not target.exists() or target.stat().st_size != os.path.getsize(path):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            out["books"].append(str(target))
        for path in inputs["wiki"]:
            name = os.path.basename(path)
            stem = name[:-len(".bz2")]
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

def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
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


def run_measured(cmd: list[str], log: Path, timeout: float = RUN_TIMEOUT, env: dict | None = None) -> dict:
    """Run ``cmd``; wall, CPU of the whole reaped tree (wait4), sampled tree CPU and RSS, ru_maxrss."""
    log.parent.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_before = _busy_cpu()
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env() | (env or {}), stdout=out, stderr=subprocess.STDOUT,
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
        "rusage_children_delta_cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3),
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


def pipeline_cmd(inputs: dict, tokenizer: Path, output: Path, parts: int, beam: list[str],
                 launcher: list[str] | None = None) -> list[str]:
    """The CLI's ``run`` command; ``launcher`` replaces ``python -m preprocess`` (profiler, stage timer)."""
    return ((launcher or [sys.executable, "-m", "preprocess"]) + ["run", "--config", CONFIG,
            "--wikipedia", *inputs["wiki"], "--books", *inputs["books"], "--tokenizer", str(tokenizer),
            "--output", str(output), "--overwrite", "--parts", str(parts), *beam])


def run_pipeline(inputs: dict, tokenizer: Path, output: Path, parts: int, beam: list[str], log: Path,
                 launcher: list[str] | None = None, env: dict | None = None) -> dict:
    shutil.rmtree(output, ignore_errors=True)   # not part of the measured run
    waited = time.monotonic()
    load_before = wait_for_quiet(min(QUIET_WAIT, QUIET_BUDGET[0]))
    QUIET_BUDGET[0] = max(0.0, QUIET_BUDGET[0] - (time.monotonic() - waited))
    result = run_measured(pipeline_cmd(inputs, tokenizer, output, parts, beam, launcher), log, env=env)
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
        "driver_wall_s": summary["wall_seconds"],
        "shard_sha256": [s["sha256"] for s in manifest["shards"]],
    })
    # ru_maxrss is the largest single process; the sampled sum must be at least that (sampling may miss a peak).
    result["cpu_accounting_check"] = _cpu_check(result)
    return result


def _cpu_check(r: dict) -> str:
    """wait4 CPU must cover the sampled CPU of every process of the tree (sampling can only see less)."""
    if r["unreaped_processes"]:
        return f"FAIL: {r['unreaped_processes']} process(es) of the tree were not reaped"
    if r["cpu_s"] + 0.05 < r["sampled_tree_cpu_s"]:
        return "FAIL: wait4 CPU below the sampled tree CPU (some descendants were not reaped)"
    return "ok"


def startup_cost(log: Path) -> dict:
    """CPU of starting the CLI's interpreter with the pipeline modules imported (paid once per run)."""
    # As `python -m preprocess run` imports them for a local run.
    code = ("from preprocess import cli; cli.load_pipeline_modules([]); "
            "import preprocess.transforms, preprocess.tokenizer")
    driver = run_measured([sys.executable, "-c", code], log)
    worker = run_measured([sys.executable, "-c", "import apache_beam.runners.worker.sdk_worker_main, "
                           "preprocess.transforms, preprocess.tokenizer"], log.with_name(log.stem + "-worker.log"))
    return {"driver_import_cpu_s": driver["cpu_s"], "driver_import_wall_s": driver["wall_s"],
            "worker_import_cpu_s": worker["cpu_s"], "worker_import_wall_s": worker["wall_s"]}


# --------------------------------------------------------------------------------------------------
# Irreducible work

def irreducible(inputs: dict, tokenizer: Path, log: Path) -> dict:
    """The irreducible work done standalone: ``bench/irreducible.py`` as a child process (interpreter, the imports
    the work needs, tokenizer load, read + clean + split + tokenize), measured like the pipeline's process tree.
    Its own report splits off the CPU of the work itself (``work_cpu_s``) and its phases."""
    cmd = [sys.executable, str(REPO / "bench" / "irreducible.py"), "--config", str(REPO / CONFIG),
           "--tokenizer", str(tokenizer), "--wiki", *inputs["wiki"], "--books", *inputs["books"]]
    run = run_measured(cmd, log)
    work = json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][-1])
    return {"cpu_s": run["cpu_s"], "wall_s": run["wall_s"], **work,
            "startup_cpu_s": round(run["cpu_s"] - work["work_cpu_s"], 3),
            "foreign_load_cores": run["foreign_load_cores"]}


# --------------------------------------------------------------------------------------------------
# Preparation

def prepare_tokenizer(inputs: dict, work: Path) -> tuple[Path, dict]:
    target = work / "tokenizer"
    stamp = {"vocab_size": VOCAB_SIZE, "lowercase": True,
             "inputs": [(os.path.basename(f), os.path.getsize(f)) for f in inputs["wiki"] + inputs["books"]]}
    stamp_file = work / "tokenizer.stamp.json"
    if (target / "tokenizer.json").exists() and stamp_file.exists() and json.loads(stamp_file.read_text()) == \
            json.loads(json.dumps(stamp)):
        return target, {"reused": True}
    shutil.rmtree(target, ignore_errors=True)
    cmd = [sys.executable, "-m", "preprocess", "tokenizer", "train", "--wikipedia", *inputs["wiki"],
           "--books", *inputs["books"], "--vocab-size", str(VOCAB_SIZE), "--lowercase", "--output", str(target)]
    result = run_measured(cmd, work / "logs" / "tokenizer-train.log")
    stamp_file.write_text(json.dumps(stamp))
    return target, {"reused": False, "wall_s": result["wall_s"], "cpu_s": result["cpu_s"]}


# --------------------------------------------------------------------------------------------------
# Stage breakdown (diagnostics): the CLI run with pipeline.run_beam wrapped to time each Beam pipeline

STAGE_TIMER = r"""
import concurrent.futures.process as futures_process
import json, os, resource, sys, time
entered = time.process_time()
import preprocess.pipeline as pipeline
from preprocess import cli

stages = []
original = pipeline.run_beam


def kind(labels):
    # A fused pipeline (several stages in one Beam pipeline) is named after all of them: "documents+index+...".
    joined = " ".join(labels)
    names = [name for key, name in (("Files", "documents"), ("Count", "index"), ("Index", "index"),
                                    ("CreateInstances", "instances"), ("Shards", "shards")) if key in joined]
    return "+".join(dict.fromkeys(names)) or joined


def timed(*args, **kwargs):
    # The signature changes between versions; the pipeline builder is the last positional argument.
    labels = []
    build = args[-1]

    def build_and_note(p):
        build(p)
        labels.extend(t.full_label for t in p.transforms_stack[0].parts)

    ru0, c0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time(), time.perf_counter()
    original(*args[:-1], build_and_note, **kwargs)
    w1, c1, ru1 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    stages.append({"stage": kind(labels), "wall_s": w1 - w0, "driver_cpu_s": c1 - c0,
                   "workers_cpu_s": ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime})


pipeline.run_beam = timed

# The local process pool (--direct_num_workers N > 1) runs its pipelines inside its workers: each stage is one
# pool.map, and every task reports its worker's CPU with its result (forked workers share this __main__).
POOL_STAGES = {"_documents_task": "documents", "_count_task": "index", "_instances_task": "instances",
               "_shards_task": "shards"}
original_map = futures_process.ProcessPoolExecutor.map


def call_timed(packed):
    fn, arg = packed
    c0 = time.process_time()
    result = fn(arg)
    return result, time.process_time() - c0


def timed_map(self, fn, iterable, **kwargs):
    c0, w0 = time.process_time(), time.perf_counter()
    pairs = list(original_map(self, call_timed, [(fn, arg) for arg in iterable], **kwargs))
    stages.append({"stage": POOL_STAGES.get(fn.__name__, fn.__name__), "wall_s": time.perf_counter() - w0,
                   "driver_cpu_s": time.process_time() - c0, "workers_cpu_s": sum(cpu for _, cpu in pairs)})
    return iter([result for result, _ in pairs])


futures_process.ProcessPoolExecutor.map = timed_map
try:
    rc = cli.main(sys.argv[1:])
finally:
    with open(os.environ["BENCH_STAGES_OUT"], "w") as handle:
        json.dump({"stages": stages, "cpu_at_start_s": entered, "cpu_at_exit_s": time.process_time()}, handle)
sys.exit(rc)
"""


def stage_breakdown(inputs: dict, tokenizer: Path, work: Path, mode: str, beam: list[str]) -> dict:
    """CPU and wall per Beam pipeline (documents, index, instances, shards) and outside them."""
    out_file = work / "profile" / f"stages-{mode}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    run = run_pipeline(inputs, tokenizer, work / "out" / f"stages-{mode}", 1, beam, work / "logs" / f"stages-{mode}.log",
                       launcher=[sys.executable, "-c", STAGE_TIMER], env={"BENCH_STAGES_OUT": str(out_file)})
    raw = json.loads(out_file.read_text())
    by_stage: dict[str, dict] = {}
    for st in raw["stages"]:
        agg = by_stage.setdefault(st["stage"], {"pipelines": 0, "wall_s": 0.0, "driver_cpu_s": 0.0, "workers_cpu_s": 0.0})
        agg["pipelines"] += 1
        for key in ("wall_s", "driver_cpu_s", "workers_cpu_s"):
            agg[key] += st[key]
    for agg in by_stage.values():
        agg["cpu_s"] = agg["driver_cpu_s"] + agg["workers_cpu_s"]
        for key in list(agg):
            agg[key] = round(agg[key], 3) if isinstance(agg[key], float) else agg[key]
    in_stages_driver = sum(st["driver_cpu_s"] for st in raw["stages"])
    in_stages_workers = sum(st["workers_cpu_s"] for st in raw["stages"])
    in_stages_wall = sum(st["wall_s"] for st in raw["stages"])
    return {
        "run": {k: run[k] for k in ("wall_s", "cpu_s", "peak_tree_rss_bytes", "processes_seen", "foreign_load_cores",
                                    "process_cpu_s")},
        "by_stage": by_stage,
        "driver_interpreter_start_cpu_s": round(raw["cpu_at_start_s"], 3),
        "driver_outside_beam_cpu_s": round(raw["cpu_at_exit_s"] - in_stages_driver, 3),
        "driver_outside_beam_wall_s": round(run["wall_s"] - in_stages_wall, 3),
        "workers_cpu_not_reaped_within_stage_s": round(run["cpu_s"] - raw["cpu_at_exit_s"] - in_stages_workers, 3),
        "note": "driver_outside_beam: interpreter start, imports, tokenizer load, file sizing, manifest (everything "
                "of the driver process outside the Beam pipelines); "
                "workers_cpu_s is the CPU of the worker subprocesses reaped during that stage, or with the local "
                "process pool the CPU its workers spent in that stage's tasks (pipelines then counts pool.map calls)",
    }


# --------------------------------------------------------------------------------------------------
# Profile

def _package_of(filename: str) -> str:
    if filename == "~":
        return "builtins"
    path = filename.replace("\\", "/")
    repo = str(REPO).replace("\\", "/") + "/"
    if path.startswith(repo):
        rel = path[len(repo):]
        return rel[:-3].replace("/", ".") if rel.endswith(".py") else rel
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].replace(".py", "")
    if "/lib/python" in path:
        return "stdlib." + path.split("/lib/python", 1)[1].split("/", 1)[1].split("/", 1)[0].replace(".py", "")
    return path.rsplit("/", 1)[-1]


_CLASS_LINES: dict[str, list[tuple[int, int, str]]] = {}


def _qualname(filename: str, line: int, name: str) -> str:
    """'preprocess.transforms:CleanAndTokenize.process' for a function defined in the project."""
    import ast

    if filename not in _CLASS_LINES:
        try:
            tree = ast.parse(Path(filename).read_text())
            _CLASS_LINES[filename] = [(n.lineno, n.end_lineno, n.name) for n in ast.walk(tree)
                                      if isinstance(n, ast.ClassDef)]
        except (OSError, SyntaxError):
            _CLASS_LINES[filename] = []
    owners = [c for c in _CLASS_LINES[filename] if c[0] <= line <= c[1]]
    owner = max(owners)[2] + "." if owners else ""
    return f"{_package_of(filename)}:{owner}{name}"


def profile_in_memory(inputs: dict, tokenizer: Path, work: Path) -> dict:
    """cProfile of the in-memory (one worker) run: it executes every bundle on the driver's main thread."""
    import pstats

    stats_file = work / "profile" / "in-memory.pstats"
    stats_file.parent.mkdir(parents=True, exist_ok=True)
    run = run_pipeline(inputs, tokenizer, work / "out" / "profile", 1, ["--direct_num_workers", "1"],
                       work / "logs" / "profile.log",
                       launcher=[sys.executable, "-m", "cProfile", "-o", str(stats_file), "-m", "preprocess"])
    st = pstats.Stats(str(stats_file))
    total = st.total_tt
    by_package: dict[str, float] = {}
    builtins: dict[str, float] = {}
    rows = []
    for (filename, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
        if filename == "~":
            builtins[name] = builtins.get(name, 0.0) + tt
            # A C function's time goes to the package that called it (bz2 decompress -> sources' caller...).
            for (caller_file, _, _), caller_stats in callers.items():
                package = _package_of(caller_file) if caller_file != "~" else "builtins"
                by_package[package] = by_package.get(package, 0.0) + caller_stats[2]
        else:
            package = _package_of(filename)
            by_package[package] = by_package.get(package, 0.0) + tt
        rows.append((tt, ct, nc, f"{_package_of(filename) if filename != '~' else ''}:{name}:{line}".lstrip(":")))

    def cum(package_prefix: str, func: str) -> float:
        return round(sum(ct for (f, _, n), (_, _, _, ct, _) in st.stats.items()
                         if n == func and _package_of(f).startswith(package_prefix)), 3)

    irreducible_entry = {
        "sources.iter_wikipedia": cum("preprocess.sources", "iter_wikipedia"),
        "books.iter_book": cum("preprocess.books", "iter_book"),
        "text.to_document": cum("preprocess.text", "to_document"),
        "tokenizer.encode_batch": cum("preprocess.tokenizer", "encode_batch"),
    }
    ours = sorted(((ct, tt, nc, _qualname(f, line, name)) for (f, line, name), (_, nc, tt, ct, _) in st.stats.items()
                   if _package_of(f).startswith("preprocess.") and name != "<module>"), reverse=True)
    rows.sort(reverse=True)
    return {
        "run": run,
        "pstats": str(stats_file.relative_to(REPO)) if stats_file.is_relative_to(REPO) else str(stats_file),
        "profiled_seconds": round(total, 3),
        "note": "cProfile inflates pure-Python call overhead (Beam's per-element machinery) relative to C "
                "code, so read the shares, not the absolute seconds",
        "irreducible_entry_points_cumulative_s": irreducible_entry,
        "top_project_functions_cumulative": [
            {"function": q, "cumtime_s": round(ct, 3), "tottime_s": round(tt, 3), "calls": nc}
            for ct, tt, nc, q in ours[:30]],
        "by_package_self_time_s": dict(sorted(((k, round(v, 3)) for k, v in by_package.items() if v >= 0.05),
                                            key=lambda kv: -kv[1])),
        "top_builtins_tottime_s": dict(sorted(((k, round(v, 3)) for k, v in builtins.items() if v >= 0.05),
                                              key=lambda kv: -kv[1])[:20]),
        "top_functions_tottime": [{"function": f, "tottime_s": round(tt, 3), "cumtime_s": round(ct, 3), "calls": nc}
                                  for tt, ct, nc, f in rows[:30]],
    }


# --------------------------------------------------------------------------------------------------
# Main

def diagnose(inputs, x4, tokenizer, work, modes, mem_runs, irr, say) -> dict:
    """Where the CPU and the wall time go: per-stage breakdown, 4x-input scaling, cProfile."""
    logs = work / "logs"
    diagnostics: dict = {}
    for mode, beam in modes.items():
        diagnostics[f"stages_{mode}"] = d = stage_breakdown(inputs, tokenizer, work, mode, beam)
        say(f"stages {mode}: " + ", ".join(f"{k} {v['cpu_s']:.1f} CPU-s/{v['wall_s']:.1f} s"
                                           for k, v in d["by_stage"].items())
            + f", outside Beam {d['driver_outside_beam_cpu_s']:.1f} CPU-s")
    st1 = diagnostics["stages_workers_1"]["by_stage"]
    separate = "documents" in st1 and "instances" in st1   # not when the driver fuses them into one pipeline
    non_instance = sum(v["cpu_s"] for k, v in st1.items() if k != "instances") \
        + diagnostics["stages_workers_1"]["driver_outside_beam_cpu_s"]
    diagnostics["derived"] = {
        "documents_stage_cpu_over_irreducible_workers_1":
            round(st1["documents"]["cpu_s"] / irr["work_cpu_s"], 3) if separate else None,
        "instances_stage_cpu_over_irreducible_workers_1":
            round(st1["instances"]["cpu_s"] / irr["work_cpu_s"], 3) if separate else None,
        "cpu_ratio_workers_1_if_instances_were_free": round(non_instance / irr["work_cpu_s"], 3) if separate else None,
        "note": "the irreducible work excludes building the BERT instances (masking, NSP pairs), which the "
                "pipeline must do; these ratios separate that from the overhead on the same work",
    }
    if "x4_parts_1" in mem_runs:
        say("scaling on the 4x input (--parts 1, 2 workers)")
        r = run_pipeline(x4, tokenizer, work / "out" / "x4-parts1-w2", 1, modes["workers_2"],
                         logs / "x4-parts1-workers_2.log")
        diagnostics["scaling_x4_parts_1"] = {
            "wall_1_worker_s": mem_runs["x4_parts_1"]["wall_s"], "wall_2_workers_s": r["wall_s"],
            "speedup": round(mem_runs["x4_parts_1"]["wall_s"] / r["wall_s"], 3),
            "cpu_1_worker_s": mem_runs["x4_parts_1"]["cpu_s"], "cpu_2_workers_s": r["cpu_s"],
            "shards_identical": r["shard_sha256"] == mem_runs["x4_parts_1"]["shard_sha256"],
            "run_2_workers": r,
        }
        say(f"4x scaling: {diagnostics['scaling_x4_parts_1']['speedup']:.2f} "
            f"({mem_runs['x4_parts_1']['wall_s']:.1f} s -> {r['wall_s']:.1f} s)")
    say("profiling the in-memory run with cProfile")
    diagnostics["profile_workers_1"] = profile_in_memory(inputs, tokenizer, work)
    say(f"profile written: {diagnostics['profile_workers_1']['pstats']}")
    return diagnostics


def _median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def _mib(n: float) -> float:
    return round(n / 2**20, 1)


def main(argv=None) -> int:
    global QUIET_WAIT, QUIET_BUDGET
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repetition of everything; skip the 4x --parts 1 run")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "work", help="scratch dir (default bench/work)")
    parser.add_argument("--data", type=Path, default=(REPO / ".." / "shared" / "data").resolve(),
                        help="real data dir with wikipedia/ and books/ (default ../shared/data)")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--note", help="free text recorded in the results (e.g. what tree was measured)")
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT,
                        help="seconds to wait, before each timed run, for other processes to go quiet (default 10; "
                             "at most 9 times that in all)")
    diagnose_group = parser.add_mutually_exclusive_group()
    diagnose_group.add_argument("--diagnose", dest="diagnose", action="store_true", default=None,
                          help="always add a per-stage breakdown of both modes and a cProfile of the in-memory run "
                               "(default: in full mode when a CPU or scaling target is missed)")
    diagnose_group.add_argument("--no-diagnose", dest="diagnose", action="store_false")
    args = parser.parse_args(argv)
    QUIET_WAIT = args.quiet_wait
    QUIET_BUDGET = [args.quiet_wait * 9]
    reps = 1 if args.quick else 3
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    begun = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - begun:6.1f}s] {message}", flush=True)

    machine = machine_info()
    source_at_start = source_digest()
    inputs = real_inputs(args.data)
    say(f"machine {machine['slug']}: {machine['cpu_model']}, {machine['logical_cores']} cores, "
        f"{_mib(machine['memory_bytes']):,.0f} MiB; {len(inputs['wiki']) + len(inputs['books'])} input files")

    tokenizer, tok_info = prepare_tokenizer(inputs, work)
    say(f"tokenizer {'reused' if tok_info['reused'] else 'trained'}: {tokenizer}")

    startup = startup_cost(logs / "startup.log")
    say(f"startup: driver imports {startup['driver_import_cpu_s']:.2f} CPU-s, "
        f"worker imports {startup['worker_import_cpu_s']:.2f} CPU-s")

    # 1 and 2. Each repetition does the irreducible work standalone (a child process), then runs the pipeline with
    # 1 and with 2 workers: this VM's speed drifts by up to 30 % within minutes, and runs side by side see the same.
    modes = {"workers_1": ["--direct_num_workers", "1"],
             "workers_2": ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]}
    irr_runs: list[dict] = []
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(reps):
        load_before = wait_for_quiet(min(QUIET_WAIT, QUIET_BUDGET[0]))
        r = irreducible(inputs, tokenizer, logs / f"irreducible-{rep}.log")
        r["foreign_load_before_cores"] = load_before
        r["contended"] = r["foreign_load_cores"] > CONTENDED_LOAD
        irr_runs.append(r)
        say(f"irreducible #{rep + 1}, standalone: {r['cpu_s']:.2f} CPU-s = start-up {r['startup_cpu_s']:.2f} + work "
            f"{r['work_cpu_s']:.2f} (read {r['read_cpu_s']:.2f}, clean+split {r['clean_split_cpu_s']:.2f}, "
            f"tokenize {r['tokenize_cpu_s']:.2f}), {r['corpus_tokens']:,} tokens")
        for mode, beam in modes.items():
            r = run_pipeline(inputs, tokenizer, work / "out" / mode, 1, beam, logs / f"{mode}-{rep}.log")
            runs[mode].append(r)
            say(f"{mode} #{rep + 1}: wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s "
                f"(sampled {r['sampled_tree_cpu_s']:.2f}, {r['processes_seen']} processes), "
                f"peak tree RSS {_mib(r['peak_tree_rss_bytes'])} MiB; cpu check {r['cpu_accounting_check']}; "
                f"other load {r['foreign_load_cores']:.2f} cores")
    irr = dict(irr_runs[0])
    for key in ("cpu_s", "wall_s", "work_cpu_s", "work_wall_s", "startup_cpu_s", "read_cpu_s", "clean_split_cpu_s",
                "tokenize_cpu_s"):
        irr[key] = _median(irr_runs, key)
    irr["cpu_s_runs"] = [r["cpu_s"] for r in irr_runs]
    irr["work_cpu_s_runs"] = [r["work_cpu_s"] for r in irr_runs]
    irr["foreign_load_cores_runs"] = [r["foreign_load_cores"] for r in irr_runs]
    for key in ("foreign_load_cores", "foreign_load_before_cores", "contended"):
        irr.pop(key)

    e2e = {}
    for mode, rs in runs.items():
        # Other processes skew wall time far more than CPU time: wall medians use the quiet runs when any.
        quiet = [r for r in rs if not r["contended"]]
        cpu, wall = _median(quiet or rs, "cpu_s"), _median(quiet or rs, "wall_s")
        tokens = rs[0]["corpus_tokens"]
        # Each repetition's pipeline CPU over the irreducible CPU measured just before it; the median is the figure.
        pairs = list(zip(rs, irr_runs))
        pairs = [(r, i) for r, i in pairs if not (r["contended"] or i["contended"])] or pairs
        paired = [(r["cpu_s"] / i["cpu_s"], r["cpu_s"] / i["work_cpu_s"]) for r, i in pairs]
        e2e[mode] = {
            "beam_args": modes[mode],
            "wall_s": wall, "cpu_s": cpu, "wall_s_runs": [r["wall_s"] for r in rs], "cpu_s_runs": [r["cpu_s"] for r in rs],
            "medians_over": f"{len(quiet)} uncontended run(s)" if quiet else f"all {len(rs)} runs (all contended)",
            "corpus_tokens": tokens,
            "corpus_tokens_per_cpu_s": round(tokens / cpu, 1),
            "corpus_tokens_per_wall_s": round(tokens / wall, 1),
            "cpu_ratio_vs_irreducible": round(statistics.median(p for p, _ in paired), 3),
            "cpu_ratio_vs_irreducible_runs": [round(p, 3) for p, _ in paired],
            "cpu_ratio_of_medians": round(cpu / irr["cpu_s"], 3),
            # Against the work alone, without the standalone program's start-up; and without either start-up.
            "cpu_ratio_vs_irreducible_work_only": round(statistics.median(w for _, w in paired), 3),
            "cpu_ratio_excluding_both_startups": round(
                (cpu - startup["driver_import_cpu_s"]) / irr["work_cpu_s"], 3),
            "peak_tree_rss_bytes": int(statistics.median(r["peak_tree_rss_bytes"] for r in rs)),  # all runs
            "ru_maxrss_bytes": max(r["ru_maxrss_bytes"] for r in rs),
            "foreign_load_cores_runs": [r["foreign_load_cores"] for r in rs],
            "runs": rs,
        }
    sha = {mode: rs[0]["shard_sha256"] for mode, rs in runs.items()}
    all_sha = {tuple(r["shard_sha256"]) for rs in runs.values() for r in rs}
    speedup = round(e2e["workers_1"]["wall_s"] / e2e["workers_2"]["wall_s"], 3)

    # 3. Memory: 1x --parts 1 is the in-memory end-to-end run above; 4x copies with --parts 4 (and 1).
    x4 = make_x4(inputs, work)
    say(f"4x input ready: {len(x4['wiki']) + len(x4['books'])} files")
    mem_runs = {"x4_parts_4": run_pipeline(x4, tokenizer, work / "out" / "x4-parts4", 4, modes["workers_1"],
                                           logs / "x4-parts4.log")}
    say(f"4x --parts 4: wall {mem_runs['x4_parts_4']['wall_s']:.1f} s, peak tree RSS "
        f"{_mib(mem_runs['x4_parts_4']['peak_tree_rss_bytes'])} MiB")
    if not args.quick:
        mem_runs["x4_parts_1"] = run_pipeline(x4, tokenizer, work / "out" / "x4-parts1", 1, modes["workers_1"],
                                              logs / "x4-parts1.log")
        say(f"4x --parts 1: wall {mem_runs['x4_parts_1']['wall_s']:.1f} s, peak tree RSS "
            f"{_mib(mem_runs['x4_parts_1']['peak_tree_rss_bytes'])} MiB")
    base_rss = e2e["workers_1"]["peak_tree_rss_bytes"]
    memory = {
        "x1_parts_1": {"peak_tree_rss_bytes": base_rss, "ru_maxrss_bytes": e2e["workers_1"]["ru_maxrss_bytes"],
                       "source": "median of the end_to_end.workers_1 runs (same input, --parts 1, in-memory)"},
        "x4_input": describe_inputs(x4) | {"copies": 4},
    }
    for name, r in mem_runs.items():
        memory[name] = r | {"rss_ratio_vs_x1": round(r["peak_tree_rss_bytes"] / base_rss, 3)}
        memory[name]["corpus_tokens_ratio_vs_x1"] = round(r["corpus_tokens"] / e2e["workers_1"]["corpus_tokens"], 3)
    memory_ratio = memory["x4_parts_4"]["rss_ratio_vs_x1"]
    x4_same = (memory["x4_parts_4"]["shard_sha256"] == memory["x4_parts_1"]["shard_sha256"]
               if "x4_parts_1" in memory else None)

    irr_tokens_match = irr["corpus_tokens"] == e2e["workers_1"]["corpus_tokens"]
    checks = {
        "shards_identical_1_vs_2_workers": len(all_sha) == 1,
        "shard_sha256": sha["workers_1"],
        "irreducible_tokens_equal_pipeline_corpus_tokens": irr_tokens_match,
        "x4_documents_are_4x": memory["x4_parts_4"]["documents_used"] == 4 * e2e["workers_1"]["runs"][0]["documents_used"],
        "x4_shards_identical_parts_4_vs_parts_1": x4_same,
        "cpu_accounting": sorted({r["cpu_accounting_check"] for rs in runs.values() for r in rs}
                                 | {r["cpu_accounting_check"] for r in mem_runs.values()}),
        # Other processes on the machine during the timed runs (a shared machine skews wall times).
        "contended_runs": [f"{mode} #{i + 1}" for mode, rs in runs.items() for i, r in enumerate(rs) if r["contended"]]
                          + [name for name, r in mem_runs.items() if r["contended"]],
        "max_foreign_load_cores": max(r["foreign_load_cores"] for r in [*runs["workers_1"], *runs["workers_2"],
                                                                        *mem_runs.values()]),
    }
    ratio_1 = e2e["workers_1"]["cpu_ratio_vs_irreducible"]
    ratio_2 = e2e["workers_2"]["cpu_ratio_vs_irreducible"]
    targets = {
        "cpu_ratio_workers_1": {"value": ratio_1, "target": f"<= {TARGETS['cpu_ratio_max']}",
                                "pass": ratio_1 <= TARGETS["cpu_ratio_max"]},
        "cpu_ratio_workers_2": {"value": ratio_2, "target": f"<= {TARGETS['cpu_ratio_max']}",
                                "pass": ratio_2 <= TARGETS["cpu_ratio_max"]},
        "scaling_speedup_2_workers": {"value": speedup, "target": f">= {TARGETS['scaling_speedup_min']}",
                                      "pass": speedup >= TARGETS["scaling_speedup_min"],
                                      "contended": any(all(r["contended"] for r in rs) for rs in runs.values())},
        "memory_ratio_x4_parts_4": {"value": memory_ratio, "target": f"<= {TARGETS['memory_ratio_max']}",
                                    "pass": memory_ratio <= TARGETS["memory_ratio_max"]},
        "shards_identical_1_vs_2_workers": {"value": checks["shards_identical_1_vs_2_workers"], "target": "true",
                                            "pass": checks["shards_identical_1_vs_2_workers"]},
    }

    # 4. Diagnostics: where the CPU and the wall time go.
    missed = not all(targets[t]["pass"] for t in ("cpu_ratio_workers_1", "cpu_ratio_workers_2",
                                                  "scaling_speedup_2_workers"))
    diagnostics = None
    if args.diagnose if args.diagnose is not None else (not args.quick and missed):
        try:
            diagnostics = diagnose(inputs, x4, tokenizer, work, modes, mem_runs, irr, say)
        except Exception as exc:  # noqa: BLE001 - the measurements above are worth keeping anyway
            diagnostics = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            say(f"diagnostics failed: {diagnostics['error'][:300]}")

    results = {
        "benchmark": "preprocess",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "repetitions": reps,
        "machine": machine,
        "versions": versions(),
        "source_sha256": source_at_start,
        "source_changed_during_run": source_digest() != source_at_start,
        "note": args.note,
        "config": CONFIG,
        "tokenizer": {"kind": "sentencepiece", "vocab_size": VOCAB_SIZE, "lowercase": True, **tok_info},
        "input": describe_inputs(inputs) | {
            "corpus_tokens": e2e["workers_1"]["corpus_tokens"],
            "documents_used": e2e["workers_1"]["runs"][0]["documents_used"],
            "documents_read": e2e["workers_1"]["runs"][0]["documents_read"],
            "instances": e2e["workers_1"]["runs"][0]["instances"],
            "instance_tokens": e2e["workers_1"]["runs"][0]["instance_tokens"],
        },
        "method": {
            "irreducible": "bench/irreducible.py as a child process, measured like the pipeline (os.wait4 rusage): "
                           "interpreter, the imports the work needs, tokenizer load, then sources.iter_wikipedia or "
                           "books.iter_book + text.to_document + tokenizer.encode_batch over every input file "
                           "(work_cpu_s: time.process_time around that loop alone); median of the repetitions",
            "pipeline_cpu": "os.wait4 rusage of the `python -m preprocess run` child: user+system CPU of it and "
                            "every descendant it reaped (Beam's worker subprocesses are waited for by the runner); "
                            "cross-checked against a psutil sample of the tree every "
                            f"{SAMPLE_INTERVAL} s (sampled_tree_cpu_s, a lower bound)",
            "peak_rss": f"max over psutil samples every {SAMPLE_INTERVAL} s of the summed RSS of the process tree "
                        "(shared pages counted once per process); ru_maxrss is the largest single process",
            "medians": "wall and CPU figures are medians over the uncontended repetitions (all of them when every "
                       "run was contended), RSS over all repetitions; per-run values under runs",
            "cpu_ratio": "each repetition runs the irreducible work, then the pipeline with 1 and with 2 workers; "
                         "cpu_ratio_vs_irreducible is the median over the repetitions of pipeline CPU / the "
                         "irreducible CPU of the same repetition (the VM's speed drifts between repetitions); "
                         "cpu_ratio_of_medians divides the medians instead",
        },
        "startup": startup,
        "irreducible": irr,
        "end_to_end": e2e,
        "scaling": {"speedup_wall_1_over_2_workers": speedup, "wall_1_worker_s": e2e["workers_1"]["wall_s"],
                    "wall_2_workers_s": e2e["workers_2"]["wall_s"]},
        "memory": memory,
        "checks": checks,
        "targets": targets,
        "all_targets_pass": all(t["pass"] for t in targets.values()),
        "diagnostics": diagnostics,
        "bench_wall_s": round(time.perf_counter() - begun, 1),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    out_file = args.results / f"preprocess-{machine['slug']}.json"
    out_file.write_text(json.dumps(results, indent=2) + "\n")

    w1, w2 = e2e["workers_1"], e2e["workers_2"]
    ok = lambda t: "PASS" if targets[t]["pass"] else "FAIL"  # noqa: E731
    print()
    print(f"Preprocess benchmark, {machine['slug']} ({machine['cpu_model']}), {results['mode']}, {reps} rep(s)")
    print(f"  input: {results['input']['file_count']} files, {_mib(results['input']['bytes'])} MiB, "
          f"{w1['corpus_tokens']:,} corpus tokens, {results['input']['documents_used']} documents")
    print(f"  irreducible, standalone: {irr['cpu_s']:.2f} CPU-s = {irr['corpus_tokens'] / irr['cpu_s']:,.0f} "
          f"tokens/CPU-s (the work alone: {irr['work_cpu_s']:.2f} CPU-s)")
    print(f"  1 worker (in-memory): wall {w1['wall_s']:.2f} s, CPU {w1['cpu_s']:.2f} s = "
          f"{w1['corpus_tokens_per_cpu_s']:,.0f} tokens/CPU-s, ratio {ratio_1:.2f} [{ok('cpu_ratio_workers_1')} <= 1.5]")
    print(f"  2 workers (multi_processing): wall {w2['wall_s']:.2f} s, CPU {w2['cpu_s']:.2f} s = "
          f"{w2['corpus_tokens_per_cpu_s']:,.0f} tokens/CPU-s, ratio {ratio_2:.2f} [{ok('cpu_ratio_workers_2')} <= 1.5]")
    print(f"  scaling: speed-up {speedup:.2f} [{ok('scaling_speedup_2_workers')} >= 1.6]; shards identical: "
          f"{checks['shards_identical_1_vs_2_workers']} ({sha['workers_1'][0][:16]}...)")
    extra = (f"; 4x --parts 1: {_mib(memory['x4_parts_1']['peak_tree_rss_bytes'])} MiB "
             f"({memory['x4_parts_1']['rss_ratio_vs_x1']:.2f}x)") if "x4_parts_1" in memory else ""
    print(f"  memory: 1x {_mib(base_rss)} MiB, 4x --parts 4 {_mib(memory['x4_parts_4']['peak_tree_rss_bytes'])} MiB, "
          f"ratio {memory_ratio:.2f} [{ok('memory_ratio_x4_parts_4')} <= 1.25]{extra}")
    if diagnostics and "error" not in diagnostics:
        for mode in modes:
            d = diagnostics[f"stages_{mode}"]
            print(f"  stages {mode}: " + ", ".join(f"{k} {v['cpu_s']:.1f} CPU-s / {v['wall_s']:.1f} s wall"
                                                  for k, v in d["by_stage"].items())
                  + f", driver outside Beam {d['driver_outside_beam_cpu_s']:.1f} CPU-s")
        dv = diagnostics["derived"]
        if dv["documents_stage_cpu_over_irreducible_workers_1"] is not None:
            print(f"  documents stage / irreducible {dv['documents_stage_cpu_over_irreducible_workers_1']:.2f}, "
                  f"instances stage / irreducible {dv['instances_stage_cpu_over_irreducible_workers_1']:.2f}, "
                  f"ratio if instances were free {dv['cpu_ratio_workers_1_if_instances_were_free']:.2f}")
        if "scaling_x4_parts_1" in diagnostics:
            sx = diagnostics["scaling_x4_parts_1"]
            print(f"  4x input scaling: {sx['wall_1_worker_s']:.1f} s -> {sx['wall_2_workers_s']:.1f} s = "
                  f"{sx['speedup']:.2f}x")
        top = list(diagnostics["profile_workers_1"]["by_package_self_time_s"].items())[:8]
        print("  profile (self time by package, C calls counted to their caller; cProfile-inflated): " + ", ".join(f"{k} {v:.1f}s" for k, v in top))
    if results["source_changed_during_run"]:
        print("  WARNING: preprocess/ or configs/ changed while the benchmark ran: the figures mix code versions")
    if checks["contended_runs"]:
        print(f"  WARNING: other processes used up to {checks['max_foreign_load_cores']:.2f} cores during "
              f"{', '.join(checks['contended_runs'])} (left out of the medians where a quiet run exists)")
    print(f"  results: {out_file.relative_to(REPO) if out_file.is_relative_to(REPO) else out_file}")
    print()
    print("| Machine | Corpus tokens | Tokens/CPU-s | CPU / irreducible | Wall 1 w | Wall 2 w | Speed-up | "
          "RSS 4x/1x (--parts 4) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {machine['slug']} ({machine['cpu_model']}) | {w1['corpus_tokens']:,} | {w1['corpus_tokens_per_cpu_s']:,.0f} | "
          f"{ratio_1:.2f} (2 w: {ratio_2:.2f}) | {w1['wall_s']:.1f} s | {w2['wall_s']:.1f} s | {speedup:.2f}× | "
          f"{memory_ratio:.2f} ({_mib(base_rss):.0f} → {_mib(memory['x4_parts_4']['peak_tree_rss_bytes']):.0f} MiB) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
