"""Kubernetes manifests for the three stages.

Pretraining comes in three forms (``kubernetes.pretrain_form``): a Kubeflow ``PyTorchJob`` (kubeflow.org/v1, one
pod per node running torchrun), an ``MPIJob`` (kubeflow.org/v2beta1: a launcher pod runs mpirun over worker pods,
one rank per GPU, ranks from MPI as under any mpirun) and, for clusters without the operators, an Indexed ``Job``
with a headless ``Service`` (node rank = completion index, master = pod 0's DNS name). Preprocessing is a ``Job``
(a Dask scheduler and workers for several nodes, or an Indexed ``Job`` of the run's parts), finetuning a ``Job``.
The resolved stage config is a ConfigMap mounted at /etc/bert-pipeline; credentials only ever appear as references
to Secrets.

Every pod restarts on failure and pretraining always runs with ``--resume``: a restarted pod continues from the
newest complete checkpoint. On eviction or preemption the kubelet sends SIGTERM; torchrun passes it on and waits
``termination_grace_seconds`` - 10 s for its workers, which the job's config knows as ``faults.grace_seconds``: the
training saves at the next step boundary, or at a micro-batch boundary when the step would outlast it.
"""
from __future__ import annotations

import copy

from cluster.site import SiteConfig, SiteError
from cluster.stages import DASK_PORT, StageJob, command, dask_runner, direct_runner, prepare

CONFIG_DIR = "/etc/bert-pipeline"
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
RENDEZVOUS_PORT = 29500
PYTORCHJOB_PORT_NAME = "pytorchjob-port"   # the operator finds the master's port by this name ...
PYTORCHJOB_CONTAINER = "pytorch"           # ... in the container of this name
CPUS = "$(CPUS)"                           # a container's CPU request, as an integer (see _pod_template)


def render(job: StageJob, site: SiteConfig, *, workdir: str) -> list[dict]:
    """The documents to apply, in order: the config first, then what reads it."""
    k8s = site.kubernetes
    if not k8s.image:
        raise SiteError("kubernetes.image is not set: name an image that holds this repository at `workdir` and "
                        "its dependencies (e.g. ghcr.io/you/bert-pipeline:0.1.0)")
    if not site.workdir:
        raise SiteError("workdir is not set: on Kubernetes it is where the image holds this repository, "
                        "e.g. /workspace/bert-pipeline")
    _check_for_kubernetes(job, site)
    if job.stage == "pretrain":  # the grace torchrun gives, in the config the job carries and on its command line
        job = prepare(job.stage, job.config_source, [*site.pretrain_overrides("kubernetes", job.overrides),
                                                     *job.overrides], list(job.arguments), job.name)
    documents = [_config_map(job, site)]
    if job.stage == "pretrain":
        form = {"pytorchjob": _pytorchjob, "mpijob": _mpijob, "indexed-job": _indexed_job}[k8s.pretrain_form]
        return documents + form(job, site, workdir)
    if job.stage == "preprocess":
        if site.preprocess_array:
            return documents + _preprocess_parts(job, site, workdir)
        return documents + (_preprocess_job(job, site, workdir) if site.preprocess_nodes == 1
                            else _preprocess_on_dask(job, site, workdir))
    return documents + [_finetune_job(job, site, workdir)]


def _check_for_kubernetes(job: StageJob, site: SiteConfig) -> None:
    """What a job writes must outlive its pods (a mounted volume, or an object store for preprocessing), and
    credentials must reach the processes that use them."""
    k8s = site.kubernetes
    mounts = [mount for claim, mount in ((k8s.data_pvc, k8s.data_mount), (k8s.checkpoints_pvc, k8s.checkpoints_mount))
              if claim]
    for what, path in job.outputs:
        if job.stage == "preprocess" and "://" in path:
            continue
        if not any(path == mount or path.startswith(mount.rstrip("/") + "/") for mount in mounts):
            where = " or ".join(mounts) if mounts else "no volume (set kubernetes.data_pvc / checkpoints_pvc)"
            raise SiteError(f"{what} {path!r} is not on a mounted volume ({where}): it would be lost when the pod "
                            "ends; write it under one of them" + (" or to an object store URI"
                                                                   if job.stage == "preprocess" else ""))
    if job.stage == "pretrain" and k8s.pretrain_form == "mpijob" and k8s.env_from_secrets:
        raise SiteError("kubernetes.env_from_secrets does not reach MPI ranks (mpirun starts them over ssh and "
                        "forwards variables by name): list the variables in kubernetes.secret_env instead")


