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
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from finetune import glue
from tests.conftest import require
from tests.pyproject_toml import REPO, read_pyproject
from tests.venvs import cache_root, environment, run, torch_requirement

SAMPLES = REPO / "samples"
EXTRAS = ("cluster", "preprocess", "pretrain", "finetune")
TORCH_EXTRAS = {"pretrain", "finetune"}
INSTALL_TIMEOUT_S = 1200
RUN_TIMEOUT_S = 600

pytestmark = pytest.mark.slow


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
        env = environment()
        python = venv / "bin" / "python"
        run([sys.executable, "-m", "venv", venv], f"creating the [{extra}] environment", 300, env=env)
        pip = [python, "-m", "pip", "install", "--quiet", "--no-compile"]  # compiled as imported: half pip's time
        if torch:
            run([*pip, torch], f"installing {torch} into the [{extra}] environment", INSTALL_TIMEOUT_S, env=env)
        run([*pip, "-e", f"{REPO}[{extra}]"], f"pip install -e '.[{extra}]'", INSTALL_TIMEOUT_S, env=env)
        frozen = run([python, "-m", "pip", "freeze"], "pip freeze", 300, env=env).stdout
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
    """``python ARGS`` in the environment, from ``cwd``. DeepSpeed's ops built on the fly are kept beside the
    environments, away from the development install's cache, in one directory per torch build: the [pretrain] and
    [finetune] environments hold the same torch (``torch_requirement``), so the op is compiled once for both."""
    extensions = venv.parent / ("torch_extensions-" + re.sub(r"[^\w.]+", "-", torch_requirement()))
    env = environment(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=str(extensions))
    return run([venv / "bin" / "python", *args], what, RUN_TIMEOUT_S, cwd=cwd, env=env)


def installed(venv: pathlib.Path, modules: tuple[str, ...], cwd: pathlib.Path) -> list[str]:
    code = f"import importlib.util as u; print(' '.join(m for m in {modules!r} if u.find_spec(m)))"
    return run_in(venv, ["-c", code], cwd, "probing the environment").stdout.split()


