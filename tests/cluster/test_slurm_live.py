"""The three stages as jobs on a real Slurm cluster (one node: this machine, 2 CPUs), submitted the way users do,
with ``python -m cluster submit slurm`` and the site file configs/cluster/slurm_local_cpu.yaml: pretraining on
2 tasks, preemption by USR1 with requeue and resume, preprocessing, and finetuning what the pretraining job made."""
import json
import pathlib
import re
import sys

import pytest

from common import processes
from pretrain import checkpoints
from pretrain import config as pretrain_config
from tests.cluster.live import STEPS, summary, tiny_run, wait_until
from tests.pretrain.launching import REPO, TINY, environment, losses

pytest_plugins = ["tests.cluster.live"]

SITE = str(REPO / "configs" / "cluster" / "slurm_local_cpu.yaml")
SAMPLES = REPO / "samples"
JOB_TIMEOUT = 180  # seconds: several times what the tiny jobs need, so a slow machine does not fail them


@pytest.fixture(scope="module")
def submit(slurm, tmp_path_factory):
    """``submit(stage, config, *arguments)``: submit through the project's command, return the job id it prints.
    Job scripts and logs go to a temporary directory rather than the checkout's runs/; the jobs run this
    interpreter (a fresh machine may have no ``python`` on PATH)."""
    log_dir = tmp_path_factory.mktemp("slurm-logs")

    def submit(stage: str, config: str, *arguments: str) -> str:
        """The id of the job submitted last (the one that finishes a chain)."""
        command = [sys.executable, "-m", "cluster", "submit", "slurm", "--stage", stage, "--cluster", SITE,
                   "--site-set", f"log_dir={log_dir}", "--site-set", f"python={sys.executable}",
                   "--config", config, *arguments]
        result = processes.run(command, cwd=REPO, env=environment(**slurm.env), capture_output=True, text=True,
                               timeout=120)
        assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}"
        job_ids = re.findall(r"Submitted batch job (\d+)", result.stdout)
        assert job_ids, f"no job id in the output of {' '.join(command)}:\n{result.stdout}"
        assert f"log: {log_dir}/" in result.stdout, result.stdout  # it says where the logs go
        submit.output = result.stdout
        return job_ids[-1]

    return submit


def finished(slurm, job_id: str) -> tuple[dict, str]:
    """Wait for the job; it must have completed with exit status 0. Returns its fields and its log."""
    job = slurm.wait(job_id, JOB_TIMEOUT)
    log = pathlib.Path(job["StdOut"]).read_text(errors="replace")
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", f"{job}\n{log[-5000:]}"
    assert slurm.completions(job_id)[-1]["JobState"] == "COMPLETED"
    return job, log


@pytest.fixture(scope="module")
def pretraining_job(slurm, submit, sample_dataset, tmp_path_factory):
    """The tiny run started by the DeepSpeed launcher's Slurm backend (a site option); the preemption test below
    covers the default form, one srun task per rank, so both forms run for real."""
    out = tmp_path_factory.mktemp("slurm-pretrain") / "run"
    job, log = finished(slurm, submit("pretrain", TINY, "--site-set", "slurm.launcher=deepspeed",
                                      *tiny_run(sample_dataset, out)))
    return job, log, out


def test_pretraining_job_runs_two_tasks_to_a_complete_checkpoint(pretraining_job, two_rank_reference):
    job, log, out = pretraining_job
    assert job["NumTasks"] == "2" and job["Restarts"] == "0"
    assert re.search(r"cmd = srun -n 2 ", log), log[-5000:]  # the DeepSpeed launcher made the ranks an srun step
    assert "micro-batch 16 x 2 ranks x 1 accumulation" in log
    batch = pretrain_config.load(TINY).train.global_batch_size
    ran = summary(out)
    assert {key: ran[key] for key in ("status", "step", "consumed_samples", "skipped_steps", "world_size")} == {
        "status": "done", "step": STEPS, "consumed_samples": STEPS * batch, "skipped_steps": 0, "world_size": 2}
    assert ran["wall_seconds"] > 0 and ran["timings"]["checkpoint_save_s"]  # when and how long it saved
    final = checkpoints.newest(out / "checkpoints")
    assert final is not None and final.step == STEPS and final.info["world_size"] == 2
    assert (final.path / checkpoints.MARKER).is_file()
    assert losses(out) == two_rank_reference  # Slurm's ranks are torchrun's ranks: the same run, bit for bit