# ------------------------------------------------------------------------------------------------ pretraining

def _torchrun(job: StageJob, site: SiteConfig, workdir: str, *, node_rank: str, master: str, port: str) -> list[str]:
    train = command(job, python=site.python, workdir=workdir, config_file=CONFIG_FILE)
    return ["torchrun", f"--nnodes={site.nodes}", f"--nproc_per_node={site.tasks}", f"--node_rank={node_rank}",
            f"--master_addr={master}", f"--master_port={port}", *train[1:]]


def _pytorchjob(job: StageJob, site: SiteConfig, workdir: str) -> list[dict]:
    # The operator sets MASTER_ADDR/MASTER_PORT (the master pod's service) and PET_NODE_RANK in every pod.
    argv = _torchrun(job, site, workdir, node_rank="$(PET_NODE_RANK)", master="$(MASTER_ADDR)", port="$(MASTER_PORT)")
    template = _pod_template(job, site, workdir, name=PYTORCHJOB_CONTAINER, argv=argv, cpus=site.node_cpus,
                             gpus=site.gpus_per_node, ports=[{"name": PYTORCHJOB_PORT_NAME,
                                                              "containerPort": RENDEZVOUS_PORT}])
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if site.nodes > 1:
        replicas["Worker"] = {"replicas": site.nodes - 1, "restartPolicy": "OnFailure",
                              "template": copy.deepcopy(template)}
    spec = {"nprocPerNode": str(site.tasks), "runPolicy": _run_policy(site, clean="None"),
            "pytorchReplicaSpecs": replicas}
    return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(job, site), "spec": spec}]


def _mpijob(job: StageJob, site: SiteConfig, workdir: str) -> list[dict]:
    train = command(job, python=site.python, workdir=workdir, config_file=CONFIG_FILE)
    # Ranks are started over ssh and see none of the worker pod's variables: forward each by name.
    forwarded = [*_pod_environment(job, site), *site.kubernetes.secret_env]
    mpirun = ["mpirun", "--allow-run-as-root", "-np", str(site.world_size()), "--bind-to", "none", "--map-by", "slot",
              "--wdir", workdir, *[word for name in forwarded for word in ("-x", name)], *train]
    launcher = _pod_template(job, site, workdir, name="launcher", argv=mpirun, cpus=1, gpus=0, memory="2Gi",
                             volumes=False)
    worker = _pod_template(job, site, workdir, name="worker", argv=list(site.kubernetes.mpi_worker_command),
                           cpus=site.node_cpus, gpus=site.gpus_per_node)
    # The launcher's mpirun reaches the workers over ssh: start it once they are all up.
    spec = {"slotsPerWorker": site.tasks, "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady", "runPolicy": _run_policy(site, clean="None"),
            "mpiReplicaSpecs": {"Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": launcher},
                                "Worker": {"replicas": site.nodes, "restartPolicy": "OnFailure", "template": worker}}}
    return [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _metadata(job, site), "spec": spec}]


def _indexed_job(job: StageJob, site: SiteConfig, workdir: str) -> list[dict]:
    # Pod i of an Indexed Job is host `<job>-<i>`; with `subdomain` set to a headless Service of the same name it
    # resolves as `<job>-<i>.<service>` from every pod, so pod 0 is the master without any operator.
    argv = _torchrun(job, site, workdir, node_rank="$(NODE_RANK)", master=f"{job.name}-0.{job.name}",
                     port=str(RENDEZVOUS_PORT))
    template = _pod_template(job, site, workdir, name="trainer", argv=argv, cpus=site.node_cpus,
                             gpus=site.gpus_per_node, extra_env=[_completion_index("NODE_RANK")],
                             ports=[{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}])
    template["spec"].update(subdomain=job.name, restartPolicy="OnFailure")
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(job, site),
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": _labels(job),
                        "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}]}}
    return [service, _all_at_once_indexed_job(job, site, template, site.nodes)]


def _completion_index(variable: str) -> dict:
    """An environment variable holding the pod's index in its Indexed Job."""
    return {"name": variable, "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}


def _all_at_once_indexed_job(job: StageJob, site: SiteConfig, template: dict, pods: int) -> dict:
    """An Indexed Job whose pods all run at the same time (they wait for each other), each restarting on failure."""
    spec = {"completionMode": "Indexed", "completions": pods, "parallelism": pods,
            "backoffLimit": site.kubernetes.backoff_limit, "template": template}
    if site.time_limit:
        spec["activeDeadlineSeconds"] = site.time_limit_seconds()
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(job, site), "spec": spec}


