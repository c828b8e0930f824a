"""What finetuning starts from when a run's files are damaged: an export killed midway leaves no hf/ (the newest
complete DeepSpeed checkpoint is used), and a truncated weights or DeepSpeed file is refused in one line naming it."""
import shutil

import pytest

from common.errors import CheckpointError
from finetune import cli, pretrained
from models import hf_io
from models.bert import hf as bert_hf
from pretrain import train
from tests.finetune.glue_sample import sst2_argv
from tests.pretrain.conftest import sample_dataset  # noqa: F401  (the pretraining tests' small dataset)
from tests.pretrain.faults import start_one_rank, tiny_config, truncate


@pytest.fixture(scope="module")
def killed_during_export(sample_dataset, tmp_path_factory):
    """A 4-step run (checkpoints at 2 and 4) killed while it wrote its Hugging Face export."""
    out = tmp_path_factory.mktemp("killed-export") / "run"
    real_write = hf_io._write_files  # write_export's writer, into <directory>.partial

    def dying_write(directory, *args):
        (directory / "config.json").write_text("{}")  # the first file is out...
        raise KeyboardInterrupt("killed during the export")  # ...and the job is gone

    hf_io._write_files = dying_write
    try:
        with pytest.raises(KeyboardInterrupt):
            train.run(tiny_config(sample_dataset, out, 4, **{"checkpoint.export_hf": "true"}), start_one_rank(),
                      resume=False)
    finally:
        hf_io._write_files = real_write
    return out


def test_an_export_killed_midway_leaves_no_hf_directory_and_finetuning_uses_the_checkpoint(killed_during_export,
                                                                                             tmp_path):
    run_dir = killed_during_export
    assert not (run_dir / "hf").exists() and (run_dir / "hf.partial" / "config.json").is_file()
    model_dir = pretrained.resolve(run_dir, tmp_path)
    assert model_dir == tmp_path / "exported-run-step_00000004"
    assert hf_io.is_complete(model_dir) and pretrained.load_tokenizer_for(model_dir).vocab_size == 30522


def test_an_incomplete_hf_directory_from_before_atomic_exports_is_passed_over(killed_during_export, tmp_path, caplog):
    run_dir = tmp_path / "run"
    shutil.copytree(killed_during_export, run_dir)
    (run_dir / "hf").mkdir()
    (run_dir / "hf" / "config.json").write_text("{}")  # what a kill left before exports were renamed into place
    model_dir = pretrained.resolve(run_dir, tmp_path / "scratch")
    assert model_dir.name == "exported-run-step_00000004"
    assert f"{run_dir / 'hf'} is incomplete" in caplog.text


def test_a_later_export_replaces_the_directory_whole(killed_during_export, tmp_path):
    model, _ = bert_hf.load_pretrained(pretrained.resolve(killed_during_export, tmp_path))
    target = tmp_path / "hf"
    target.mkdir()
    (target / "stale.txt").write_text("from an older export")
    with pytest.raises(CheckpointError, match="hf: not empty and not an earlier export"):
        bert_hf.export(model, target)  # someone's other files are not swept away
    (target / "config.json").write_text("{}")
    bert_hf.export(model, target)
    assert hf_io.is_complete(target) and not (target / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported-run-step_00000004", "hf"]


def test_a_truncated_model_safetensors_is_named_in_one_line(killed_during_export, tmp_path, capsys):
    hf_dir = tmp_path / "hf"
    shutil.copytree(pretrained.resolve(killed_during_export, tmp_path / "scratch"), hf_dir)
    truncate(hf_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable .*incomplete metadata"):
        pretrained.resolve(hf_dir, tmp_path)
    capsys.readouterr()  # the export's progress bars
    assert cli.main(sst2_argv(hf_dir, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {hf_dir / 'model.safetensors'}: unreadable") and "\n" not in err


def test_a_truncated_deepspeed_file_is_named_in_one_line(killed_during_export, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(killed_during_export, run_dir)
    step_dir = run_dir / "checkpoints" / "step_00000004"
    damaged = next(step_dir.glob("*optim_states.pt"))
    truncate(damaged)
    assert cli.main(sst2_argv(step_dir, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {damaged}: ") and "truncated" in err and "\n" not in err


def test_a_pytorch_model_bin_carrying_code_is_refused_without_running_it(tmp_path, capsys):
    import torch

    from models.bert.model import BertForPreTraining, preset
    from tests.pretrain.faults import Payload

    hf_dir, marker = tmp_path / "hf", tmp_path / "payload-ran"
    model = BertForPreTraining(preset("tiny", vocab_size=300, max_position_embeddings=64))
    bert_hf.export(model, hf_dir)
    (hf_dir / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "innocent_looking_key": Payload(marker)}, hf_dir / "pytorch_model.bin")
    assert cli.main(sst2_argv(hf_dir, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {hf_dir / 'pytorch_model.bin'}: refused to load") and "\n" not in err
    assert not marker.exists()


def test_an_object_store_output_is_refused_in_one_line_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(sst2_argv(tmp_path / "no-such-model", "s3://bucket/reports"))
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--output" in last and "object-store URI" in last
