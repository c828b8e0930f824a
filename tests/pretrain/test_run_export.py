"""A pretraining run directory names its Hugging Face export (``hf/``) to every reader the same way: continuing
pretraining from it, planning its memory, and finetuning from it; an export cut short is passed over by all."""
import pytest

from finetune import pretrained
from models.bert.hf import export
from models.bert.model import BertForPreTraining, preset
from pretrain import config, memory, train
from pretrain.checkpoints import export_directory, finished_export
from tests.pretrain.launching import TINY


def _run_directory(tmp_path):
    run = tmp_path / "run"
    small = preset("tiny", vocab_size=64, num_hidden_layers=1, max_position_embeddings=32)
    export(BertForPreTraining(small), export_directory(run))
    return run, small


def test_every_reader_takes_a_run_directorys_finished_export(tmp_path):
    run, small = _run_directory(tmp_path)
    assert finished_export(run) == run / "hf"
    cfg = config.load(TINY, [f"model.init_from={run}"])
    assert train._init_directory(cfg.model.init_from) == run / "hf"
    assert memory.planned_model_config(cfg.model, 30522) == small  # the export's, not the preset
    assert pretrained.resolve(run, tmp_path / "scratch") == run / "hf"


def test_an_export_without_its_weights_is_passed_over_by_every_reader(tmp_path, caplog):
    run, _ = _run_directory(tmp_path)
    (run / "hf" / "model.safetensors").unlink()  # as an export from before exports were atomic, cut short
    assert finished_export(run) is None
    cfg = config.load(TINY, [f"model.init_from={run}"])
    assert train._init_directory(cfg.model.init_from) == run
    assert memory.planned_model_config(cfg.model, 30522).num_hidden_layers == 2  # the preset's
    with pytest.raises(pretrained.CheckpointError):  # finetuning falls back to a checkpoint: there is none here
        pretrained.resolve(run, tmp_path / "scratch")
    assert f"{run / 'hf'} is incomplete" in caplog.text
