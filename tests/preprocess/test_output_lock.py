"""The preprocessing run holds its output: a second run is refused, its pool workers end with the driver."""
import json
import os
import socket
import subprocess
import sys
import time

import psutil

from common import processes
from tests.preprocess.conftest import REPO_ROOT, SAMPLES, run_cli


def _tiny_run(output, vocab):
    return ["run", "--config", "configs/preprocess/tiny.yaml", "--wikipedia", str(SAMPLES / "wikipedia"),
            "--books", str(SAMPLES / "books"), "--tokenizer", str(vocab), "--output", str(output)]


def test_a_second_run_on_the_same_output_is_refused_in_one_line(tmp_path, bert_vocab):
    with processes.started([sys.executable, "-c", "import time; time.sleep(60)"]) as holder:  # killed on leaving
        start = open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[1].split()[19]
        (tmp_path / "dataset.lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                           "process_start": start, "started": time.time()}))
        proc = run_cli(*_tiny_run(tmp_path / "dataset", bert_vocab), check=False)
    assert proc.returncode == 2 and not (tmp_path / "dataset").exists()
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'dataset.lock'}: the dataset {tmp_path / 'dataset'} is being written by process "
        f"{holder.pid} on {socket.gethostname()} since " + proc.stderr.split(" since ", 1)[1].split(";")[0] +
        "; wait for it to finish, or stop it, before starting another run on the same output"]
    run_cli(*_tiny_run(tmp_path / "dataset", bert_vocab))  # the holder is gone: its lock is stale
    assert not (tmp_path / "dataset.lock").exists()


def test_pool_workers_end_when_the_driver_is_killed(tmp_path, real_wiki, bert_vocab):
    # Only the driver is killed: its workers must end by themselves. Whatever is left of its session (workers that
    # did not, once the assertion has seen them) is killed on leaving the block.
    with processes.started([sys.executable, "-m", "preprocess", "run", "--config",
                            "configs/preprocess/phase1_seq128.yaml", "--wikipedia", str(real_wiki), "--tokenizer",
                            str(bert_vocab), "--output", str(tmp_path / "dataset"), "--direct_num_workers", "2",
                            "--direct_running_mode", "multi_processing"],
                           cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        driver = psutil.Process(proc.pid)
        deadline = time.time() + 120
        while len(driver.children()) < 2:
            assert proc.poll() is None and time.time() < deadline, "the run ended before its workers were seen"
            time.sleep(0.05)
        workers = driver.children(recursive=True)
        proc.kill()
        proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, f"workers {[p.pid for p in alive]} outlived their driver"