def _run_policy(site: SiteConfig, *, clean: str) -> dict:
    policy = {"cleanPodPolicy": clean, "backoffLimit": site.kubernetes.backoff_limit}
    if site.time_limit:
        policy["activeDeadlineSeconds"] = site.time_limit_seconds()
    return policy


# ------------------------------------------------------------------------------------------------ other stages

def _batch_job(job: StageJob, site: SiteConfig, template: dict, name: str | None = None) -> dict:
    template["spec"]["restartPolicy"] = "OnFailure"
    spec = {"backoffLimit": site.kubernetes.backoff_limit, "template": template}
    if site.time_limit:
        spec["activeDeadlineSeconds"] = site.time_limit_seconds()
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(job, site, name), "spec": spec}


def _preprocess_job(job: StageJob, site: SiteConfig, workdir: str) -> list[dict]:
    argv = command(job, python=site.python, workdir=workdir, config_file=CONFIG_FILE, runner=direct_runner(CPUS))
    template = _pod_template(job, site, workdir, name="preprocess", argv=argv, cpus=site.node_cpus, gpus=0)
    return [_batch_job(job, site, template)]


def _preprocess_parts(job: StageJob, site: SiteConfig, workdir: str) -> list[dict]:
    """The run's parts as an Indexed Job: pod K runs part K (one CPU, the part's memory). The parts meet at barriers
    in the shared work directory (every part's documents before any instances, every part's instances before pod 0
    writes the shards and publishes); a restarted pod skips the steps its part has done."""
    argv = command(job, python=site.python, workdir=workdir, config_file=CONFIG_FILE, runner=["--part", "$(PART)"])
    template = _pod_template(job, site, workdir, name="preprocess", argv=argv, cpus=1, gpus=0,
                             memory=site.memory_kubernetes(site.preprocess_part_memory),
                             extra_env=[_completion_index("PART")])
    template["spec"]["restartPolicy"] = "OnFailure"
    return [_all_at_once_indexed_job(job, site, template, job.config.parts)]


def _preprocess_on_dask(job: StageJob, site: SiteConfig, workdir: str) -> list[dict]:
    service_name = f"{job.name}-dask"
    scheduler_address = f"tcp://{service_name}:{DASK_PORT}"
    scheduler_labels = _labels(job, "dask-scheduler")
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(job, site, service_name),
               "spec": {"selector": scheduler_labels, "ports": [{"name": "scheduler", "port": DASK_PORT},
                                                                {"name": "dashboard", "port": 8787}]}}
    scheduler = _pod_template(job, site, workdir, name="scheduler", component="dask-scheduler", cpus=2, gpus=0,
                              memory="8Gi", volumes=False, argv=["dask", "scheduler", "--port", str(DASK_PORT),
                                                                  "--dashboard-address", ":8787"])
    workers = _pod_template(job, site, workdir, name="worker", component="dask-worker", cpus=site.node_cpus, gpus=0,
                            argv=["dask", "worker", scheduler_address, "--nworkers", CPUS, "--nthreads", "1",
                                  "--no-dashboard"])
    argv = command(job, python=site.python, workdir=workdir, config_file=CONFIG_FILE,
                   runner=dask_runner(scheduler_address))
    driver = _pod_template(job, site, workdir, name="driver", argv=argv, cpus=2, gpus=0, memory="8Gi")
    return [service, _deployment(job, site, f"{job.name}-dask-scheduler", 1, scheduler),
            _deployment(job, site, f"{job.name}-dask-workers", site.preprocess_nodes, workers),
            _batch_job(job, site, driver)]


def _deployment(job: StageJob, site: SiteConfig, name: str, replicas: int, template: dict) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _metadata(job, site, name),
            "spec": {"replicas": replicas, "selector": {"matchLabels": template["metadata"]["labels"]},
                     "template": template}}


def _finetune_job(job: StageJob, site: SiteConfig, workdir: str) -> dict:
    argv = command(job, python=site.python, workdir=workdir, config_file=CONFIG_FILE)
    gpus = 1 if site.gpus_per_node else 0  # one model at a time on one device
    template = _pod_template(job, site, workdir, name="finetune", argv=argv, gpus=gpus,
                             cpus=site.task_cpus if gpus else site.node_cpus)
    return _batch_job(job, site, template)


# ------------------------------------------------------------------------------------------------ pods

