"""Each extra installs and runs alone: a fresh virtual environment per extra gets only that extra (torch first for
the torch stages, as the README says) and runs its stage's smallest real command on the bundled samples, from a
directory outside the repository so that only the installed package and its dependencies are importable.

The environments are kept under ~/.cache/bert-pipeline/extras/, one per extra and checkout, keyed by what the
install depends on (the build system, the base dependencies, the extra, the Python version, the torch build): a second
run reuses them, a change to that extra's dependencies rebuilds it. The four are built in parallel (mostly downloads);
those of checkouts that no longer exist are removed. The inputs (a tokenizer, a dataset, a tiny checkpoint) are made by
the interpreter running the tests, so each stage is checked on its own.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from common import processes
from tests.conftest import require
from tests.pyproject_toml import REPO, read_pyproject

SAMPLES = REPO / "samples"
EXTRAS = ("cluster", "preprocess", "pretrain", "finetune")
TORCH_EXTRAS = {"pretrain", "finetune"}
INSTALL_TIMEOUT_S = 1200
RUN_TIMEOUT_S = 600

pytestmark = pytest.mark.slow


def torch_requirement() -> str:
    """The torch build scripts/test.sh installs first (a local CPU wheel here), so both stay in step."""
    found = re.search(r'"(torch==[^"]+)"', (REPO / "scripts" / "test.sh").read_text())
    assert found, "scripts/test.sh no longer installs a pinned torch (\"torch==X\"); update tests/test_extras.py"
    return found.group(1)


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would put another installation on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def _run(command: list, what: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    result = processes.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout,
                           check=False, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{what} failed (exit {result.returncode}):\n$ {' '.join(map(str, command))}\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}", pytrace=False)
    return result


def cache_root() -> pathlib.Path:
    """This checkout's environments (an editable install points at one checkout)."""
    base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "bert-pipeline" / "extras"
    root = base / hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    root.mkdir(parents=True, exist_ok=True)
    (root / "checkout").write_text(str(REPO))
    for other in base.iterdir():  # a checkout that is gone (a CI clone) leaves its environments behind
        checkout = other / "checkout"
        if other != root and checkout.is_file() and not pathlib.Path(checkout.read_text(), "pyproject.toml").is_file():
            shutil.rmtree(other, ignore_errors=True)
    return root


def install_key(extra: str, torch: str) -> str:
    """What an environment's content depends on; comments and the other extras are not part of it."""
    pyproject = read_pyproject()
    project = pyproject["project"]
    inputs = [pyproject["build-system"], pyproject["tool"]["setuptools"], project["dependencies"],
              project.get("requires-python"), project["optional-dependencies"][extra], sys.version, torch]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def build_venv(extra: str, root: pathlib.Path) -> pathlib.Path:
    """A virtual environment holding ``pip install -e REPO[extra]`` (torch first where the extra needs it)."""
    torch = torch_requirement() if extra in TORCH_EXTRAS else ""
    venv = root / f"{extra}-{install_key(extra, torch)}"
    with open(root / f"{extra}.lock", "w") as lock:  # another test run building the same environment waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / "COMPLETE").is_file():
            return venv
        for stale in root.glob(f"{extra}-*"):  # half-built, or built for earlier dependencies
            shutil.rmtree(stale)
        env = _environment()
        python = venv / "bin" / "python"
        _run([sys.executable, "-m", "venv", venv], f"creating the [{extra}] environment", 300, env=env)
        pip = [python, "-m", "pip", "install", "--quiet"]
        if torch:
            _run([*pip, torch], f"installing {torch} into the [{extra}] environment", INSTALL_TIMEOUT_S, env=env)
        _run([*pip, "-e", f"{REPO}[{extra}]"], f"pip install -e '.[{extra}]'", INSTALL_TIMEOUT_S, env=env)
        frozen = _run([python, "-m", "pip", "freeze"], "pip freeze", 300, env=env).stdout
        (venv / "COMPLETE").write_text(frozen)
    return venv


