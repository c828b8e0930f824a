"""``python -m cluster`` as users run it: render, submit --dry-run, and submit with a fake ``sbatch``/``kubectl`` first
on PATH (the argument lists and the printed job id); and the promise that the cluster package imports no torch."""
import json
import os
import subprocess
import sys

import pytest

from common import processes
from tests.cluster.rendering import JOBS, REPO, crds, render  # noqa: F401  (crds: a fixture)

TINY = ["--stage", "pretrain", "--cluster", "configs/cluster/slurm_local_cpu.yaml", "--config",
        "configs/pretrain/tiny.yaml", "--set", "data.path=/srv/data/tiny", "--set", "output_dir=/srv/runs/tiny"]


def cluster(*arguments: str, path_first: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path_first:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    return processes.run([sys.executable, "-m", "cluster", *arguments], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)


def fake_client(directory, name: str, reply: str, status: int = 0):
    """An executable `name` that records its arguments and standard input as JSON, prints `reply`, exits `status`."""
    directory.mkdir(exist_ok=True)
    record = directory / f"{name}.json"
    program = directory / name
    program.write_text(f"""#!{sys.executable}
import json, sys
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
json.dump({{"argv": sys.argv[1:], "stdin": stdin}}, open({str(record)!r}, "w"))
print({reply!r}, file=sys.stdout if {status} == 0 else sys.stderr)
sys.exit({status})
""")
    program.chmod(0o755)
    return lambda: json.loads(record.read_text())


def test_cluster_imports_no_torch():
    code = ("import sys, cluster.cli, cluster.slurm, cluster.k8s, cluster.validate, cluster.stages; "
            "from tests.cluster.rendering import JOBS, render; "
            "[render(JOBS[name]) for name in JOBS if name.startswith('slurm')]; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(processes.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                               check=True, timeout=120).stdout.split())
    assert "cluster.slurm" in loaded and "pretrain.config" in loaded  # the stage configs were loaded ...
    assert not loaded & {"torch", "deepspeed", "apache_beam", "transformers"}  # ... without the training stack


def test_render_prints_the_validated_script(tmp_path):
    result = cluster("render", "slurm", *TINY, "--site-set", f"log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    expected, _ = render(["slurm", *TINY, "--site-set", f"log_dir={tmp_path}"])
    assert result.stdout == expected
    assert f"#SBATCH --output={tmp_path}/bert-pretrain-tiny-%j.out" in result.stdout
    assert f"srun --kill-on-bad-exit=0 --wait=120 --mpi=none \\\n    python {REPO}/pretrain/run.py" in result.stdout


def test_submit_dry_run_prints_what_would_be_submitted_and_submits_nothing(tmp_path):
    read = fake_client(tmp_path / "bin", "sbatch", "1")
    result = cluster("submit", "slurm", *TINY, "--site-set", f"log_dir={tmp_path / 'logs'}", "--dry-run",
                     path_first=str(tmp_path / "bin"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == cluster("render", "slurm", *TINY, "--site-set", f"log_dir={tmp_path / 'logs'}").stdout
    assert "dry run: nothing submitted; would run: sbatch --parsable" in result.stderr
    assert not (tmp_path / "logs").exists()
    with pytest.raises(FileNotFoundError):
        read()


def test_submit_runs_sbatch_with_the_script_and_prints_the_job_id(tmp_path):
    read = fake_client(tmp_path / "bin", "sbatch", "4242;cluster-a")
    logs = tmp_path / "logs"
    result = cluster("submit", "slurm", *TINY, "--site-set", f"log_dir={logs}", path_first=str(tmp_path / "bin"))
    assert result.returncode == 0, result.stderr
    call = read()
    assert call["argv"][0] == "--parsable" and len(call["argv"]) == 2
    script = call["argv"][1]
    assert script.startswith(f"{logs}/bert-pretrain-tiny-") and script.endswith(".sbatch")
    assert open(script).read() == render(["slurm", *TINY, "--site-set", f"log_dir={logs}"])[0]
    lines = result.stdout.splitlines()
    assert lines[0] == "Submitted batch job 4242"
    assert f"log: {logs}/bert-pretrain-tiny-4242.out" in lines


def test_preprocessing_parts_are_submitted_as_a_chain_of_jobs(tmp_path):
    """Three sbatch calls in order, each later one waiting for the one before (and cancelled if it fails)."""
    calls = tmp_path / "calls.jsonl"
    program = tmp_path / "bin" / "sbatch"
    program.parent.mkdir()
    program.write_text(f"""#!{sys.executable}
import json, sys
with open({str(calls)!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
print(sum(1 for _ in open({str(calls)!r})) + 700)
""")
    program.chmod(0o755)
    arguments = JOBS["slurm_venv-preprocess-parts.sbatch"]
    split = arguments.index("--")
    logs = tmp_path / "logs"
    arguments = [*arguments[:split], "--site-set", f"log_dir={logs}", *arguments[split:]]
    result = cluster("submit", *arguments, path_first=str(tmp_path / "bin"))
    assert result.returncode == 0, result.stderr
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [argv[:-1] for argv in argvs] == [
        ["--parsable"], ["--parsable", "--dependency=afterok:701", "--kill-on-invalid-dep=yes"],
        ["--parsable", "--dependency=afterok:702", "--kill-on-invalid-dep=yes"]]
    assert [open(argv[-1]).read() for argv in argvs] == [script.text for script in render(arguments)[1]]
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("Submitted")] == [
        "Submitted batch job 701", "Submitted batch job 702 (after job 701 succeeds)",
        "Submitted batch job 703 (after job 702 succeeds)"]
    assert f"log: {logs}/bert-preprocess-phase1-seq128-documents-701_<task>.out" in lines


def test_a_refused_submission_is_one_clear_error(tmp_path):
    fake_client(tmp_path / "bin", "sbatch", "sbatch: error: invalid partition specified: debug", status=1)
    result = cluster("submit", "slurm", *TINY, "--site-set", f"log_dir={tmp_path}", path_first=str(tmp_path / "bin"))
    assert result.returncode == 1
    assert result.stderr.strip() == ("error: sbatch refused the job (exit status 1): "
                                     "sbatch: error: invalid partition specified: debug")


def test_submit_applies_the_manifests_with_kubectl(tmp_path, crds):  # noqa: F811
    read = fake_client(tmp_path / "bin", "kubectl", "configmap/bert-finetune-default-config created\n"
                                                    "job.batch/bert-finetune-default created")
    arguments = JOBS["k8s-finetune.yaml"]
    split = arguments.index("--")
    result = cluster("submit", *arguments[:split], "--site-set", "kubernetes.context=gpu-cluster",
                     "--crd-dir", str(crds), *arguments[split:], path_first=str(tmp_path / "bin"))
    assert result.returncode == 0, result.stderr
    call = read()
    assert call["argv"] == ["--context", "gpu-cluster", "apply", "-f", "-"]
    assert call["stdin"] == render(JOBS["k8s-finetune.yaml"])[0]
    assert "Submitted job/bert-finetune-default in namespace bert" in result.stdout.splitlines()
    assert "logs: kubectl -n bert logs -f --prefix --max-log-requests 64 -l bert-pipeline/job=bert-finetune-default" \
        in result.stdout.splitlines()


def test_bad_input_is_one_line_with_status_2():
    result = cluster("render", "slurm", *TINY, "--site-set", "nodes=0")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "nodes and preprocess_nodes must be >= 1" in result.stderr
    result = cluster("render", "k8s", *TINY[:3], "configs/cluster/missing.yaml", *TINY[4:])
    assert result.returncode == 2 and "config file configs/cluster/missing.yaml does not exist" in result.stderr
