"""Site files: every shipped one loads; what could not run is refused before anything is submitted, with a
message that names the key and the fix."""
import pathlib

import pytest

from cluster import site as site_module
from tests.cluster.rendering import JOBS, REPO, render

SITES = sorted((REPO / "configs" / "cluster").glob("*.yaml"))


def test_the_example_sites_ship():
    assert {p.name for p in SITES} >= {"slurm_pyxis.yaml", "slurm_venv.yaml", "k8s.yaml", "slurm_local_cpu.yaml"}


@pytest.mark.parametrize("path", SITES, ids=lambda p: p.name)
def test_shipped_site_loads(path):
    site = site_module.load(path)
    assert site.world_size() == site.nodes * (site.gpus_per_node or site.tasks_per_node)


def test_local_cpu_site_is_what_the_live_tests_need():
    site = site_module.load(REPO / "configs" / "cluster" / "slurm_local_cpu.yaml")
    assert (site.nodes, site.gpus_per_node, site.tasks, site.slurm.partition) == (1, 0, 2, "debug")
    assert site.environment()["DS_ACCELERATOR"] == "cpu" and site.environment()["OMP_NUM_THREADS"] == "1"
    assert site.slurm.container.image is None and site.workdir is None  # runs the checkout it is submitted from


def _write(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, message", [
    ("nodes: 2\ngpus_per_node: 8\nslurm:\n  partiton: gpu\n", r"site\.yaml: slurm: unknown key 'partiton'"),
    ("gpus_per_nodes: 8\n", r"unknown key 'gpus_per_nodes'"),
    ("nodes: 0\ngpus_per_node: 8\n", r"nodes and preprocess_nodes must be >= 1"),
    ("gpus_per_node: 0\n", r"set tasks_per_node"),
    ("gpus_per_node: 8\ntasks_per_node: 4\n", r"one process per GPU"),
    ("gpus_per_node: 8\ncpus_per_node: 100\n", r"cpus_per_node 100 does not divide into 8 tasks"),
    ("gpus_per_node: 8\nmemory: 480GB\n", r"memory '480GB'.*e\.g\. 480G"),
    ("gpus_per_node: 8\ntime_limit: 4h\n", r"time_limit '4h'"),
    ("gpus_per_node: 8\nslurm:\n  container:\n    mounts: [/data:/data]\n", r"no image: set slurm\.container\.image"),
    ("gpus_per_node: 8\nslurm:\n  launcher: torchrun\n", r"slurm\.launcher must be one of srun, deepspeed"),
    ("gpus_per_node: 8\nslurm:\n  kill_wait_seconds: -1\n", r"slurm\.kill_wait_seconds must be >= 0"),
    ("gpus_per_node: 8\nkubernetes:\n  pretrain_form: jobset\n", r"pretrain_form must be one of"),
    ("gpus_per_node: 8\nkubernetes:\n  namespace: Bert_Team\n", r"not a valid namespace name"),
    ("gpus_per_node: 8\nkubernetes:\n  secret_env:\n    AWS_KEY: just-a-name\n", r"secret-name/key"),
    ("gpus_per_node: 8\npreprocess_nodes: 4\npreprocess_array: true\n", r"preprocess_array .* choose one"),
    ("gpus_per_node: 8\npreprocess_part_memory: 32 GB\n", r"preprocess_part_memory '32 GB'"),
])
def test_bad_site_is_refused_by_name(tmp_path, text, message):
    with pytest.raises(site_module.SiteError, match=message):
        site_module.load(_write(tmp_path, text))


def test_site_set_overrides_and_names_the_option(tmp_path):
    path = _write(tmp_path, "gpus_per_node: 8\n")
    assert site_module.load(path, ["nodes=4", "slurm.partition=gpu"]).world_size() == 32
    with pytest.raises(site_module.SiteError, match=r"--site-set 'slurm.partiton=gpu': unknown key 'slurm.partiton'"):
        site_module.load(path, ["slurm.partiton=gpu"])


def _refused(arguments, message):
    from common.configlib import ConfigError

    with pytest.raises(ConfigError, match=message):
        render(arguments)


