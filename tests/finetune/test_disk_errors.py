"""A full disk or missing permission when finetuning starts: one line naming the path, the cause and the fix (exit 2),
the traceback in a file the line names, or on the screen with --debug; a truncated tokenizer is one line too."""
import shutil

import pytest

from pretrain import train
from tests import disk_faults
from tests.disk_faults import one_error_line, traceback_file, with_debug
from tests.finetune.glue_sample import sst2_argv
from tests.pretrain import conftest as pretraining
from tests.pretrain.faults import start_one_rank, tiny_config, truncate

child = disk_faults.child  # a fixture: a full disk or missing permission for a child process
sample_dataset = pretraining.sample_dataset  # a fixture: the pretraining tests' small dataset


@pytest.fixture(scope="module")
def finished_run(sample_dataset, tmp_path_factory):
    """4 steps on one rank with its Hugging Face export in hf/."""
    out = tmp_path_factory.mktemp("finetune-disk-errors") / "run"
    assert train.run(tiny_config(sample_dataset, out, 4, **{"checkpoint.export_hf": "true"}), start_one_rank(),
                     resume=False) == 0
    return out


def _glue(child, checkpoint, output, *more):
    return child.run(["-m", "finetune", *sst2_argv(checkpoint, output, *more)])


def test_a_full_output_disk_during_the_export_of_a_checkpoint_is_named(child, finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    shutil.rmtree(run_dir / "hf")  # finetuning exports the newest checkpoint into its --output
    disk = child.full_disk("disk", size="1m")
    line = one_error_line(_glue(child, run_dir, disk / "out"))
    exported = disk / "out" / "exported-run-step_00000004"
    assert line.startswith(f"error: {disk / 'out'}") and ": no space left on device" in line, line
    if child.mounted:  # a real file system of 1 MiB: the config fits, the exported weights do not
        assert line.startswith(f"error: {exported}: no space left on device while exporting the checkpoint to "
                               "finetune; free space on that file system, or pass another --output; "
                               f"{run_dir / 'checkpoints' / 'step_00000004'} is untouched (traceback in "), line
    traceback_file(line)
    assert not exported.exists()
    with_debug(_glue(child, run_dir, disk / "out", "--debug"), line)


def test_weights_this_user_may_not_read_are_named_as_such(child, finished_run, tmp_path):
    hf_dir = tmp_path / "hf"
    shutil.copytree(finished_run / "hf", hf_dir)
    child.unreadable(hf_dir / "model.safetensors")
    line = one_error_line(_glue(child, hf_dir, tmp_path / "out"))
    assert line.startswith(f"error: {hf_dir / 'model.safetensors'}: permission denied while reading the weights; give "
                           "this user read access to it (traceback in "), line
    traceback_file(line)


def test_a_tokenizer_this_user_may_not_read_is_named(child, finished_run, tmp_path):
    hf_dir = tmp_path / "hf"
    shutil.copytree(finished_run / "hf", hf_dir)
    child.unreadable(hf_dir / "tokenizer" / "vocab.txt")
    line = one_error_line(_glue(child, hf_dir, tmp_path / "out"))
    assert line.startswith(f"error: {hf_dir / 'tokenizer' / 'vocab.txt'}: permission denied while reading the "
                           "tokenizer; give this user read access to it"), line


def test_a_truncated_tokenizer_is_named_in_one_line(child, finished_run, tmp_path):
    hf_dir = tmp_path / "hf"
    shutil.copytree(finished_run / "hf", hf_dir)
    truncate(hf_dir / "tokenizer" / "vocab.txt")
    proc = _glue(child, hf_dir, tmp_path / "out")
    line = one_error_line(proc)
    assert line.startswith(f"error: {hf_dir / 'tokenizer' / 'vocab.txt'}: "), line
    assert "the file is truncated or was replaced: copy the tokenizer directory again" in line
    assert "traceback in" not in line
    with_debug(_glue(child, hf_dir, tmp_path / "out", "--debug"), line)
