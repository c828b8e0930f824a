"""The rendered sbatch scripts and manifests of every shipped site and stage, against committed golden files, and
what the renderers promise in them (resume, signals, volumes, no secrets). Regenerate the golden files after a
deliberate change with BERT_PIPELINE_UPDATE_GOLDEN=1 and review the diff."""
import os

import pytest
import yaml

from tests.cluster.rendering import GOLDEN, JOBS, UPDATE_GOLDEN, crds, render  # noqa: F401  (crds: a fixture)


@pytest.mark.parametrize("golden", sorted(JOBS), ids=str)
def test_rendered_job_matches_its_golden_file(golden, crds):  # noqa: F811
    text, _ = render(JOBS[golden])  # validated on the way: core kinds strictly, CRs against their CRDs
    path = GOLDEN / golden
    if os.environ.get(UPDATE_GOLDEN) == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}: run with {UPDATE_GOLDEN}=1 once and commit it"
    assert text == path.read_text(), f"{golden} changed; if that was intended, regenerate with {UPDATE_GOLDEN}=1"


def test_every_golden_file_belongs_to_a_job():
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(JOBS)


@pytest.mark.parametrize("golden", sorted(name for name in JOBS if name.endswith(".yaml")), ids=str)
def test_committed_manifests_pass_schema_validation(golden, crds):  # noqa: F811
    """The golden manifests themselves, read back from disk, are valid for the API server and the operators."""
    from cluster.validate import validate_manifests

    documents = list(yaml.safe_load_all((GOLDEN / golden).read_text()))
    assert documents[0]["kind"] == "ConfigMap"
    validate_manifests(documents, "1.31", crds)


def test_slurm_pretraining_checkpoints_on_the_signal_and_requeues_itself():
    text, _ = render(JOBS["slurm_pyxis-pretrain.sbatch"])
    for line in ("#SBATCH --signal=B:USR1@180", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --nodes=16", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "trap on_usr1 USR1", 'scontrol requeue "$SLURM_JOB_ID"', "export NCCL_DEBUG=WARN",
                 "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
                 'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"'):
        assert any(row.strip().startswith(line) for row in text.splitlines()), line
    assert "--resume" in text and "--container-image=/lustre/fsw/bert/images/bert-pipeline-25.10.sqsh" in text


def test_the_job_carries_the_resolved_config(crds):  # noqa: F811
    from pretrain import config as pretrain_config

    text, _ = render(JOBS["slurm_venv-pretrain.sbatch"])
    body = text.split("<<'BERT_PIPELINE_CONFIG_END'\n", 1)[1].split("\nBERT_PIPELINE_CONFIG_END\n", 1)[0]
    expected = pretrain_config.load("configs/pretrain/bert_large_phase1_seq128.yaml",
                                    ["faults.warning_seconds=300", "faults.grace_seconds=30",  # from the site
                                     "data.path=/scratch/bert/datasets/seq128", "output_dir=/scratch/bert/runs/phase1"])
    assert pretrain_config.configlib.from_dict(type(expected), yaml.safe_load(body)) == expected

    _, (config_map, job) = render(JOBS["k8s-pretrain-pytorchjob.yaml"])
    expected = pretrain_config.load("configs/pretrain/bert_large_phase1_seq128.yaml",
                                    ["faults.grace_seconds=290", "data.path=/data/seq128",
                                     "output_dir=/checkpoints/phase1"])
    loaded = yaml.safe_load(config_map["data"]["config.yaml"])
    assert pretrain_config.configlib.from_dict(type(expected), loaded) == expected
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--config") + 1] == "/etc/bert-pipeline/config.yaml"
    assert config_map["metadata"]["name"] in str(job)  # the pods mount it


def _sets(argv: list[str]) -> dict[str, str]:
    """The --set KEY=VALUE words of a command line, as a mapping."""
    return dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "--set")


def _carried(script: str) -> str:
    """The config a batch script carries in its here-document."""
    return script.split("<<'BERT_PIPELINE_CONFIG_END'\n", 1)[1].split("\nBERT_PIPELINE_CONFIG_END\n", 1)[0]


def _faults(config_text: str) -> tuple[float, float]:
    faults = yaml.safe_load(config_text)["faults"]
    return faults["warning_seconds"], faults["grace_seconds"]


@pytest.mark.parametrize("golden, warning", [("slurm_venv-pretrain.sbatch", 300), ("slurm_pyxis-pretrain.sbatch", 180),
                                             ("slurm_venv-pretrain-deepspeed.sbatch", 300),
                                             ("slurm_local_cpu-pretrain.sbatch", 60)])
def test_slurm_pretraining_knows_the_warning_and_killwait(golden, warning):
    """faults.warning_seconds is the --signal lead of USR1, faults.grace_seconds Slurm's KillWait (the site's
    slurm.kill_wait_seconds, 30 by default): on the training command line and in the config the script carries."""
    _, (script,) = render(JOBS[golden])
    assert f"#SBATCH --signal=B:USR1@{warning}" in script.text
    assert f"--set faults.warning_seconds={warning} \\\n    --set faults.grace_seconds=30 \\" in script.text
    assert _faults(_carried(script.text)) == (warning, 30)

    _, (script,) = render([*JOBS[golden], "--site-set", "slurm.kill_wait_seconds=120", "--site-set",
                           "slurm.signal_seconds=0"])
    assert "#SBATCH --signal" not in script.text  # no warning comes: SIGUSR1 keeps no time of its own
    assert "--set faults.warning_seconds=0 \\\n    --set faults.grace_seconds=120 \\" in script.text
    assert _faults(_carried(script.text)) == (0, 120)