@pytest.fixture(scope="module")
def venvs():
    """extra → its environment; the four are built at once, each test waits for its own."""
    root = cache_root()
    with concurrent.futures.ThreadPoolExecutor(len(EXTRAS)) as pool:
        futures = {extra: pool.submit(build_venv, extra, root) for extra in EXTRAS}
        yield lambda extra: futures[extra].result()


def run_in(venv: pathlib.Path, args: list, cwd: pathlib.Path, what: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in the environment, from ``cwd``. DeepSpeed's ops built on the fly stay with the
    environment (they are compiled against its torch), away from the development install's cache."""
    env = _environment(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=str(venv / "torch_extensions"))
    return _run([venv / "bin" / "python", *args], what, RUN_TIMEOUT_S, cwd=cwd, env=env)


def installed(venv: pathlib.Path, modules: tuple[str, ...], cwd: pathlib.Path) -> list[str]:
    code = f"import importlib.util as u; print(' '.join(m for m in {modules!r} if u.find_spec(m)))"
    return run_in(venv, ["-c", code], cwd, "probing the environment").stdout.split()


def _main_interpreter(args: list, cwd: pathlib.Path, what: str) -> None:
    _run([sys.executable, *args], what, RUN_TIMEOUT_S, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def sample_tokenizer(tmp_path_factory) -> pathlib.Path:
    """A SentencePiece vocabulary trained on the samples by the development install."""
    out = tmp_path_factory.mktemp("extras-inputs") / "tokenizer"
    _main_interpreter(["-m", "preprocess", "tokenizer", "train", "--input", SAMPLES / "wikipedia", SAMPLES / "books",
                       "--vocab-size", "2000", "--lowercase", "--output", out], out.parent, "training a tokenizer")
    return out


@pytest.fixture(scope="module")
def sample_dataset(sample_tokenizer) -> pathlib.Path:
    out = sample_tokenizer.parent / "dataset"
    _main_interpreter(["-m", "preprocess", "run", "--config", REPO / "configs/preprocess/tiny.yaml", "--wikipedia",
                       SAMPLES / "wikipedia", "--books", SAMPLES / "books", "--tokenizer", sample_tokenizer,
                       "--output", out], out.parent, "preprocessing the samples")
    return out


@pytest.fixture(scope="module")
def tiny_checkpoint(sample_tokenizer) -> pathlib.Path:
    """A randomly initialised tiny BERT exported as a Hugging Face directory with the sample tokenizer."""
    import torch

    from common.tokenizer import load_tokenizer
    from models.bert.hf import export
    from models.bert.model import BertForPreTraining, preset

    torch.manual_seed(0)
    vocab_size = load_tokenizer(str(sample_tokenizer)).vocab_size
    out = sample_tokenizer.parent / "checkpoint"
    export(BertForPreTraining(preset("tiny", vocab_size=vocab_size, max_position_embeddings=128)), out,
           tokenizer_dir=sample_tokenizer)
    return out


def test_cluster_extra_renders_every_stage_without_torch_or_beam(venvs, shared_data, tmp_path):
    venv = venvs("cluster")
    crds = require(shared_data / "k8s-crds", "the Kubernetes CRD schemas")
    assert installed(venv, ("torch", "apache_beam", "deepspeed", "yaml", "jsonschema"), tmp_path) == [
        "yaml", "jsonschema"]
    configs = REPO / "configs"
    pretrain = run_in(venv, ["-m", "cluster", "render", "k8s", "--stage", "pretrain", "--cluster",
                             configs / "cluster/k8s.yaml", "--config", configs / "pretrain/bert_large_phase1_seq128.yaml",
                             "--set", "data.path=/data/seq128", "--set", "output_dir=/checkpoints/phase1",
                             "--crd-dir", crds], tmp_path, "python -m cluster render k8s --stage pretrain")
    assert "kind: PyTorchJob" in pretrain.stdout
    for stage, config, arguments in (
            ("preprocess", "preprocess/tiny.yaml", ["--books", "/srv/books", "--tokenizer", "/srv/tokenizer",
                                                    "--output", "/srv/dataset"]),
            ("finetune", "finetune/tiny.yaml", ["--checkpoint", "/srv/run/hf", "--data", "/srv/eval",
                                                "--output", "/srv/finetune"])):
        script = run_in(venv, ["-m", "cluster", "render", "slurm", "--stage", stage, "--cluster",
                               configs / "cluster/slurm_local_cpu.yaml", "--config", configs / config, "--",
                               *arguments], tmp_path, f"python -m cluster render slurm --stage {stage}")
        assert script.stdout.startswith("#!") and f"-m {stage}" in script.stdout


def test_preprocess_extra_trains_a_tokenizer_and_builds_a_dataset(venvs, tmp_path):
    venv = venvs("preprocess")
    assert installed(venv, ("torch", "deepspeed", "apache_beam"), tmp_path) == ["apache_beam"]
    run_in(venv, ["-m", "preprocess", "tokenizer", "train", "--input", SAMPLES / "wikipedia", SAMPLES / "books",
                  "--vocab-size", "2000", "--lowercase", "--output", "tokenizer"], tmp_path, "tokenizer train")
    run_in(venv, ["-m", "preprocess", "run", "--config", REPO / "configs/preprocess/tiny.yaml", "--wikipedia",
                  SAMPLES / "wikipedia", "--books", SAMPLES / "books", "--tokenizer", "tokenizer", "--output",
                  "dataset"], tmp_path, "python -m preprocess run")
    manifest = json.loads((tmp_path / "dataset" / "manifest.json").read_text())
    assert manifest["rows"] > 0 and len(manifest["shards"]) == 2
    run_in(venv, ["-m", "preprocess", "verify", "dataset"], tmp_path, "python -m preprocess verify")


def test_pretrain_extra_trains_a_few_steps_and_exports(venvs, sample_dataset, tmp_path):
    venv = venvs("pretrain")
    assert installed(venv, ("apache_beam", "torch", "deepspeed"), tmp_path) == ["torch", "deepspeed"]
    run_in(venv, ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "pretrain.run",
                  "--config", REPO / "configs/pretrain/tiny.yaml", "--set", f"data.path={sample_dataset}",
                  "--set", "output_dir=run", "--set", "train.max_steps=4", "--set", "schedule.total_steps=4",
                  "--set", "schedule.warmup_steps=1", "--set", "checkpoint.every_steps=2"], tmp_path,
           "one-rank pretraining")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["step"]) == ("done", 4)
    assert (tmp_path / "run" / "hf" / "model.safetensors").is_file()
    assert list((tmp_path / "run" / "monitor").rglob("events.out.tfevents.*"))  # DeepSpeed's TensorBoard monitor


def test_finetune_extra_finetunes_a_checkpoint_on_the_glue_sample(venvs, tiny_checkpoint, tmp_path):
    venv = venvs("finetune")
    assert installed(venv, ("apache_beam", "torch", "deepspeed"), tmp_path) == ["torch", "deepspeed"]
    run_in(venv, ["-m", "finetune", "glue", "--checkpoint", tiny_checkpoint, "--tasks", "sst2", "--data", SAMPLES,
                  "--config", REPO / "configs/finetune/tiny.yaml", "--output", "out", "--set", "seeds=[1]",
                  "--set", "glue.training.epochs=1"], tmp_path, "python -m finetune glue")
    results = json.loads((tmp_path / "out" / "report.json").read_text())["results"]
    assert [(r["task"], r["seeds"], r["runs"][0]["steps"]) for r in results] == [("sst2", [1], 14)]  # 224 rows / 16
    assert list((tmp_path / "out" / "logs" / "tensorboard").rglob("events.out.tfevents.*"))