def _labels(job: StageJob, component: str | None = None) -> dict:
    return {"app.kubernetes.io/name": "bert-pipeline", "app.kubernetes.io/component": component or job.stage,
            "bert-pipeline/job": job.name}


def _metadata(job: StageJob, site: SiteConfig, name: str | None = None) -> dict:
    return {"name": name or job.name, "namespace": site.kubernetes.namespace, "labels": _labels(job)}


def _config_map(job: StageJob, site: SiteConfig) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(job, site, f"{job.name}-config"),
            "data": {"config.yaml": job.config_text}}


def _pod_environment(job: StageJob, site: SiteConfig) -> dict[str, str]:
    threads = 1 if job.stage == "preprocess" else (site.task_cpus or 1)
    env = {"PYTHONPATH": site.workdir, "PYTHONUNBUFFERED": "1"}
    if job.stage == "pretrain" and site.kubernetes.pretrain_form != "mpijob":
        # After SIGTERM torchrun passes it on and gives its workers this long to save before it kills them
        # (an environment variable, not a flag, so that a torch without it ignores it instead of failing).
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(site.torchrun_shutdown_seconds())
    env.update(site.job_environment(distributed_gpus=job.stage == "pretrain" and site.gpus_per_node > 0,
                                    threads=threads))
    return env


def _pod_template(job: StageJob, site: SiteConfig, workdir: str, *, name: str, argv: list[str], cpus: int | None,
                  gpus: int, memory: str | None = None, component: str | None = None, extra_env: list[dict] = (),
                  ports: list[dict] = (), volumes: bool = True) -> dict:
    k8s = site.kubernetes
    env = [{"name": key, "value": value} for key, value in _pod_environment(job, site).items()]
    env += [{"name": variable, "valueFrom": {"secretKeyRef": dict(zip(("name", "key"), reference.split("/", 1)))}}
            for variable, reference in k8s.secret_env.items()]
    if CPUS in argv:  # worker counts: the container's CPU request as a whole number
        env.append({"name": "CPUS", "valueFrom": {"resourceFieldRef": {"containerName": name,
                                                                       "resource": "requests.cpu"}}})
    env += list(extra_env)
    memory = memory or site.memory_kubernetes()
    requests = {key: value for key, value in (("cpu", str(cpus) if cpus else None), ("memory", memory)) if value}
    limits = {key: value for key, value in (("memory", memory), (k8s.gpu_resource, str(gpus) if gpus else None))
              if value}
    container = {"name": name, "image": k8s.image, "imagePullPolicy": k8s.image_pull_policy, "workingDir": workdir,
                 "command": argv[:1], "args": argv[1:], "env": env,
                 "resources": {key: value for key, value in (("requests", requests), ("limits", limits)) if value}}
    if k8s.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": secret}} for secret in k8s.env_from_secrets]
    if ports:
        container["ports"] = list(ports)
    pod: dict = {"containers": [container]}
    if volumes:
        container["volumeMounts"], pod["volumes"] = _volumes(job, site)
    for key, value in (("serviceAccountName", k8s.service_account), ("priorityClassName", k8s.priority_class),
                       ("nodeSelector", dict(k8s.node_selector) or None),
                       ("tolerations", list(k8s.tolerations) or None),
                       ("imagePullSecrets", [{"name": k8s.image_pull_secret}] if k8s.image_pull_secret else None)):
        if value:
            pod[key] = value
    if job.stage == "pretrain":
        pod["terminationGracePeriodSeconds"] = k8s.termination_grace_seconds
    return {"metadata": {"labels": _labels(job, component)}, "spec": pod}


def _volumes(job: StageJob, site: SiteConfig) -> tuple[list[dict], list[dict]]:
    """/dev/shm in memory (the container default of 64 MiB breaks data loaders and NCCL), the stage config, and
    the data and checkpoint claims."""
    k8s = site.kubernetes
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}},
               {"name": "config", "configMap": {"name": f"{job.name}-config"}}]
    for volume, claim, path in (("data", k8s.data_pvc, k8s.data_mount),
                                ("checkpoints", k8s.checkpoints_pvc, k8s.checkpoints_mount)):
        if claim:
            mounts.append({"name": volume, "mountPath": path})
            volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim}})
    return mounts, volumes


def to_yaml(documents: list[dict]) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):  # the config as a readable block, not one escaped line
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    Dumper.ignore_aliases = lambda self, data: True  # replicas share a template: write it out each time
    return yaml.dump_all(documents, Dumper=Dumper, sort_keys=False, width=120, default_flow_style=False)