def test_a_grace_the_user_sets_wins_over_the_site():
    _, (script,) = render([*JOBS["slurm_venv-pretrain.sbatch"], "--set", "faults.grace_seconds=45"])
    assert "faults.grace_seconds=30" not in script.text and "--set faults.grace_seconds=45" in script.text
    assert _faults(_carried(script.text)) == (300, 45)


def test_kubernetes_pretraining_knows_torchruns_grace(crds):  # noqa: F811
    """faults.grace_seconds is the time torchrun gives its workers after SIGTERM (terminationGracePeriodSeconds
    - 10); an MPIJob's ranks never see the pod's SIGTERM, so it keeps the config's own value."""
    for golden in ("k8s-pretrain-pytorchjob.yaml", "k8s-pretrain-indexed-job.yaml"):
        documents = render(JOBS[golden])[1]
        pods = [replica["template"]["spec"] for replica in documents[-1]["spec"].get(
            "pytorchReplicaSpecs", {"Job": {"template": documents[-1]["spec"].get("template")}}).values()]
        for pod in pods:
            container = pod["containers"][0]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert pod["terminationGracePeriodSeconds"] == 300 and env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "290"
            assert _sets(container["args"])["faults.grace_seconds"] == "290"
        assert _faults(documents[0]["data"]["config.yaml"]) == (0, 290)

    for pod_grace, grace in ((15, "10"), (5, "5")):  # torchrun's 10 s floor, but never past the pod's own grace
        _, job = render([*JOBS["k8s-pretrain-pytorchjob.yaml"], "--site-set",
                         f"kubernetes.termination_grace_seconds={pod_grace}"])[1]
        args = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
        assert _sets(args)["faults.grace_seconds"] == grace

    config_map, mpijob = render(JOBS["k8s-pretrain-mpijob.yaml"])[1]
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert "faults.grace_seconds" not in _sets(launcher["args"])
    assert _faults(config_map["data"]["config.yaml"]) == (0, 30)


def test_kubernetes_pretraining_forms(crds):  # noqa: F811
    _, (_, pytorchjob) = render(JOBS["k8s-pretrain-pytorchjob.yaml"])
    replicas = pytorchjob["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    pod = replicas["Worker"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["torchrun"] and "--resume" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "bert-checkpoints"}} in pod["volumes"]
    assert replicas["Worker"]["restartPolicy"] == "OnFailure"

    _, (_, mpijob) = render(JOBS["k8s-pretrain-mpijob.yaml"])
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == ["mpirun"] and launcher["args"][launcher["args"].index("-np") + 1] == "32"
    assert mpijob["spec"]["slotsPerWorker"] == 8 and mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4

    _, (_, service, job) = render(JOBS["k8s-pretrain-indexed-job.yaml"])
    assert service["spec"]["clusterIP"] == "None" and job["spec"]["completionMode"] == "Indexed"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--master_addr={job['metadata']['name']}-0.{service['metadata']['name']}" in args
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]


def test_no_credential_values_in_any_rendered_job(crds):  # noqa: F811
    """Secrets are referenced by name; the example site names an S3 Secret, whose values never appear."""
    _, documents = render(JOBS["k8s-pretrain-pytorchjob.yaml"])
    env = documents[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    secret = [e for e in env if e["name"] == "AWS_SECRET_ACCESS_KEY"]
    assert secret == [{"name": "AWS_SECRET_ACCESS_KEY",
                       "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "secret_access_key"}}}]
    spec = documents[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert spec["imagePullSecrets"] == [{"name": "ghcr-pull"}]


def test_preprocessing_parts_run_as_chained_job_arrays_on_slurm():
    _, scripts = render(JOBS["slurm_venv-preprocess-parts.sbatch"])
    assert [script.name.rsplit("-", 1)[1] for script in scripts] == ["documents", "instances", "finish"]
    assert [script.after_previous for script in scripts] == [False, True, True]
    documents, instances, finish = (script.text for script in scripts)
    for text, step in ((documents, "documents"), (instances, "instances")):
        assert "#SBATCH --array=0-15" in text and "#SBATCH --cpus-per-task=1" in text and "#SBATCH --mem=64G" in text
        assert f'--part "${{SLURM_ARRAY_TASK_ID}}" \\\n    --step {step}' in text
        assert "#SBATCH --nodes=1" in text and "--direct_num_workers" not in text and "dask" not in text
    assert "--array" not in finish and "--step finish" in finish and "--part " not in finish
    assert all("\nparts: 16\n" in script.text for script in scripts)  # --parts travels in the config too


def test_preprocessing_parts_run_as_an_indexed_job_on_kubernetes(crds):  # noqa: F811
    _, (config_map, job) = render(JOBS["k8s-preprocess-parts.yaml"])
    assert "\nparts: 8\n" in config_map["data"]["config.yaml"]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 8, 8)
    container = spec["template"]["spec"]["containers"][0]
    assert container["args"][-2:] == ["--part", "$(PART)"] and "--step" not in container["args"]
    assert {"name": "PART", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}} in container["env"]
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "64Gi"}, "limits": {"memory": "64Gi"}}
