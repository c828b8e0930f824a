"""A full disk or missing permission in pretraining: each rank prints one line naming the path, the cause and the fix
(exit 2), the traceback in a file the line names, or on the screen with --debug. Checkpoint saves name the checkpoint
and the newest complete one, which is untouched; the export names its directory; unreadable shards, tokenizers and
checkpoints are named as such, not as damaged."""
import errno
import os
import shutil

import pytest

from common.errors import StorageError
from pretrain import checkpoints, train
from tests import disk_faults
from tests.disk_faults import one_error_line, traceback_file, with_debug
from tests.pretrain.faults import start_one_rank, tiny_config, truncate
from tests.pretrain.launching import RUN, TINY, settings

MODEL_FILE = "mp_rank_00_model_states.pt"


child = disk_faults.child  # a fixture: a full disk or missing permission for a child process


@pytest.fixture(scope="module")
def finished_run(sample_dataset, tmp_path_factory):
    """4 steps on one rank, checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("disk-errors") / "run"
    assert train.run(tiny_config(sample_dataset, out, 4), start_one_rank(), resume=False) == 0
    return out


def _pretrain(child, dataset, out, steps, *more):
    return child.run([RUN, "--config", TINY, *settings(dataset, out, steps=steps, **{"checkpoint.every_steps": 2}),
                      *more])


def test_a_full_disk_at_a_checkpoint_save_names_the_checkpoint(child, sample_dataset, tmp_path):
    out = tmp_path / "run"
    child.full_disk("run/checkpoints", size="2m")  # room for DeepSpeed's scripts, not for the model's states
    line = one_error_line(_pretrain(child, sample_dataset, out, 2))
    assert line.startswith(f"error (rank 0): {out / 'checkpoints' / 'step_00000002'}: no space left on device while "
                           "writing the checkpoint; free space on that file system; no earlier checkpoint of this run "
                           "is complete (traceback in "), line
    traceback_file(line)
    assert checkpoints.complete(out / "checkpoints") == []

    with_debug(_pretrain(child, sample_dataset, out, 2, "--debug"), line)


def test_a_checkpoint_directory_this_user_may_not_write_is_named(child, sample_dataset, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    child.unwritable(out / "checkpoints")
    line = one_error_line(_pretrain(child, sample_dataset, out, 2))
    assert line.startswith(f"error (rank 0): {out / 'checkpoints' / 'step_00000002'}: permission denied while writing "
                           "the checkpoint; give this user write access to its directory; no earlier checkpoint of "
                           "this run is complete (traceback in "), line


def test_the_message_of_a_failed_save_names_the_checkpoint_that_is_kept(finished_run, tmp_path):
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    failure = checkpoints.save_failure(full, finished_run / "checkpoints", "step_00000006")
    assert str(failure) == (f"{finished_run / 'checkpoints' / 'step_00000006'}: no space left on device while "
                            "writing the checkpoint; free space on that file system; step_00000004, the newest "
                            "complete checkpoint, is untouched and --resume continues from it")
    assert checkpoints.save_failure(ValueError("not a disk fault"), finished_run / "checkpoints", "x") is None


def test_a_marker_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    (tmp_path / "step_00000002").mkdir()
    (tmp_path / "step_00000002" / "model.pt").write_bytes(b"weights")

    def full(self, *args, **kwargs):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr("pathlib.Path.write_text", full)
    with pytest.raises(StorageError) as refused:
        checkpoints.publish(tmp_path, "step_00000002", {"step": 2})
    assert str(refused.value).startswith(f"{tmp_path / 'step_00000002'}: disk quota exceeded while writing the "
                                         "checkpoint; free space within your quota there, or have it raised")
    assert checkpoints.complete(tmp_path) == []


def test_a_full_disk_during_the_export_names_its_directory(child, finished_run):
    disk = child.full_disk("disk", size="1m")
    proc = child.run(["-m", "pretrain.export", finished_run, disk / "hf"])
    line = one_error_line(proc)
    assert line.startswith(f"error: {disk / 'hf'}"), line  # the directory, or the .partial one it is built in
    assert ": no space left on device while writing the Hugging Face export; free space on that file system; the " \
           "checkpoint is untouched: export it again with `python -m pretrain.export` (traceback in " in line
    traceback_file(line)
    assert list(disk.iterdir()) == []  # the partial export is removed: its space is given back
    with_debug(child.run(["-m", "pretrain.export", finished_run, disk / "hf", "--debug"]), line)


def test_a_shard_this_user_may_not_read_is_named_as_such(child, sample_dataset, tmp_path):
    dataset = tmp_path / "dataset"
    shutil.copytree(sample_dataset, dataset)
    shard = min(dataset.glob("shard-*.arrow"))
    child.unreadable(shard)
    line = one_error_line(_pretrain(child, dataset, tmp_path / "run", 2))
    assert line.startswith(f"error (rank 0): {shard}: permission denied; give this user access to it (traceback "), line
    assert "truncated" not in line and "damaged" not in line


def test_a_checkpoint_file_this_user_may_not_read_is_named_on_resume_and_export(child, finished_run, sample_dataset,
                                                                                 tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    shut = run_dir / "checkpoints" / "step_00000004" / MODEL_FILE
    child.unreadable(shut)
    line = one_error_line(_pretrain(child, sample_dataset, run_dir, 6, "--resume"))
    assert line.startswith(f"error (rank 0): {shut}: permission denied; give this user access to it"), line
    line = one_error_line(child.run(["-m", "pretrain.export", run_dir, tmp_path / "hf"]))
    assert line.startswith(f"error: {shut}: permission denied; give this user access to it"), line
    assert not (tmp_path / "hf").exists()


def test_a_truncated_run_tokenizer_is_named_on_resume(child, finished_run, sample_dataset, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    truncate(run_dir / "tokenizer" / "vocab.txt")
    line = one_error_line(_pretrain(child, sample_dataset, run_dir, 6, "--resume"))
    assert line.startswith(f"error (rank 0): {run_dir / 'tokenizer' / 'vocab.txt'}: "), line
    assert "where tokenizer.json records 30,522; the file is truncated or was replaced" in line
    assert "traceback in" not in line  # not a disk fault: the line says it all
