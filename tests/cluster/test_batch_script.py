"""The pretraining batch script's own logic, run by bash with stand-ins for Slurm's commands: USR1 reaches the
training step, status 75 makes the job requeue itself, a cancelled or finished job is not requeued, and the job runs
the config it carries. (tests/cluster/test_slurm_live.py does the same on a real Slurm cluster.)"""
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from common import processes
from tests.cluster.rendering import JOBS, PINNED_CHECKOUT, REPO, render

# A training step: records its arguments and pid, then runs until USR1 or TERM, which it answers like
# pretrain/run.py does (save, exit 75); with FAKE_STEP=finish it ends at once with 0.
STEP = f"""#!{sys.executable}
import json, os, signal, sys, time
here = os.environ["FAKE_DIR"]
json.dump(sys.argv[1:], open(os.path.join(here, "step-argv.json"), "w"))
open(os.path.join(here, "step.pid"), "w").write(str(os.getpid()))
if os.environ.get("FAKE_STEP") == "finish":
    sys.exit(0)
def save(signum, frame):
    print("received", signal.Signals(signum).name, "- saving", flush=True)
    sys.exit(75)
signal.signal(signal.SIGUSR1, save)
signal.signal(signal.SIGTERM, save)
while True:
    time.sleep(0.05)
"""
SCONTROL = """#!/bin/sh
case "$1" in
  show) echo node-a; echo node-b ;;
  requeue) echo "requeue $2" >> "$FAKE_DIR/requeued" ;;
esac
"""
SCANCEL = """#!/bin/sh
echo "$@" >> "$FAKE_DIR/scancel"
kill -USR1 "$(cat "$FAKE_DIR/step.pid")"
"""


def _install(bin_dir, name, text):
    path = bin_dir / name
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def batch(tmp_path):
    """Start the rendered script under bash as Slurm would (environment of job 1234); returns (process, dir).
    Each script runs in a session of its own, killed whole (its fake step included) when the test ends."""
    running = contextlib.ExitStack()

    def start(launcher: str = "srun", step: str = "run"):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        _install(bin_dir, "srun" if launcher == "srun" else "deepspeed", STEP)
        _install(bin_dir, "scontrol", SCONTROL)
        _install(bin_dir, "scancel", SCANCEL)
        arguments = [*JOBS["slurm_local_cpu-pretrain.sbatch"], "--site-set", f"log_dir={tmp_path}/logs",
                     "--site-set", f"workdir={tmp_path}", "--site-set", f"slurm.launcher={launcher}"]
        assert PINNED_CHECKOUT[1] in arguments  # the later --site-set workdir wins
        script = tmp_path / "job.sbatch"
        script.write_text(render(arguments)[0])
        (tmp_path / "logs").mkdir(exist_ok=True)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
               "FAKE_STEP": step, "SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NTASKS": "2"}
        return running.enter_context(processes.started(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT, text=True))

    with running:
        yield start


def _wait_for(path, process):
    deadline = time.monotonic() + 30
    while not path.exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.2)  # the step has installed its handlers


@pytest.mark.parametrize("launcher", ["srun", "deepspeed"])
def test_usr1_reaches_the_step_and_status_75_requeues_the_job(batch, tmp_path, launcher):
    process = batch(launcher)
    _wait_for(tmp_path / "step.pid", process)
    process.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@N (or scancel --signal=USR1 --batch) does
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 75, output
    assert "received SIGUSR1 - saving" in output
    assert (tmp_path / "requeued").read_text() == "requeue 1234\n", output
    assert "requeueing job 1234; it resumes from the checkpoint" in output
    if launcher == "deepspeed":  # its ranks are a step of the job: signalled through Slurm
        assert (tmp_path / "scancel").read_text() == "--signal=USR1 1234\n"


def test_the_step_resumes_with_the_config_the_job_carries(batch, tmp_path):
    from pretrain import config as pretrain_config

    process = batch(step="finish")
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert not (tmp_path / "requeued").exists()
    argv = yaml.safe_load((tmp_path / "step-argv.json").read_text())
    config = argv[argv.index("--config") + 1]
    assert config == f"{tmp_path}/logs/bert-pretrain-tiny-1234.yaml" and "--resume" in argv
    # The site's warning (--signal=B:USR1@60) and Slurm's KillWait (30 s) reach the step as the times to save.
    site_times = ["faults.warning_seconds=60", "faults.grace_seconds=30"]
    assert all(argv[argv.index(value) - 1] == "--set" for value in site_times)
    assert pretrain_config.load(config) == pretrain_config.load(
        str(REPO / "configs/pretrain/tiny.yaml"),
        [*site_times, "data.path=/srv/data/tiny", "output_dir=/srv/runs/tiny"])
    assert "training step ended with status 0" in output


def test_a_cancelled_job_is_not_requeued(batch, tmp_path):
    """scancel sends TERM to the batch shell and the step: the step saves and exits 75, but the user meant it."""
    process = batch()
    _wait_for(tmp_path / "step.pid", process)
    process.send_signal(signal.SIGTERM)
    os.kill(int((tmp_path / "step.pid").read_text()), signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 75 and "received SIGTERM - saving" in output
    assert not (tmp_path / "requeued").exists(), output