def _main_interpreter(args: list, cwd: pathlib.Path, what: str) -> None:
    run([sys.executable, *args], what, RUN_TIMEOUT_S, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


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


# The README's four-stage block on the samples: what its placeholders become here. Each one must occur in the block
# (a stale entry fails), and any other command either runs as written or is marked "# needs: ...".
ON_THE_SAMPLES = {
    "enwiki-latest-pages-articles.xml.bz2": str(SAMPLES / "wikipedia" / "samplewiki-pages-articles.xml.bz2"),
    "books/": str(SAMPLES / "books"),
}
# Option values sized for the full corpus: the samples' 37,000 words cannot make 30,522 SentencePiece pieces.
SAMPLE_SIZED = {("--vocab-size", "30522"): "2000"}


@dataclasses.dataclass(frozen=True)
class ReadmeCommand:
    stage: str            # the extra of the install line above it
    words: tuple          # as the shell splits it
    needs: str | None     # what it needs that the tests cannot have (its "# needs:" comment), else None


def readme_commands() -> list[ReadmeCommand]:
    """The commands of the README's "four stages" block, continuation lines joined, in order."""
    section = (REPO / "README.md").read_text().split("## The four stages", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands, stage = [], None
    for line in block.replace("\\\n", " ").splitlines():
        words = tuple(shlex.split(line, comments=True))
        if not words:
            continue
        install = re.fullmatch(r"\.\[(\w+)\]", words[-1]) if words[:2] == ("pip", "install") else None
        if install:
            stage = install.group(1)
            assert words == ("pip", "install", "-e", f".[{stage}]") and stage in EXTRAS, line
            continue
        assert stage is not None, f"README: {line!r} comes before any stage's install line"
        needs = re.search(r"#\s*needs:\s*(\S.*)$", line)
        commands.append(ReadmeCommand(stage, words, needs.group(1).strip() if needs else None))
    return commands


def on_the_samples(words: tuple, used: set) -> list[str]:
    out = []
    for index, word in enumerate(words):
        key = (words[index - 1], word) if index else None
        if key in SAMPLE_SIZED:
            used.add(key)
            word = SAMPLE_SIZED[key]
        elif word in ON_THE_SAMPLES:
            used.add(word)
            word = ON_THE_SAMPLES[word]
        out.append(word)
    return out


def test_every_command_of_the_readmes_four_stages_runs_here_or_says_what_it_needs():
    commands = readme_commands()
    used = set()
    for command in commands:
        on_the_samples(command.words, used)
        if command.needs is None:
            assert command.words[:2] == ("python", "-m") and command.words[2] == command.stage, \
                f"README: {' '.join(command.words)} runs here only as python -m {command.stage}; or mark it " \
                "with '# needs: ...'"
    assert used == set(ON_THE_SAMPLES) | set(SAMPLE_SIZED), "tests/test_extras.py: a sample stand-in the README " \
                                                           f"no longer uses: {set(ON_THE_SAMPLES) | set(SAMPLE_SIZED) - used}"
    assert {c.stage for c in commands} == set(EXTRAS)


@pytest.mark.parametrize("stage", sorted({c.stage for c in readme_commands() if c.needs is None}))
def test_the_readmes_commands_run_on_the_samples_with_their_stage_install_alone(stage, venvs, tmp_path):
    """From the repository root as the README says (its configs/ here), in the stage's environment alone."""
    venv = venvs(stage)
    if stage not in TORCH_EXTRAS:
        assert "torch" not in installed(venv, ("torch", "deepspeed"), tmp_path)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    outputs = []
    for command in (c for c in readme_commands() if c.stage == stage and c.needs is None):
        result = run_in(venv, on_the_samples(command.words, set())[1:], tmp_path, " ".join(command.words))
        outputs.append(result.stdout + result.stderr)
    if stage == "preprocess":
        manifest = json.loads((tmp_path / "data" / "phase1_seq128" / "manifest.json").read_text())
        assert manifest["rows"] > 1000 and manifest["parameters"]["instances"]["max_seq_length"] == 128
        assert "verified" in outputs[-1].lower()
    if stage == "cluster":
        assert "#SBATCH" in outputs[-1] and "dry run: nothing submitted" in outputs[-1]


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


# The demo's last step: a saved task model through transformers' pipeline, with nothing but [finetune] installed.
CLASSIFY = """
import json, sys
from transformers import pipeline
classify = pipeline("text-classification", model=sys.argv[1])
print(json.dumps([classify(text, truncation=True)[0] for text in sys.argv[2:]]))
"""


def test_finetune_extra_finetunes_a_checkpoint_on_the_glue_sample_and_its_task_model_runs_in_transformers(
        venvs, tiny_checkpoint, tmp_path):
    venv = venvs("finetune")
    assert installed(venv, ("apache_beam", "torch", "deepspeed", "transformers"), tmp_path) == [
        "torch", "deepspeed", "transformers"]
    run_in(venv, ["-m", "finetune", "glue", "--checkpoint", tiny_checkpoint, "--tasks", "sst2", "--data", SAMPLES,
                  "--config", REPO / "configs/finetune/tiny.yaml", "--output", "out", "--set", "seeds=[1]",
                  "--set", "glue.training.epochs=1", "--save-models"], tmp_path, "python -m finetune glue")
    results = json.loads((tmp_path / "out" / "report.json").read_text())["results"]
    assert [(r["task"], r["seeds"], r["runs"][0]["steps"]) for r in results] == [("sst2", [1], 14)]  # 224 rows / 16
    assert list((tmp_path / "out" / "logs" / "tensorboard").rglob("events.out.tfevents.*"))
    texts = ["the river cruise is the best thing we did all year", "the supper was not worth the ticket"]
    predictions = json.loads(run_in(venv, ["-c", CLASSIFY, tmp_path / "out" / "models" / "sst2", *texts], tmp_path,
                                    "transformers.pipeline on the saved SST-2 model").stdout.splitlines()[-1])
    assert len(predictions) == 2
    assert all(p["label"] in glue.TASKS["sst2"].labels and 0.5 <= p["score"] <= 1 for p in predictions), predictions
