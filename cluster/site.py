"""A cluster site: one small YAML (configs/cluster/*.yaml) loaded into typed dataclasses.

The top level holds what every scheduler needs (nodes, GPUs, CPUs, memory, time limit, environment, where the
repository and the logs are); ``slurm:`` and ``kubernetes:`` hold what only one of them reads. Unknown keys are
errors naming the key and the file (common.configlib), and every value that a scheduler would reject later,
or that would make a job fail after it waited in the queue, is refused here with the fix. Credentials are found
by their values in everything rendered (cluster.validate.refuse_credentials), not here by the variables' names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from common import configlib

LAUNCHERS = ("srun", "deepspeed")
PRETRAIN_FORMS = ("pytorchjob", "mpijob", "indexed-job")
_MEMORY = re.compile(r"^([1-9][0-9]*)([KMGT])i?$")
_TIME = re.compile(r"^(?:([0-9]+)-)?([0-9]{1,2}):([0-9]{2}):([0-9]{2})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class SiteError(configlib.ConfigError):
    """A site file (or --site-set) that cannot describe a working job."""


@dataclass(frozen=True)
class NetworkConfig:
    socket_ifname: str | None = None     # NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, e.g. ib0 or ^lo,docker
    ib_hca: str | None = None            # NCCL_IB_HCA, e.g. mlx5_0,mlx5_1
    nccl_debug: str = "WARN"             # NCCL_DEBUG


@dataclass(frozen=True)
class SlurmContainer:
    """pyxis/enroot: each srun step runs in this container image."""

    image: str | None = None             # --container-image: a registry image or a squashfs (.sqsh) file
    mounts: list[str] = field(default_factory=list)  # --container-mounts, SRC:DST[:FLAGS] each
    mount_home: bool = False             # pyxis mounts $HOME unless --no-container-mount-home
    extra_srun: list[str] = field(default_factory=list)  # e.g. --container-remap-root


@dataclass(frozen=True)
class SlurmSite:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False              # whole nodes (--exclusive)
    gres: bool = False                   # ask for GPUs as --gres=gpu:N (older sites) instead of --gpus-per-node
    signal_seconds: int = 120            # --signal=B:USR1@N: time to checkpoint before the limit; 0 disables
    kill_wait_seconds: int = 30          # the cluster's KillWait (scontrol show config): SIGTERM to SIGKILL
    requeue: bool = True                 # --requeue, and the script requeues itself after a preemption save
    step_grace_seconds: int = 120        # srun --wait: how long the other tasks may run after the first one ends
    launcher: str = "srun"               # srun (one task per GPU) | deepspeed (deepspeed --launcher slurm)
    mpi: str | None = "none"             # srun --mpi (ranks come from SLURM_PROCID; no PMI is needed)
    extra_sbatch: list[str] = field(default_factory=list)  # more #SBATCH options, e.g. --mail-type=END
    container: SlurmContainer = field(default_factory=SlurmContainer)


@dataclass(frozen=True)
class KubernetesSite:
    version: str = "1.31"                # the API version manifests are validated against
    context: str | None = None           # kubectl --context
    namespace: str = "default"
    image: str | None = None             # the image with this repository at `workdir` and its dependencies
    image_pull_policy: str = "IfNotPresent"
    image_pull_secret: str | None = None  # the NAME of a docker-registry Secret
    service_account: str | None = None
    priority_class: str | None = None
    node_selector: dict = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    env_from_secrets: list[str] = field(default_factory=list)  # Secrets whose keys all become variables
    secret_env: dict = field(default_factory=dict)  # VARIABLE: secret-name/key, one key each
    gpu_resource: str = "nvidia.com/gpu"
    data_pvc: str | None = None          # PersistentVolumeClaim NAMES (created by the cluster's admins)
    data_mount: str = "/data"
    checkpoints_pvc: str | None = None
    checkpoints_mount: str = "/checkpoints"
    shm_size: str = "16Gi"               # memory-backed /dev/shm (data loader workers, NCCL)
    pretrain_form: str = "pytorchjob"    # pytorchjob | mpijob | indexed-job (no operator needed)
    backoff_limit: int = 20              # restarts before the job counts as failed (each resumes)
    termination_grace_seconds: int = 300  # time to checkpoint after SIGTERM (eviction, preemption)
    mpi_worker_command: list[str] = field(default_factory=lambda: ["/usr/sbin/sshd", "-De"])


@dataclass(frozen=True)
class SiteConfig:
    nodes: int = 1                       # pretraining nodes
    preprocess_nodes: int = 1            # > 1: a Dask cluster over this many nodes runs the Beam job
    preprocess_array: bool = False       # the config's parts as parallel tasks of one CPU: a Slurm job array per
                                         # step, a Kubernetes Indexed Job (python -m preprocess run --part K)
    preprocess_part_memory: str | None = None  # memory of one such task: the part's budget (default: memory)
    gpus_per_node: int = 0
    tasks_per_node: int | None = None    # processes per node; one per GPU (the default when there are GPUs)
    cpus_per_task: int | None = None     # or cpus_per_node (not both)
    cpus_per_node: int | None = None
    memory: str | None = None            # per node, e.g. 480G (binary units; Kubernetes gets 480Gi)
    time_limit: str | None = None        # HH:MM:SS or D-HH:MM:SS
    workdir: str | None = None           # the repository as jobs see it; default: where the command runs
    log_dir: str = "runs/cluster-logs"   # job logs and the configs jobs run with (relative: to workdir)
    python: str = "python"
    setup: list[str] = field(default_factory=list)  # shell lines before the stage: modules, a virtualenv
    env: dict = field(default_factory=dict)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    slurm: SlurmSite = field(default_factory=SlurmSite)
    kubernetes: KubernetesSite = field(default_factory=KubernetesSite)

    def __post_init__(self):
        _check(self)

    # --- derived values: every renderer asks these, so the arithmetic lives in one place

    @property
    def tasks(self) -> int:
        """Processes per node for pretraining."""
        return self.tasks_per_node or self.gpus_per_node

    @property
    def node_cpus(self) -> int | None:
        if self.cpus_per_node:
            return self.cpus_per_node
        return self.cpus_per_task * self.tasks if self.cpus_per_task else None

    @property
    def task_cpus(self) -> int | None:
        if self.cpus_per_task:
            return self.cpus_per_task
        return self.cpus_per_node // self.tasks if self.cpus_per_node else None

    def world_size(self) -> int:
        return self.nodes * self.tasks

    def memory_slurm(self, memory: str | None = None) -> str | None:
        memory = memory or self.memory
        return None if memory is None else _MEMORY.match(memory).expand(r"\1\2")

    def memory_kubernetes(self, memory: str | None = None) -> str | None:
        memory = memory or self.memory
        return None if memory is None else _MEMORY.match(memory).expand(r"\1\2i")

    def time_limit_seconds(self) -> int | None:
        if self.time_limit is None:
            return None
        days, hours, minutes, seconds = (int(g or 0) for g in _TIME.match(self.time_limit).groups())
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds

    def environment(self) -> dict[str, str]:
        return {str(k): _env_value(v) for k, v in self.env.items()}

    def torchrun_shutdown_seconds(self) -> int:
        """Kubernetes: how long torchrun gives its workers after passing a SIGTERM on before it kills them
        (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``), 10 s short of the pod's grace so that it ends before the kubelet's
        SIGKILL."""
        return max(self.kubernetes.termination_grace_seconds - 10, 10)

    def pretrain_overrides(self, scheduler: str, given: tuple[str, ...] | list[str] = ()) -> list[str]:
        """``--set`` values a pretraining job gets from the site: the time each stop signal leaves to save
        (``faults.*``, pretrain.preemption). Slurm: USR1 comes ``slurm.signal_seconds`` before the time limit (0: no
        warning), SIGKILL ``slurm.kill_wait_seconds`` after SIGTERM. Kubernetes: torchrun kills its workers
        ``torchrun_shutdown_seconds`` after SIGTERM, and the kubelet the pod after ``termination_grace_seconds``;
        an MPIJob's ranks never see the pod's SIGTERM (mpirun starts them over ssh), so it gets none. A key the
        user gave with ``--set`` (``given``) is the user's."""
        if scheduler == "slurm":
            values = {"faults.warning_seconds": self.slurm.signal_seconds,
                      "faults.grace_seconds": self.slurm.kill_wait_seconds}
        elif self.kubernetes.pretrain_form == "mpijob":
            values = {}
        else:
            values = {"faults.grace_seconds": min(self.torchrun_shutdown_seconds(),
                                                  self.kubernetes.termination_grace_seconds)}
        mine = {override.split("=", 1)[0].strip() for override in given}
        return [f"{key}={value}" for key, value in values.items() if key not in mine]

    def job_environment(self, *, distributed_gpus: bool, threads: int) -> dict[str, str]:
        """What users expect set in a job: NCCL's error handling and logging for multi-GPU training, the network
        interface when the site names one, one OpenMP thread per core of a process. The site's env wins."""
        env: dict[str, str] = {}
        if distributed_gpus:
            env.update(TORCH_NCCL_ASYNC_ERROR_HANDLING="1", NCCL_ASYNC_ERROR_HANDLING="1",
                       NCCL_DEBUG=self.network.nccl_debug)
            if self.network.ib_hca:
                env["NCCL_IB_HCA"] = self.network.ib_hca
        if self.network.socket_ifname:
            env.update(NCCL_SOCKET_IFNAME=self.network.socket_ifname, GLOO_SOCKET_IFNAME=self.network.socket_ifname)
        env["OMP_NUM_THREADS"] = str(threads)
        env.update(self.environment())
        return env


