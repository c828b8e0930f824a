"""The README's demo exactly as a newcomer runs it: ``bash scripts/demo.sh`` in a copy of the repository outside the
working tree, with ``python3`` from a virtual environment that holds nothing but what the demo installed itself.
A step the demo needs and does not install (it once ran ``transformers`` that only the test install brought) fails
here, not on a new user's machine.

The environment is kept between runs beside the extras' (tests/venvs.py), keyed by what the demo installs (its
install lines, the build system, the base dependencies and the extras those lines name, the Python version): a
second run finds the installs done, a change to them starts from an empty environment again."""
from __future__ import annotations

import fcntl
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests.pyproject_toml import REPO, read_pyproject
from tests.venvs import cache_root, environment, run

pytestmark = pytest.mark.slow

DEMO = REPO / "scripts" / "demo.sh"
DEMO_TIMEOUT_S = 1800  # the installs into an empty environment included
TASKS = ("sst2", "rte")


def install_lines() -> list[str]:
    lines = [line.strip() for line in DEMO.read_text().splitlines() if re.search(r"\bpip install\b", line)]
    assert lines, "scripts/demo.sh installs nothing: update tests/test_demo.py"
    return lines


def demo_key() -> str:
    pyproject = read_pyproject()
    project = pyproject["project"]
    extras = sorted({e for line in install_lines() for group in re.findall(r"\.\[([\w,]+)\]", line)
                     for e in group.split(",")})
    inputs = [install_lines(), pyproject["build-system"], pyproject["tool"]["setuptools"], project["dependencies"],
              project.get("requires-python"), {e: project["optional-dependencies"][e] for e in extras}, sys.version]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def demo_venv() -> pathlib.Path:
    """An environment the demo installs into: empty when first made (``python -m venv``, pip only)."""
    root = cache_root()
    venv = root / f"demo-{demo_key()}"
    with open(root / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "CREATED").is_file():
            for stale in root.glob("demo-*"):
                shutil.rmtree(stale)
            run([sys.executable, "-m", "venv", venv], "creating the demo's environment", 300, env=environment())
            (venv / "CREATED").write_text("")
    return venv


def copy_of_the_checkout(target: pathlib.Path) -> pathlib.Path:
    """What a clone of this working tree holds (tracked and untracked files git does not ignore), nothing built."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=120).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_the_readmes_demo_runs_from_a_clean_copy_in_an_environment_holding_only_what_it_installs(tmp_path):
    venv = demo_venv()
    checkout = copy_of_the_checkout(tmp_path / "bert-pipeline")
    env = environment(PATH=f"{venv / 'bin'}:{environment()['PATH']}", VIRTUAL_ENV=str(venv))
    env.pop("DS_ACCELERATOR", None)  # the demo sets what it needs itself
    result = run(["bash", "scripts/demo.sh"], "bash scripts/demo.sh", DEMO_TIMEOUT_S, cwd=checkout, env=env)
    output, out = result.stdout, checkout / "demo-output"

    manifest = json.loads((out / "dataset" / "manifest.json").read_text())
    assert (f"manifest: {manifest['rows']:,} rows in {len(manifest['shards'])} shards; first shard sha256 "
            f"{manifest['shards'][0]['sha256'][:16]}…") in output
    last = json.loads((out / "pretrain" / "summary.json").read_text())["evaluation"]["last"]
    assert last["step"] == 60 and last["rows"] == manifest["evaluation"]["rows"], last
    assert (f"evaluation: step {last['step']} on {last['rows']:,} held-out rows: masked-LM accuracy "
            f"{last['mlm_accuracy']:.4f}, loss {last['mlm_loss']:.4f}, perplexity {last['mlm_perplexity']:.2f}; "
            f"NSP accuracy {last['nsp_accuracy']:.4f}") in output, output[-3000:]
    report = json.loads((out / "finetune" / "report.json").read_text())
    assert sorted({r["task"] for r in report["results"]}) == sorted(TASKS)
    assert (out / "finetune" / "report.md").read_text().startswith("# Finetuning report")
    for task in TASKS:
        model = out / "finetune" / "models" / task
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model.iterdir()}, task
    predictions = re.findall(r"^transformers' pipeline on .*models/sst2: (?:'.+'|\".+\") -> \{'label': '([01])', "
                             r"'score': ([0-9.]+)\}$", output, flags=re.M)
    assert len(predictions) == 2 and all(0.5 <= float(score) <= 1 for _, score in predictions), output[-3000:]
    assert re.search(r"^demo: done in \d+ s, \d+ s of it after the install; outputs in demo-output/$", output,
                     flags=re.M), output[-3000:]
