"""Parts run as separate jobs (--part K, --step): the same dataset as one run, in any order, resumable, guarded."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

from common import preprocess_config as config_module
from common import processes
from common.errors import InputError
from preprocess.executors.steps import check_request
from tests.preprocess.conftest import REPO_ROOT, SAMPLES, read_manifest, run_cli, shard_hashes

CONFIG = "configs/preprocess/tiny.yaml"
PARTS = 3


def _inputs(bert_vocab) -> list:
    return ["--config", CONFIG, "--wikipedia", SAMPLES / "wikipedia", "--books", SAMPLES / "books",
            "--tokenizer", bert_vocab]


@pytest.fixture(scope="module")
def one_run(bert_vocab, tmp_path_factory):
    out = tmp_path_factory.mktemp("steps") / "one-run"
    run_cli("run", *_inputs(bert_vocab), "--output", out)
    return out


def _step(bert_vocab, out, *args, check=True):
    return run_cli("run", *_inputs(bert_vocab), "--output", out, "--parts", PARTS, *args, check=check)


def _error(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_steps_as_separate_jobs_give_the_one_run_dataset(one_run, bert_vocab, tmp_path):
    out = tmp_path / "parts"
    # A step whose prerequisites are missing says which parts to run; nothing is published.
    message = _error(_step(bert_vocab, out, "--step", "instances", "--part", "1", check=False))
    assert "step 'documents' is not done for part(s) 0-2 of 3" in message and "--step documents --part K" in message
    for part in (2, 0):
        assert f"documents, part {part} of 3" in _step(bert_vocab, out, "--step", "documents", "--part", part).stdout
    assert "'documents' is not done for part(s) 1 of 3" in _error(_step(bert_vocab, out, "--step", "instances",
                                                                         "--part", "0", check=False))
    assert "'instances' is not done for part(s) 0-2" in _error(_step(bert_vocab, out, "--step", "finish", check=False))
    _step(bert_vocab, out, "--step", "documents", "--part", "1")
    # A part that is done is not redone: a resubmitted array reruns only the parts that failed.
    assert "already done" in _step(bert_vocab, out, "--step", "documents", "--part", "1").stdout
    for part in (1, 2, 0):
        assert "instances" in _step(bert_vocab, out, "--step", "instances", "--part", part).stdout
    assert not (out / "manifest.json").exists()
    finished = _step(bert_vocab, out, "--step", "finish")
    assert "instances:" in finished.stdout and str(out) in finished.stdout
    assert shard_hashes(out) == shard_hashes(one_run)
    ours, reference = read_manifest(out), read_manifest(one_run)
    assert ours["statistics"] == reference["statistics"] and ours["rows"] == reference["rows"]
    assert (out / "tokenizer").is_dir() and not (out / "_work").exists()
    assert not out.with_name("parts.incomplete").exists()
    # The finished dataset is not overwritten by the parts of another run.
    assert "already holds a finished dataset" in _error(_step(bert_vocab, out, "--step", "documents", "--part", "0",
                                                              check=False))


def test_parts_that_run_at_once_meet_at_the_barriers_and_part_0_publishes(one_run, bert_vocab, tmp_path):
    out = tmp_path / "together"
    argv = [sys.executable, "-m", "preprocess", "run", *map(str, _inputs(bert_vocab)), "--output", str(out),
            "--parts", str(PARTS), "--wait", "300"]
    with contextlib.ExitStack() as running:  # every part's session is killed on leaving, a late one's too
        procs = [running.enter_context(processes.started([*argv, "--part", str(part)], cwd=REPO_ROOT,
                                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                 for part in (2, 1, 0)]
        outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    assert "part 0 writes the shards" in outputs[0][0] and "instances:" in outputs[2][0]
    assert shard_hashes(out) == shard_hashes(one_run)


def test_a_part_of_another_run_is_refused(bert_vocab, tmp_path):
    out = tmp_path / "mixed"
    _step(bert_vocab, out, "--step", "documents", "--part", "0")
    message = _error(_step(bert_vocab, out, "--step", "documents", "--part", "1", "--set", "seed=7", check=False))
    assert "unfinished work of another run" in message and "parameters" in message
    # Leftovers of an interrupted run that was not split into parts are not mixed into a new one either.
    stale = tmp_path / "stale.incomplete" / "_work" / "docs" / "b000001"
    stale.mkdir(parents=True)
    (stale / "p0000.json").write_text("{}")
    message = _error(_step(bert_vocab, tmp_path / "stale", "--step", "documents", "--part", "0", check=False))
    assert "interrupted run" in message and "delete it" in message


def test_the_work_of_an_older_layout_is_refused(bert_vocab, tmp_path):
    out = tmp_path / "older"
    _step(bert_vocab, out, "--step", "documents", "--part", "0")
    identity = tmp_path / "older.incomplete" / "_work" / "run.json"
    recorded = json.loads(identity.read_text())
    del recorded["work_layout"]  # as the versions that counted documents per bucket and part wrote it
    identity.write_text(json.dumps(recorded))
    message = _error(_step(bert_vocab, out, "--step", "documents", "--part", "1", check=False))
    assert "older version of this pipeline" in message and "delete that directory" in message


@pytest.mark.parametrize("step, part, beam_args, overwrite, needle", [
    ("finish", 0, [], False, "takes no --part"),
    ("documents", None, [], False, "needs --part"),
    (None, 3, [], False, "K goes from 0 to 2"),
    (None, 1, ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"], False, "drop --part"),
    ("instances", 0, [], True, "--overwrite cannot"),
])
def test_impossible_requests_are_refused_before_anything_runs(step, part, beam_args, overwrite, needle):
    cfg = config_module.load(REPO_ROOT / CONFIG, [f"parts={PARTS}"])
    with pytest.raises(InputError, match=needle):
        check_request(cfg, step, part, beam_args, overwrite)