def _env_value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _check(site: SiteConfig) -> None:
    """Refuse what cannot work, naming the key and the fix. Runs when the dataclass is built."""
    if site.nodes < 1 or site.preprocess_nodes < 1:
        raise ValueError(f"nodes and preprocess_nodes must be >= 1, got {site.nodes} and {site.preprocess_nodes}")
    if site.gpus_per_node < 0:
        raise ValueError(f"gpus_per_node must be >= 0, got {site.gpus_per_node}")
    if site.gpus_per_node == 0 and not site.tasks_per_node:
        raise ValueError("gpus_per_node is 0: set tasks_per_node (processes per node for CPU-only training)")
    if site.gpus_per_node and site.tasks_per_node and site.tasks_per_node != site.gpus_per_node:
        raise ValueError(f"tasks_per_node {site.tasks_per_node} differs from gpus_per_node {site.gpus_per_node}: "
                         "pretraining runs one process per GPU (leave tasks_per_node out)")
    if site.tasks_per_node is not None and site.tasks_per_node < 1:
        raise ValueError("tasks_per_node must be >= 1")
    if site.cpus_per_task and site.cpus_per_node:
        raise ValueError("set cpus_per_task or cpus_per_node, not both")
    for name in ("cpus_per_task", "cpus_per_node"):
        value = getattr(site, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if site.cpus_per_node and site.cpus_per_node % site.tasks:
        raise ValueError(f"cpus_per_node {site.cpus_per_node} does not divide into {site.tasks} tasks per node")
    for name in ("memory", "preprocess_part_memory"):
        value = getattr(site, name)
        if value is not None and not _MEMORY.match(value):
            raise ValueError(f"{name} {value!r}: write a whole number with K, M, G or T (binary units), e.g. 480G")
    if site.preprocess_array and site.preprocess_nodes > 1:
        raise ValueError("preprocess_array runs the parts as separate one-CPU tasks, preprocess_nodes > 1 runs one "
                         "Dask cluster: choose one (set preprocess_nodes: 1 or preprocess_array: false)")
    if site.time_limit is not None and not _TIME.match(site.time_limit):
        raise ValueError(f"time_limit {site.time_limit!r}: write HH:MM:SS or D-HH:MM:SS, e.g. 04:00:00 or 2-00:00:00")
    for name, value in site.env.items():
        if not _ENV_NAME.match(str(name)):
            raise ValueError(f"env: {name!r} is not a valid environment variable name")
        if not isinstance(value, (str, int, float, bool)):
            raise ValueError(f"env: {name} must be a single value, got {value!r}")
    for line in [*site.setup, *site.slurm.extra_sbatch, *site.slurm.container.mounts]:
        if "\n" in line:
            raise ValueError(f"one line each in setup, slurm.extra_sbatch and slurm.container.mounts: {line!r}")
    _check_slurm(site.slurm)
    _check_kubernetes(site.kubernetes)


def _check_slurm(slurm: SlurmSite) -> None:
    if slurm.launcher not in LAUNCHERS:
        raise ValueError(f"slurm.launcher must be one of {', '.join(LAUNCHERS)}, got {slurm.launcher!r}")
    if slurm.signal_seconds < 0 or slurm.step_grace_seconds < 0 or slurm.kill_wait_seconds < 0:
        raise ValueError("slurm.signal_seconds, slurm.step_grace_seconds and slurm.kill_wait_seconds must be >= 0")
    for option in slurm.extra_sbatch:
        if not option.startswith("-"):
            raise ValueError(f"slurm.extra_sbatch: {option!r} is not an sbatch option (write e.g. --mail-type=END)")
    if slurm.launcher == "deepspeed" and slurm.container.image:
        raise ValueError("slurm.launcher deepspeed runs the DeepSpeed launcher in the batch script, outside the "
                         "container: use launcher srun on a container site")
    if (slurm.container.mounts or slurm.container.extra_srun) and not slurm.container.image:
        raise ValueError("slurm.container has mounts or options but no image: set slurm.container.image (a "
                         "registry image or an enroot .sqsh file), or remove the container block")


def _check_kubernetes(k8s: KubernetesSite) -> None:
    if k8s.pretrain_form not in PRETRAIN_FORMS:
        raise ValueError(f"kubernetes.pretrain_form must be one of {', '.join(PRETRAIN_FORMS)}, "
                         f"got {k8s.pretrain_form!r}")
    if not _DNS_LABEL.match(k8s.namespace):
        raise ValueError(f"kubernetes.namespace {k8s.namespace!r} is not a valid namespace name")
    names = [k8s.image_pull_secret, k8s.service_account, k8s.priority_class, k8s.data_pvc, k8s.checkpoints_pvc,
             *k8s.env_from_secrets]
    for name in names:
        if name is not None and not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"kubernetes: {name!r} is not a valid Kubernetes object name")
    for variable, reference in k8s.secret_env.items():
        secret, _, key = str(reference).partition("/")
        if not _ENV_NAME.match(str(variable)) or not _DNS_SUBDOMAIN.match(secret) or not key:
            raise ValueError(f"kubernetes.secret_env: write VARIABLE: secret-name/key, got {variable}: {reference}")
    for mount in (k8s.data_mount, k8s.checkpoints_mount):
        if not mount.startswith("/"):
            raise ValueError(f"kubernetes mount paths must be absolute, got {mount!r}")
    if k8s.backoff_limit < 0 or k8s.termination_grace_seconds < 0:
        raise ValueError("kubernetes.backoff_limit and termination_grace_seconds must be >= 0")
    if not re.match(r"^1\.[0-9]+$", k8s.version):
        raise ValueError(f"kubernetes.version: write MAJOR.MINOR, e.g. 1.31, got {k8s.version!r}")


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SiteConfig:
    """The site at ``path`` with ``--site-set key=value`` overrides applied."""
    try:
        return configlib.load(SiteConfig, path, overrides)
    except configlib.ConfigError as error:
        # configlib names overrides --set and the top-level dataclass; say what the user typed instead
        message = str(error).replace("--set '", "--site-set '").replace(": SiteConfig: ", ": ")
        raise SiteError(message) from None


def resolve_workdir(site: SiteConfig, here: Path) -> str:
    """The repository path jobs use (absolute): the site's, or the directory the command runs in."""
    return site.workdir if site.workdir else str(here.resolve())


def resolve_log_dir(site: SiteConfig, workdir: str) -> str:
    return site.log_dir if site.log_dir.startswith("/") else f"{workdir.rstrip('/')}/{site.log_dir}"