def test_gpus_that_do_not_divide_the_global_batch_are_refused():
    # 65,536 sequences = micro-batch 64 x ranks x accumulation: 3 nodes x 8 GPUs = 24 ranks does not divide it
    _refused([*JOBS["slurm_venv-pretrain.sbatch"], "--site-set", "nodes=3", "--site-set", "gpus_per_node=8"],
             r"global_batch_size 65536 is not a multiple of micro_batch_size 64 x 24 ranks")


def test_kubernetes_without_an_image_is_refused():
    _refused([*JOBS["k8s-finetune.yaml"][:5], "--site-set", "kubernetes.image=null", *JOBS["k8s-finetune.yaml"][5:]],
             r"kubernetes\.image is not set")


def test_kubernetes_outputs_must_outlive_the_pod():
    arguments = [a.replace("output_dir=/checkpoints/phase1", "output_dir=/tmp/phase1")
                 for a in JOBS["k8s-pretrain-pytorchjob.yaml"]]
    _refused(arguments, r"output_dir '/tmp/phase1' is not on a mounted volume \(/data or /checkpoints\)")


def test_secrets_as_whole_secrets_cannot_reach_mpi_ranks():
    _refused([*JOBS["k8s-pretrain-mpijob.yaml"], "--site-set", "kubernetes.env_from_secrets=[wandb]"],
             r"env_from_secrets does not reach MPI ranks")


def test_pretraining_without_data_is_refused():
    _refused(["slurm", "--stage", "pretrain", "--cluster", "configs/cluster/slurm_local_cpu.yaml",
              "--config", "configs/pretrain/tiny.yaml"], r"data\.path is not set")


@pytest.mark.parametrize("stage_arguments, message", [
    (["--books", "b", "--output", "o", "--runner", "DirectRunner"], r"--runner after '--': the cluster job chooses"),
    (["--books", "b"], r"preprocess arguments after '--': .*--output"),
    (["--output", "o", "--tokenizer", "t"], r"preprocessing needs input"),
    (["--books", "b", "--output", "o"], r"needs a tokenizer"),
    (["--books", "b", "--output", "o", "--set", "seed=1"], r"--set after '--'"),
    (["--books", "b", "--output", "o", "--tokenizer", "t", "--parts", "2", "--part", "1"],
     r"--part after '--': the cluster job runs the parts itself"),
])
def test_bad_preprocessing_arguments_are_refused(stage_arguments, message):
    _refused(["slurm", "--stage", "preprocess", "--cluster", "configs/cluster/slurm_local_cpu.yaml",
              "--config", "configs/preprocess/tiny.yaml", "--", *stage_arguments], message)


def test_a_preprocessing_job_may_read_only_the_configs_inputs(tmp_path):
    from cluster import stages

    config = tmp_path / "mine.yaml"
    config.write_text((REPO / "configs" / "preprocess" / "tiny.yaml").read_text()
                      + "inputs:\n  - {name: web, format: jsonl, paths: ['s3://corpora/crawl/']}\n")
    job = stages.prepare("preprocess", str(config), [], ["--output", "o", "--tokenizer", "t"])
    assert ("inputs[0].paths", "s3://corpora/crawl/") in job.inputs and "inputs:" in job.config_text


def test_bad_finetuning_arguments_are_refused():
    base = ["slurm", "--stage", "finetune", "--cluster", "configs/cluster/slurm_local_cpu.yaml",
            "--config", "configs/finetune/tiny.yaml", "--"]
    _refused([*base, "--data", "d", "--output", "o"], r"finetune arguments after '--': .*--checkpoint")
    _refused([*base, "--checkpoint", "c", "--data", "d", "--output", "o", "--tasks", "glue,imdb"],
             r"unknown task 'imdb'")


def test_parts_as_parallel_tasks_need_a_run_with_parts():
    _refused(["slurm", "--stage", "preprocess", "--cluster", "configs/cluster/slurm_local_cpu.yaml",
              "--site-set", "preprocess_array=true", "--config", "configs/preprocess/tiny.yaml", "--",
              "--books", "b", "--output", "o", "--tokenizer", "t"], r"the run has 1 part; give --parts N")
