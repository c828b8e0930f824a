"""Slurm batch scripts for the three stages.

Every script carries the resolved stage config in a here-document and writes it next to its log when it starts,
so what runs is what was submitted, also after a requeue (Slurm keeps its own copy of the script). Paths are
absolute; the repository is the site's ``workdir``.

Pretraining runs one task per GPU through ``srun`` (ranks from SLURM_PROCID, pretrain/launch.py) or, as a site
option, through the DeepSpeed launcher (which calls srun itself). Preemption: ``--signal=B:USR1@N`` reaches this
script's shell, which passes USR1 on to the training step; the step saves at the next step boundary (or, when the
step would outlast the N seconds, ``faults.warning_seconds``, at a micro-batch boundary) and exits with 75, and the
script requeues the job, which resumes from that checkpoint (``--resume`` is always on). The time limit's SIGTERM
leaves ``slurm.kill_wait_seconds`` (Slurm's KillWait), the job's ``faults.grace_seconds``.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from cluster.site import SiteConfig, resolve_log_dir
from cluster.stages import DASK_PORT, ShellVar, StageJob, command, dask_runner, direct_runner, prepare

PREEMPTED = 75  # pretrain.train.PREEMPTED: saved after a signal and wants a requeue
CONFIG_END = "BERT_PIPELINE_CONFIG_END"


@dataclass(frozen=True)
class Rendered:
    text: str                      # the batch script
    log_pattern: str               # its --output, with Slurm's %j (or %A_%a for an array) for the job id
    name: str                      # the job's name; also names the submitted script file
    after_previous: bool = False   # submitted with --dependency=afterok: on the job of the script before it


@dataclass(frozen=True)
class Allocation:
    nodes: int
    tasks_per_node: int
    cpus_per_task: int | None
    gpus_per_node: int
    memory: str | None = None      # --mem (per node); None: the site's memory
    array: int = 0                 # > 0: a job array of this many tasks (0 .. array-1)


NEXT_SCRIPT = "# ====== next script, submitted with sbatch --dependency=afterok:<the job id above> ======"


def render(job: StageJob, site: SiteConfig, *, workdir: str, log_dir: str, site_source: str) -> list[Rendered]:
    """The batch script(s) of a job: one, or (preprocessing parts as arrays) one per step, chained."""
    if CONFIG_END in job.config_text:
        raise ValueError(f"the config contains the line {CONFIG_END}, which ends the script's here-document")
    if job.stage == "preprocess" and site.preprocess_array:
        return _preprocess_parts(job, site, workdir, log_dir, site_source)
    if job.stage == "pretrain":  # the warning's and KillWait's times, in the config it carries and on its command line
        job = prepare(job.stage, job.config_source, [*site.pretrain_overrides("slurm", job.overrides), *job.overrides],
                      list(job.arguments), job.name)
    allocation, body = _STAGE_BODIES[job.stage](job, site, workdir)
    return [_script(job, site, allocation, body, workdir=workdir, log_dir=log_dir, site_source=site_source)]


def joined(scripts: list[Rendered]) -> str:
    """What `render` prints: the scripts in submission order."""
    return f"\n{NEXT_SCRIPT}\n\n".join(script.text for script in scripts)


def _script(job: StageJob, site: SiteConfig, allocation: Allocation, body: list[str], *, workdir: str, log_dir: str,
            site_source: str, name: str | None = None, about: list[str] = (), after_previous: bool = False) -> Rendered:
    name = name or job.name
    log_pattern = f"{log_dir}/{name}-{'%A_%a' if allocation.array else '%j'}.out"
    # Every task of an array writes the same config under the array's id.
    job_id = '"${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"' if allocation.array else '"$SLURM_JOB_ID"'
    preemptible = job.stage == "pretrain"
    lines = [
        "#!/bin/bash",
        f"# bert-pipeline {job.stage} job: {job.config_source} on the site {site_source}.",
        "# Made by `python -m cluster render slurm`; `python -m cluster submit slurm` (same arguments) submits it.",
        *about,
        *(_PREEMPTION_NOTE if preemptible and site.slurm.signal_seconds else []),
        *(f"#SBATCH {option}" for option in _sbatch_options(job, site, allocation, log_pattern, preemptible, name)),
        "set -uo pipefail",
        "",
        'say() { echo "[$(date \'+%F %T\')] $*"; }',
        f'say "job $SLURM_JOB_ID ({name}, restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST"',
        "",
        "# The resolved stage config travels in this script: a requeued or repeated job runs what was submitted.",
        f'config={shlex.quote(log_dir)}/{name}-{job_id}.yaml',
        f"cat > \"$config.tmp.$$\" <<'{CONFIG_END}'",
        job.config_text.rstrip("\n"),
        CONFIG_END,
        'mv -f "$config.tmp.$$" "$config" || { say "cannot write $config"; exit 1; }',
        "",
        f"cd {shlex.quote(workdir)}",
        f'export PYTHONPATH={shlex.quote(workdir)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        *site.setup,
        *(f"export {var}={shlex.quote(value)}" for var, value in _environment(job, site, allocation).items()),
        *([f"export SRUN_CPUS_PER_TASK={allocation.cpus_per_task}  # srun >= 22.05 does not inherit --cpus-per-task"]
          if allocation.cpus_per_task else []),
        "",
        *body,
    ]
    return Rendered("\n".join(lines) + "\n", log_pattern, name, after_previous)


_PREEMPTION_NOTE = [
    "# Preemption: Slurm sends USR1 ahead of the time limit (--signal); the training step saves a checkpoint at the",
    "# next step boundary and exits with status 75; this script then requeues the job, which resumes from it.",
    "# A step that would outlast the warning (faults.warning_seconds) stops at a micro-batch boundary instead;",
    "# after the time limit's SIGTERM, faults.grace_seconds is Slurm's KillWait (site: slurm.kill_wait_seconds).",
]


def _sbatch_options(job: StageJob, site: SiteConfig, allocation: Allocation, log_pattern: str,
                    preemptible: bool, name: str) -> list[str]:
    slurm = site.slurm
    options = [f"--job-name={name}"]
    options += [f"--{key}={value}" for key, value in (("partition", slurm.partition), ("account", slurm.account),
                                                      ("qos", slurm.qos), ("constraint", slurm.constraint)) if value]
    options += [f"--nodes={allocation.nodes}", f"--ntasks-per-node={allocation.tasks_per_node}"]
    if allocation.cpus_per_task:
        options.append(f"--cpus-per-task={allocation.cpus_per_task}")
    if allocation.gpus_per_node:
        options.append(f"--gres=gpu:{allocation.gpus_per_node}" if slurm.gres
                       else f"--gpus-per-node={allocation.gpus_per_node}")
    if allocation.memory or site.memory:
        options.append(f"--mem={site.memory_slurm(allocation.memory)}")
    if site.time_limit:
        options.append(f"--time={site.time_limit}")
    if slurm.exclusive and not allocation.array:  # array tasks of one CPU share nodes
        options.append("--exclusive")
    if allocation.array:
        options.append(f"--array=0-{allocation.array - 1}")
    if preemptible and slurm.signal_seconds:
        options.append(f"--signal=B:USR1@{slurm.signal_seconds}")
    if preemptible and slurm.requeue:
        options.append("--requeue")
    options += ["--open-mode=append", f"--output={log_pattern}"]
    return options + list(slurm.extra_sbatch)


def _environment(job: StageJob, site: SiteConfig, allocation: Allocation) -> dict[str, str]:
    threads = 1 if job.stage == "preprocess" else allocation.cpus_per_task or 1  # Beam: one process per core
    return site.job_environment(distributed_gpus=job.stage == "pretrain" and site.gpus_per_node > 0,
                                threads=threads)


# ------------------------------------------------------------------------------------------------ stages

def _pretrain(job: StageJob, site: SiteConfig, workdir: str):
    allocation = Allocation(site.nodes, site.tasks, site.task_cpus, site.gpus_per_node)
    train = command(job, python=site.python, workdir=workdir, config_file=ShellVar("config"))
    lines = [
        '# Rank 0 is on the first node; the port follows from the job id (pretrain/launch.py derives the same).',
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        'say "master $MASTER_ADDR:$MASTER_PORT, ${SLURM_NTASKS:-?} tasks"',
        "",
    ]
    if site.slurm.launcher == "deepspeed":
        lines += [
            f'hostfile={shlex.quote(resolve_log_dir(site, workdir))}/{job.name}-"$SLURM_JOB_ID".hostfile',
            f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/ slots={site.tasks}/" > "$hostfile"',
            "",
        ]
        # --no_ssh_check: the launcher would otherwise ssh to the first node before starting, and compute nodes
        # often refuse ssh (its slurm backend never needs it: the ranks start as an srun step).
        launcher = ["deepspeed", "--hostfile", ShellVar("hostfile"), "--launcher", "slurm", "--force_multi",
                    "--no_ssh_check", "--master_addr", ShellVar("MASTER_ADDR"),
                    "--master_port", ShellVar("MASTER_PORT")]
        srun_options = _srun_options(site, workdir) + _step_options(site)
        if srun_options:
            launcher += [f"--launcher_args={' '.join(srun_options)}"]
        train = train[1:]  # the DeepSpeed launcher starts the interpreter itself
        # Its slurm backend runs the ranks as an srun step of this job: a signal to the job's steps reaches them.
        forward = 'scancel --signal=USR1 "$SLURM_JOB_ID"'
    else:
        launcher = ["srun", *_step_options(site), *_srun_options(site, workdir)]
        forward = 'kill -USR1 "$step" 2>/dev/null'  # srun passes the signal on to every task
    launcher = _groups(launcher) if site.slurm.launcher == "deepspeed" else _launcher_groups(launcher)
    lines += [
        "# Slurm signals this shell ahead of the time limit (--signal=B:USR1); the training step gets it from here.",
        "cancelled=0",
        f'on_usr1() {{ say "USR1: asking the training step to checkpoint and stop"; {forward}; }}',
        "trap on_usr1 USR1",
        "trap 'cancelled=1' TERM  # scancel, or preemption that Slurm requeues itself: no requeue from here",
        _format([*launcher, *_groups(train)]) + " &",
        "step=$!",
        "while :; do",
        '  wait "$step"; status=$?',
        '  kill -0 "$step" 2>/dev/null && continue  # a trapped signal ended the wait, not the step',
        '  [ "$status" -gt 128 ] && { wait "$step"; status=$?; }  # the step ended as the signal came',
        "  break",
        "done",
        "",
        *_requeue_block(site),
        'say "training step ended with status $status"',
        'exit "$status"',
    ]
    return allocation, lines


def _requeue_block(site: SiteConfig) -> list[str]:
    if not site.slurm.requeue:
        return [f'[ "$status" -eq {PREEMPTED} ] && say "checkpoint saved (status {PREEMPTED}); requeue is off for '
                'this site: submit the same command again to resume"']
    return [
        f'if [ "$status" -eq {PREEMPTED} ] && [ "$cancelled" -eq 0 ]; then',
        f'  say "checkpoint saved (status {PREEMPTED}): requeueing job $SLURM_JOB_ID; it resumes from the checkpoint"',
        '  scontrol requeue "$SLURM_JOB_ID" || say "scontrol requeue failed: submit the same command again to resume"',
        "fi",
    ]


def _preprocess(job: StageJob, site: SiteConfig, workdir: str):
    nodes = site.preprocess_nodes
    allocation = Allocation(nodes, 1, site.node_cpus, 0)
    cpus = ShellVar("SLURM_CPUS_PER_TASK" if site.node_cpus else "SLURM_CPUS_ON_NODE")
    container = _srun_options(site, workdir)
    if nodes == 1:
        run = command(job, python=site.python, workdir=workdir, config_file=ShellVar("config"),
                      runner=direct_runner(cpus))
        return allocation, ["# Beam on this node: one worker process per core.",
                            _format([*_launcher_groups(["srun", *container]), *_groups(run)])]
    scheduler = f"tcp://$head:{DASK_PORT}"
    run = command(job, python=site.python, workdir=workdir, config_file=ShellVar("config"),
                  runner=dask_runner(ShellVar("scheduler")))
    on_head = _launcher_groups(["srun", "--nodes=1", "--ntasks=1", ShellVar("head", "--nodelist="), "--overlap",
                                *container])
    return allocation, [
        "# A Dask cluster inside the job: the scheduler on the first node, a worker process per core on every node;",
        "# the Beam driver runs on the first node with Beam's DaskRunner. Output must be on shared storage.",
        'head="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        f'scheduler="{scheduler}"',
        _format([*on_head, ["dask", "scheduler", "--host", ShellVar("head"), "--port", str(DASK_PORT),
                           "--dashboard-address", ":8787"]]) + " &",
        "scheduler_step=$!",
        f'for attempt in $(seq 120); do (exec 3<>"/dev/tcp/$head/{DASK_PORT}") 2>/dev/null && break; sleep 1; done',
        _format([*_launcher_groups(["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--overlap", *container]),
                 ["dask", "worker", ShellVar("scheduler"), "--nworkers", cpus, "--nthreads", "1",
                  "--no-dashboard"]]) + " &",
        "workers_step=$!",
        'say "Dask scheduler $scheduler; workers on $SLURM_JOB_NUM_NODES nodes"',
        _format([*on_head, *_groups(run)]),
        "status=$?",
        'kill "$workers_step" "$scheduler_step" 2>/dev/null',
        "wait",
        'exit "$status"',
    ]


def _preprocess_parts(job: StageJob, site: SiteConfig, workdir: str, log_dir: str, site_source: str) -> list[Rendered]:
    """The run's parts as one-CPU tasks within the part memory: an array for each part's documents, an array for
    each part's instances (after all documents), and one job that writes the shards and publishes (after all
    instances). A part that is done is skipped when the same command is submitted again, so after a failure
    resubmitting redoes only what failed; a chain whose predecessor failed is cancelled (--kill-on-invalid-dep)."""
    parts = job.config.parts
    container = _launcher_groups(["srun", *_srun_options(site, workdir)])
    scripts = []
    for number, step in enumerate(("documents", "instances", "finish"), start=1):
        array = 0 if step == "finish" else parts
        which = ["--step", step] if step == "finish" else ["--part", ShellVar("SLURM_ARRAY_TASK_ID"), "--step", step]
        run = command(job, python=site.python, workdir=workdir, config_file=ShellVar("config"), runner=which)
        what = {"documents": f"each of the {parts} parts reads, cleans and tokenizes its share of the input files",
                "instances": f"each of the {parts} parts builds the instances of its document buckets",
                "finish": "the globally shuffled shards and the manifest; the dataset is published"}[step]
        about = [f"# Step {number} of 3 of a preprocessing run in {parts} parts ({step}): {what}."]
        scripts.append(_script(job, site, Allocation(1, 1, 1, 0, memory=site.preprocess_part_memory, array=array),
                               [_format([*container, *_groups(run)])], workdir=workdir, log_dir=log_dir,
                               site_source=site_source, name=f"{job.name}-{step}"[:63], about=about,
                               after_previous=number > 1))
    return scripts


def _finetune(job: StageJob, site: SiteConfig, workdir: str):
    gpus = 1 if site.gpus_per_node else 0  # the suite trains one model at a time on one device
    allocation = Allocation(1, 1, site.task_cpus if gpus else site.node_cpus, gpus)
    run = command(job, python=site.python, workdir=workdir, config_file=ShellVar("config"))
    return allocation, [_format([*_launcher_groups(["srun", *_srun_options(site, workdir)]), *_groups(run)])]


_STAGE_BODIES = {"pretrain": _pretrain, "preprocess": _preprocess, "finetune": _finetune}


# ------------------------------------------------------------------------------------------------ helpers

def _step_options(site: SiteConfig) -> list[str]:
    # Not --kill-on-bad-exit: a rank that saved and exits 75 first must not take down rank 0 while it still
    # marks the checkpoint complete. --wait stops the remaining tasks a while after the first one ends instead.
    options = ["--kill-on-bad-exit=0", f"--wait={site.slurm.step_grace_seconds}"]
    return options + ([f"--mpi={site.slurm.mpi}"] if site.slurm.mpi else [])


def _srun_options(site: SiteConfig, workdir: str) -> list[str]:
    """pyxis options: every step runs in the site's container, which also sees the log directory (the config)."""
    container = site.slurm.container
    if not container.image:
        return []
    log_dir = resolve_log_dir(site, workdir)
    mounts = list(container.mounts)
    if not any(_same_path_mount(mount, log_dir) for mount in mounts):
        mounts.append(f"{log_dir}:{log_dir}")
    options = [f"--container-image={container.image}", f"--container-mounts={','.join(mounts)}",
               f"--container-workdir={workdir}"]
    if not container.mount_home:
        options.append("--no-container-mount-home")
    return options + list(container.extra_srun)


def _same_path_mount(mount: str, path: str) -> bool:
    source, _, rest = mount.partition(":")
    target = rest.split(":")[0] or source
    return source == target and (path == source or path.startswith(source.rstrip("/") + "/"))


def _launcher_groups(launcher: list[str]) -> list[list[str]]:
    """The launcher and its scheduling options on one line, container options one per line."""
    head = [word for word in launcher if not word.startswith("--container") and not word.startswith("--no-container")]
    return [head] + [[word] for word in launcher if word not in head]


def _word(word: str) -> str:
    if isinstance(word, ShellVar):
        return f'{word.prefix}"${{{word}}}"' if word.prefix else f'"${{{word}}}"'
    return shlex.quote(word)


def _groups(argv: list[str]) -> list[list[str]]:
    """Split a command line into readable groups: the program and its first words, then one option per line."""
    groups: list[list[str]] = []
    for word in argv:
        if not groups or (word.startswith("--") and not isinstance(word, ShellVar)):
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def _format(groups: list[list[str]]) -> str:
    return " \\\n    ".join(" ".join(_word(word) for word in group) for group in groups if group)
