"""Shared helpers for the cluster tests: render a job in-process, the fixed set of jobs the golden files hold."""
from __future__ import annotations

import os
import pathlib

import pytest

from tests.conftest import require

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
UPDATE_GOLDEN = "BERT_PIPELINE_UPDATE_GOLDEN"  # =1 rewrites the golden files from the current renderers
# The local site runs the checkout the command runs from; the golden files pin that path.
PINNED_CHECKOUT = ["--site-set", "workdir=/srv/bert-pipeline"]

LARGE = "configs/pretrain/bert_large_phase1_seq128.yaml"
PHASE1, PHASE2 = "configs/preprocess/phase1_seq128.yaml", "configs/preprocess/phase2_seq512.yaml"
FINETUNE = "configs/finetune/default.yaml"


def _job(scheduler: str, site: str, stage: str, config: str, *more: str) -> list[str]:
    return [scheduler, "--stage", stage, "--cluster", f"configs/cluster/{site}.yaml", "--config", config, *more]


def _data(data: str, output: str) -> list[str]:
    return ["--set", f"data.path={data}", "--set", f"output_dir={output}"]


_LUSTRE, _SCRATCH = "/lustre/fsw/bert", "/scratch/bert"
_K8S_DATA = _data("/data/seq128", "/checkpoints/phase1")
# (golden file, command line after `python -m cluster render`): every shipped site, each stage, each form.
JOBS = {
    "slurm_local_cpu-pretrain.sbatch": _job("slurm", "slurm_local_cpu", "pretrain", "configs/pretrain/tiny.yaml",
                                            *_data("/srv/data/tiny", "/srv/runs/tiny"), *PINNED_CHECKOUT),
    "slurm_local_cpu-preprocess.sbatch": _job("slurm", "slurm_local_cpu", "preprocess", "configs/preprocess/tiny.yaml",
                                              *PINNED_CHECKOUT, "--", "--books", "samples/books", "--tokenizer",
                                              "/srv/tokenizers/sample", "--output", "/srv/data/tiny"),
    "slurm_local_cpu-finetune.sbatch": _job("slurm", "slurm_local_cpu", "finetune", "configs/finetune/tiny.yaml",
                                            *PINNED_CHECKOUT, "--", "--checkpoint", "/srv/runs/tiny/hf", "--data",
                                            "samples", "--output", "/srv/runs/tiny-glue", "--tasks", "glue"),
    "slurm_venv-pretrain.sbatch": _job("slurm", "slurm_venv", "pretrain", LARGE,
                                       *_data(f"{_SCRATCH}/datasets/seq128", f"{_SCRATCH}/runs/phase1")),
    "slurm_venv-pretrain-deepspeed.sbatch": _job("slurm", "slurm_venv", "pretrain", LARGE,
                                                 *_data(f"{_SCRATCH}/datasets/seq128", f"{_SCRATCH}/runs/phase1"),
                                                 "--site-set", "slurm.launcher=deepspeed"),
    "slurm_venv-preprocess-dask.sbatch": _job("slurm", "slurm_venv", "preprocess", PHASE1, "--",
                                              "--wikipedia", f"{_SCRATCH}/corpora/enwiki-pages-articles.xml.bz2",
                                              "--books", f"{_SCRATCH}/corpora/books", "--tokenizer",
                                              f"{_SCRATCH}/tokenizers/wiki-books-30k", "--output",
                                              f"{_SCRATCH}/datasets/seq128"),
    "slurm_venv-finetune.sbatch": _job("slurm", "slurm_venv", "finetune", FINETUNE, "--", "--checkpoint",
                                       f"{_SCRATCH}/runs/phase2/hf", "--data", f"{_SCRATCH}/eval", "--output",
                                       f"{_SCRATCH}/finetune/phase2"),
    "slurm_pyxis-pretrain.sbatch": _job("slurm", "slurm_pyxis", "pretrain", LARGE,
                                        *_data(f"{_LUSTRE}/datasets/seq128", f"{_LUSTRE}/runs/phase1")),
    "slurm_pyxis-preprocess.sbatch": _job("slurm", "slurm_pyxis", "preprocess", PHASE2, "--", "--wikipedia",
                                          f"{_LUSTRE}/corpora/enwiki-pages-articles.xml.bz2", "--tokenizer",
                                          f"{_LUSTRE}/tokenizers/wiki-30k", "--output", f"{_LUSTRE}/datasets/seq512",
                                          "--parts", "8"),
    "slurm_pyxis-finetune.sbatch": _job("slurm", "slurm_pyxis", "finetune", FINETUNE, "--", "--checkpoint",
                                        f"{_LUSTRE}/runs/phase2/hf", "--data", f"{_LUSTRE}/eval", "--output",
                                        f"{_LUSTRE}/finetune/phase2", "--tasks", "squad"),
    "k8s-pretrain-pytorchjob.yaml": _job("k8s", "k8s", "pretrain", LARGE, *_K8S_DATA),
    "k8s-pretrain-mpijob.yaml": _job("k8s", "k8s", "pretrain", LARGE, *_K8S_DATA,
                                     "--site-set", "kubernetes.pretrain_form=mpijob"),
    "k8s-pretrain-indexed-job.yaml": _job("k8s", "k8s", "pretrain", LARGE, *_K8S_DATA,
                                          "--site-set", "kubernetes.pretrain_form=indexed-job"),
    "k8s-preprocess-dask.yaml": _job("k8s", "k8s", "preprocess", PHASE1, "--", "--wikipedia",
                                     "s3://corpora/enwiki/enwiki-pages-articles.xml.bz2", "--books",
                                     "s3://corpora/books/", "--tokenizer", "/data/tokenizers/wiki-books-30k",
                                     "--output", "s3://datasets/seq128"),
    "k8s-preprocess.yaml": _job("k8s", "k8s", "preprocess", PHASE2, "--site-set", "preprocess_nodes=1", "--",
                                "--wikipedia", "/data/corpora/enwiki-pages-articles.xml.bz2", "--tokenizer",
                                "/data/tokenizers/wiki-books-30k", "--output", "/data/datasets/seq512", "--parts", "4"),
    "slurm_venv-preprocess-parts.sbatch": _job("slurm", "slurm_venv", "preprocess", PHASE1, "--site-set",
                                               "preprocess_nodes=1", "--site-set", "preprocess_array=true", "--",
                                               "--wikipedia", f"{_SCRATCH}/corpora/enwiki-pages-articles.xml.bz2",
                                               "--books", f"{_SCRATCH}/corpora/books", "--tokenizer",
                                               f"{_SCRATCH}/tokenizers/wiki-books-30k", "--output",
                                               f"{_SCRATCH}/datasets/seq128", "--parts", "16"),
    "k8s-preprocess-parts.yaml": _job("k8s", "k8s", "preprocess", PHASE1, "--site-set", "preprocess_nodes=1",
                                      "--site-set", "preprocess_array=true", "--", "--wikipedia",
                                      "s3://corpora/enwiki/enwiki-pages-articles.xml.bz2", "--books",
                                      "s3://corpora/books/", "--tokenizer", "/data/tokenizers/wiki-books-30k",
                                      "--output", "s3://datasets/seq128", "--parts", "8"),
    "k8s-finetune.yaml": _job("k8s", "k8s", "finetune", FINETUNE, "--", "--checkpoint", "/checkpoints/phase2/hf",
                              "--data", "/data/eval", "--output", "/checkpoints/finetune/phase2"),
}


def render(arguments: list[str], action: str = "render"):
    """(text, rendered object) of one job, in this process, from the repository root (as users run it)."""
    from cluster import cli

    args, stage_arguments = cli.parse_args([action, *arguments])
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        text, rendered, _ = cli.render(args, stage_arguments)
    finally:
        os.chdir(cwd)
    return text, rendered


@pytest.fixture(scope="session")
def crds() -> pathlib.Path:
    """The real CRD schemas: required (a failure, not a skip, in CI)."""
    from cluster.validate import crd_dir

    return require(crd_dir(), "the CRD schemas (../shared/data/k8s-crds)")
