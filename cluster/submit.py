"""Hand a rendered job to the scheduler: ``sbatch --parsable FILE`` or ``kubectl apply -f -``.

Both run as argument lists (never through a shell); what they print back is turned into the job's id and the
place its logs go.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from common import processes


class SubmitError(RuntimeError):
    """The scheduler's client is missing or refused the job."""


@dataclass(frozen=True)
class Submitted:
    job_id: str
    lines: tuple[str, ...]   # what to tell the user: the id, the logs, the files


def script_path(log_dir: str, name: str, script: str) -> Path:
    """Where the submitted script is kept: named by its content, so resubmitting the same job reuses the file."""
    digest = hashlib.sha256(script.encode()).hexdigest()[:10]
    return Path(log_dir) / f"{name}-{digest}.sbatch"


def sbatch_command(path: Path, after: str | None = None) -> list[str]:
    """``after``: a job id this one waits for (``afterok``); if that job fails, Slurm cancels this one."""
    dependency = [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"] if after else []
    return ["sbatch", "--parsable", *dependency, str(path)]


def would_run(log_dir: str, scripts) -> list[str]:
    """The sbatch command lines ``submit`` would run, the later ones naming their predecessor's job."""
    return [" ".join(sbatch_command(script_path(log_dir, script.name, script.text),
                                    after=f"<job {number}>" if script.after_previous else None))
            for number, script in enumerate(scripts)]


def submit_slurm(scripts, *, log_dir: str) -> Submitted:
    """Submit the batch scripts (``cluster.slurm.Rendered``) in order; a script marked ``after_previous`` waits
    for the job submitted before it. Returns the last job's id and what to tell the user about every job."""
    lines: list[str] = []
    job_id = None
    for script in scripts:
        path = script_path(log_dir, script.name, script.text)
        # Slurm does not create the --output directory: a job whose log cannot be opened fails without a word.
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(script.text)
        os.replace(temporary, path)
        previous = job_id
        output = _run(sbatch_command(path, after=previous if script.after_previous else None), what="sbatch")
        # --parsable prints "JOBID" or "JOBID;CLUSTER"
        job_id = output.strip().splitlines()[-1].split(";")[0] if output.strip() else ""
        if not job_id.isdigit():
            raise SubmitError(f"sbatch printed no job id for {script.name}: {output.strip()!r}"
                              + (f" (jobs submitted before it: {previous})" if previous else ""))
        log = script.log_pattern.replace("%j", job_id).replace("%A", job_id).replace("%a", "<task>")
        lines += [f"Submitted batch job {job_id}" + (f" (after job {previous} succeeds)" if script.after_previous
                                                     else ""),
                  f"log: {log}", f"script: {path}",
                  f"config: {log_dir}/{script.name}-{job_id}.yaml (written when the job starts)"]
    return Submitted(job_id, tuple(lines))


def kubectl_command(context: str | None) -> list[str]:
    return ["kubectl", *(["--context", context] if context else []), "apply", "-f", "-"]


def submit_kubernetes(manifests: str, documents: list[dict], *, context: str | None) -> Submitted:
    output = _run(kubectl_command(context), what="kubectl", stdin=manifests)
    workload = documents[-1]  # the config comes first, the workload that runs last
    kind, name = workload["kind"], workload["metadata"]["name"]
    namespace = workload["metadata"]["namespace"]
    selector = f"bert-pipeline/job={name}"
    return Submitted(f"{kind.lower()}/{name}", (
        *output.strip().splitlines(),
        f"Submitted {kind.lower()}/{name} in namespace {namespace}",
        f"logs: kubectl -n {namespace} logs -f --prefix --max-log-requests 64 -l {selector}",
        f"status: kubectl -n {namespace} get {kind.lower()},pods -l {selector}",
        f"remove: kubectl -n {namespace} delete {_kinds(documents)} -l {selector}",
    ))


def _kinds(documents: list[dict]) -> str:
    return ",".join(dict.fromkeys(document["kind"].lower() for document in documents))


def _run(argv: list[str], *, what: str, stdin: str | None = None) -> str:
    try:
        result = processes.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SubmitError(f"{what} is not on PATH: submit from a machine with the {what} client, or render the "
                          "job and submit it there") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{what} did not answer within 120 s") from None
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        raise SubmitError(f"{what} refused the job (exit status {result.returncode}): {detail}")
    return result.stdout
