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
# (golden file, command line without `python -m cluster render`): every shipped site, each stage, each form.
JOBS = {
    "slurm_local_cpu-pretrain.sbatch": ["slurm", "--stage", "pretrain", "--cluster", "configs/cluster/slurm_local_cpu.yaml",
                                        "--config", "configs/pretrain/tiny.yaml", "--set", "data.path=/srv/data/tiny",
                                        "--set", "output_dir=/srv/runs/tiny", *PINNED_CHECKOUT],
    "slurm_local_cpu-preprocess.sbatch": ["slurm", "--stage", "preprocess", "--cluster",
                                          "configs/cluster/slurm_local_cpu.yaml", "--config", "configs/preprocess/tiny.yaml",
                                          *PINNED_CHECKOUT, "--", "--books", "samples/books",
                                          "--tokenizer", "/srv/tokenizers/sample", "--output", "/srv/data/tiny"],
    "slurm_local_cpu-finetune.sbatch": ["slurm", "--stage", "finetune", "--cluster", "configs/cluster/slurm_local_cpu.yaml",
                                        "--config", "configs/finetune/tiny.yaml", *PINNED_CHECKOUT, "--",
                                        "--checkpoint", "/srv/runs/tiny/hf", "--data", "samples", "--output",
                                        "/srv/runs/tiny-glue", "--tasks", "glue"],
    "slurm_venv-pretrain.sbatch": ["slurm", "--stage", "pretrain", "--cluster", "configs/cluster/slurm_venv.yaml",
                                   "--config", LARGE, "--set", "data.path=/scratch/bert/datasets/seq128",
                                   "--set", "output_dir=/scratch/bert/runs/phase1"],
    "slurm_venv-pretrain-deepspeed.sbatch": ["slurm", "--stage", "pretrain", "--cluster", "configs/cluster/slurm_venv.yaml",
                                             "--config", LARGE, "--set", "data.path=/scratch/bert/datasets/seq128",
                                             "--set", "output_dir=/scratch/bert/runs/phase1",
                                             "--site-set", "slurm.launcher=deepspeed"],
    "slurm_venv-preprocess-dask.sbatch": ["slurm", "--stage", "preprocess", "--cluster", "configs/cluster/slurm_venv.yaml",
                                          "--config", "configs/preprocess/phase1_seq128.yaml", "--",
                                          "--wikipedia", "/scratch/bert/corpora/enwiki-pages-articles.xml.bz2",
                                          "--books", "/scratch/bert/corpora/books", "--tokenizer",
                                          "/scratch/bert/tokenizers/wiki-books-30k", "--output",
                                          "/scratch/bert/datasets/seq128"],
    "slurm_venv-finetune.sbatch": ["slurm", "--stage", "finetune", "--cluster", "configs/cluster/slurm_venv.yaml",
                                   "--config", "configs/finetune/default.yaml", "--", "--checkpoint",
                                   "/scratch/bert/runs/phase2/hf", "--data", "/scratch/bert/eval", "--output",
                                   "/scratch/bert/finetune/phase2"],
    "slurm_pyxis-pretrain.sbatch": ["slurm", "--stage", "pretrain", "--cluster", "configs/cluster/slurm_pyxis.yaml",
                                    "--config", LARGE, "--set", "data.path=/lustre/fsw/bert/datasets/seq128",
                                    "--set", "output_dir=/lustre/fsw/bert/runs/phase1"],
    "slurm_pyxis-preprocess.sbatch": ["slurm", "--stage", "preprocess", "--cluster", "configs/cluster/slurm_pyxis.yaml",
                                      "--config", "configs/preprocess/phase2_seq512.yaml", "--", "--wikipedia",
                                      "/lustre/fsw/bert/corpora/enwiki-pages-articles.xml.bz2", "--tokenizer",
                                      "/lustre/fsw/bert/tokenizers/wiki-30k", "--output",
                                      "/lustre/fsw/bert/datasets/seq512", "--parts", "8"],
    "slurm_pyxis-finetune.sbatch": ["slurm", "--stage", "finetune", "--cluster", "configs/cluster/slurm_pyxis.yaml",
                                    "--config", "configs/finetune/default.yaml", "--", "--checkpoint",
                                    "/lustre/fsw/bert/runs/phase2/hf", "--data", "/lustre/fsw/bert/eval", "--output",
                                    "/lustre/fsw/bert/finetune/phase2", "--tasks", "squad"],
    "k8s-pretrain-pytorchjob.yaml": ["k8s", "--stage", "pretrain", "--cluster", "configs/cluster/k8s.yaml", "--config",
                                     LARGE, "--set", "data.path=/data/seq128", "--set", "output_dir=/checkpoints/phase1"],
    "k8s-pretrain-mpijob.yaml": ["k8s", "--stage", "pretrain", "--cluster", "configs/cluster/k8s.yaml", "--config",
                                 LARGE, "--set", "data.path=/data/seq128", "--set", "output_dir=/checkpoints/phase1",
                                 "--site-set", "kubernetes.pretrain_form=mpijob"],
    "k8s-pretrain-indexed-job.yaml": ["k8s", "--stage", "pretrain", "--cluster", "configs/cluster/k8s.yaml", "--config",
                                      LARGE, "--set", "data.path=/data/seq128", "--set", "output_dir=/checkpoints/phase1",
                                      "--site-set", "kubernetes.pretrain_form=indexed-job"],
    "k8s-preprocess-dask.yaml": ["k8s", "--stage", "preprocess", "--cluster", "configs/cluster/k8s.yaml", "--config",
                                 "configs/preprocess/phase1_seq128.yaml", "--", "--wikipedia",
                                 "s3://corpora/enwiki/enwiki-pages-articles.xml.bz2", "--books", "s3://corpora/books/",
                                 "--tokenizer", "/data/tokenizers/wiki-books-30k", "--output", "s3://datasets/seq128"],
    "k8s-preprocess.yaml": ["k8s", "--stage", "preprocess", "--cluster", "configs/cluster/k8s.yaml", "--config",
                            "configs/preprocess/phase2_seq512.yaml", "--site-set", "preprocess_nodes=1", "--",
                            "--wikipedia", "/data/corpora/enwiki-pages-articles.xml.bz2", "--tokenizer",
                            "/data/tokenizers/wiki-books-30k", "--output", "/data/datasets/seq512", "--parts", "4"],
    "k8s-finetune.yaml": ["k8s", "--stage", "finetune", "--cluster", "configs/cluster/k8s.yaml", "--config",
                          "configs/finetune/default.yaml", "--", "--checkpoint", "/checkpoints/phase2/hf", "--data",
                          "/data/eval", "--output", "/checkpoints/finetune/phase2"],
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
