"""What every benchmark records, and where: the repository's paths, the machine, the versions, the results file."""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Iterable

import psutil

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()   # the real data every developer has beside the project
RESULTS = REPO / "bench" / "results"
WORK = REPO / "bench" / "work"                                 # scratch: datasets, runs and logs (git-ignored)

# The distributions each stage's code runs on, recorded beside its benchmarks' figures.
DISTRIBUTIONS = {
    "preprocess": ("apache-beam", "pyarrow", "sentencepiece", "mwparserfromhell", "blingfire", "numpy", "psutil",
                   "tokenizers", "smart-open"),
    "pretrain": ("torch", "transformers", "numpy", "pyarrow"),
    "finetune": ("torch", "transformers", "numpy", "tokenizers"),
}


def machine_info() -> dict:
    """The machine, as every results file describes it; ``slug`` names the results file."""
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


def versions(distributions: Iterable[str], code: Iterable[str]) -> dict:
    """Python, each of ``distributions`` (None when not installed), and the repository's commit with the paths
    under ``code`` that differ from it (the measured code, so a figure can be traced to what produced it)."""
    out = {"python": platform.python_version(), "implementation": platform.python_implementation()}
    for dist in distributions:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out | git_state(code)


def git_state(paths: Iterable[str]) -> dict:
    """``repo_commit`` (HEAD) and ``repo_dirty`` (paths under ``paths`` changed or new since it); None without git."""
    from common import processes  # here: a docstore_load child imports this module on an older tree's ``common``

    def git(*args: str) -> str:
        return processes.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=120).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = sorted(line[3:] for line in git("status", "--porcelain", "--", *paths).splitlines() if line.strip())
    except (OSError, subprocess.CalledProcessError):
        # A copy of the tree without .git (a device machine): the commit it was copied from, when the caller says.
        return {"repo_commit": os.environ.get("BENCH_REPO_COMMIT"), "repo_dirty": None}
    return {"repo_commit": commit, "repo_dirty": dirty}


def source_digest(patterns: Iterable[str]) -> str:
    """sha256 over the repository's files matching ``patterns`` (globs such as ``preprocess/**/*.py``), their paths
    and contents: taken before and after a run, it tells whether the measured code changed while it ran."""
    digest = hashlib.sha256()
    for path in sorted({path for pattern in patterns for path in REPO.glob(pattern)}):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    """How this run was started, as someone would type it again: ``python -m bench.NAME ARGS``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    start = ["python", "-m", spec.name] if spec is not None else ["python", sys.argv[0]]
    return " ".join([*start, *sys.argv[1:]])


def results_file(results: Path, benchmark: str, machine: dict, suffix: str = "") -> Path:
    """``results/<benchmark>-<machine slug><suffix>.json``: one file per benchmark, machine and mode."""
    return results / f"{benchmark}-{machine['slug']}{suffix}.json"


def write_json(path: Path, value: dict) -> None:
    """Write ``value`` as indented JSON, atomically: a reader never sees half a file (values JSON lacks: ``str``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=2, default=str) + "\n")
    temporary.replace(path)


def add_comparison(results: Path, benchmark: str, label: str, value: dict) -> Path:
    """Adds ``value`` as ``comparisons.<label>`` of this machine's results file of ``benchmark``, keeping the rest
    of the file; returns the file."""
    path = results_file(results, benchmark, machine_info())
    recorded = json.loads(path.read_text()) if path.exists() else {}
    recorded.setdefault("comparisons", {})[label] = value
    write_json(path, recorded)
    return path


def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it: what the summaries and results print."""
    path = Path(path)
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