def test_usr1_checkpoints_requeues_and_resumes_to_the_loss_of_an_uninterrupted_run(slurm, submit, sample_dataset,
                                                                                    two_rank_reference, tmp_path):
    out = tmp_path / "run"
    job_id = submit("pretrain", TINY, *tiny_run(sample_dataset, out))

    def progressed():
        assert slurm.job(job_id)["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), slurm.diagnose(job_id)
        metrics = out / "metrics.jsonl"
        return metrics.is_file() and any(json.loads(line)["step"] >= 2 for line in metrics.read_text().splitlines())

    wait_until(progressed, f"job {job_id} training", JOB_TIMEOUT, interval=0.2, diagnose=lambda: slurm.diagnose(job_id))
    # What Slurm does ahead of the time limit with --signal=B:USR1@N, now: the signal goes to the batch shell only.
    slurm.run("scancel", "--signal=USR1", "--batch", job_id)
    job, log = finished(slurm, job_id)

    saved = re.search(r"received SIGUSR1: saving at step (\d+)", log)
    assert saved, log[-5000:]
    step = int(saved.group(1))
    assert 2 <= step < STEPS
    assert job["Restarts"] == "1"
    # The completion log has the job twice: ended by the requeue (its state then is the pending one), then done.
    requeued, done = slurm.completions(job_id)
    assert requeued["JobState"] != "COMPLETED" and done["JobState"] == "COMPLETED"
    assert re.search(rf"resumed from \S+/step_{step:08d} at step {step} ", log), log[-5000:]
    assert summary(out)["status"] == "done" and summary(out)["step"] == STEPS
    final = checkpoints.newest(out / "checkpoints")
    assert final is not None and final.step == STEPS
    got = losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got[STEPS] == two_rank_reference[STEPS]
    assert got == two_rank_reference


def test_preprocessing_job_writes_the_dataset_a_local_run_writes(slurm, submit, sample_dataset, bert_vocab, tmp_path):
    out = tmp_path / "dataset"
    # The settings sample_dataset was built with in-process; the job runs Beam's multi-processing runner instead.
    job_id = submit("preprocess", "configs/preprocess/tiny.yaml", "--set", "output.num_shards=3",
                    "--set", "instances.dupe_factor=3", "--", "--wikipedia", str(SAMPLES / "wikipedia"),
                    "--books", str(SAMPLES / "books"), "--tokenizer", str(bert_vocab), "--output", str(out))
    finished(slurm, job_id)
    manifest = json.loads((out / "manifest.json").read_text())
    local = json.loads((sample_dataset / "manifest.json").read_text())
    assert manifest["rows"] > 0 and len(manifest["shards"]) == 3
    assert [(s["name"], s["rows"], s["sha256"]) for s in manifest["shards"]] == \
        [(s["name"], s["rows"], s["sha256"]) for s in local["shards"]]
    assert all((out / s["name"]).is_file() for s in manifest["shards"])


def test_preprocessing_parts_as_job_arrays_write_the_dataset_a_local_run_writes(slurm, submit, sample_dataset,
                                                                                bert_vocab, tmp_path):
    """--parts 2 as a documents array, an instances array and a finishing job, chained by dependencies."""
    out = tmp_path / "dataset"
    job_id = submit("preprocess", "configs/preprocess/tiny.yaml", "--site-set", "preprocess_array=true",
                    "--set", "output.num_shards=3", "--set", "instances.dupe_factor=3", "--",
                    "--wikipedia", str(SAMPLES / "wikipedia"), "--books", str(SAMPLES / "books"),
                    "--tokenizer", str(bert_vocab), "--output", str(out), "--parts", "2")
    submitted = submit.output
    _, log = finished(slurm, job_id)
    assert "instances:" in log and str(out) in log  # the finishing job's summary
    array_logs = re.findall(r"^log: (\S+<task>\.out)$", submitted, flags=re.MULTILINE)
    assert len(array_logs) == 2, submitted
    for pattern, step in zip(array_logs, ("documents", "instances")):
        logs = sorted(pathlib.Path(pattern).parent.glob(pathlib.Path(pattern).name.replace("<task>", "*")))
        assert [path.read_text().count(f"{step}, part ") for path in logs] == [1, 1], logs  # one task per part
    manifest = json.loads((out / "manifest.json").read_text())
    local = json.loads((sample_dataset / "manifest.json").read_text())
    assert [(s["name"], s["rows"], s["sha256"]) for s in manifest["shards"]] == \
        [(s["name"], s["rows"], s["sha256"]) for s in local["shards"]]
    assert manifest["parameters"]["parts"] == 2 and not pathlib.Path(f"{out}.incomplete").exists()


def test_finetuning_job_reports_on_the_pretraining_jobs_checkpoint(slurm, submit, pretraining_job, tmp_path):
    _, _, run = pretraining_job
    out = tmp_path / "finetune"
    job_id = submit("finetune", "configs/finetune/default.yaml", "--set", "seeds=[1]",
                    "--set", "glue.training.epochs=1", "--set", "glue.per_task={}",
                    "--", "--checkpoint", str(run), "--tasks", "rte", "--data", str(SAMPLES), "--output", str(out))
    finished(slurm, job_id)
    report = json.loads((out / "report.json").read_text())
    assert report["checkpoint"] == str(run) and report["seeds"] == [1]
    (result,) = report["results"]
    rows = len((SAMPLES / "glue" / "RTE" / "dev.tsv").read_text().splitlines()) - 1  # minus the header
    assert result["task"] == "rte" and result["eval_examples"] == rows
    assert 0.0 <= result["mean"]["accuracy"] <= 1.0
