"""Checkpoint integrity: the COMPLETE marker lists each file's size and sha256; a missing, truncated or altered
file is refused with one line naming it, and resume falls back to the previous checkpoint (or fails, when
checkpoint.on_corrupt says so). Also: weights holding NaN never get checkpointed, exported or exit 0."""
import json
import shutil

import pytest

from common.configlib import ConfigError
from pretrain import checkpoints, config, train
from pretrain.export import main as export_main
from tests.pretrain.faults import alter, checkpoint_at, republish, start_one_rank, summary, tiny_config, truncate
from tests.pretrain.launching import REPO, TINY, launch, settings

MODEL_FILE = "mp_rank_00_model_states.pt"


def _fake_checkpoint(directory, step, files):
    path = directory / checkpoints.tag_for(step)
    path.mkdir(parents=True)
    for name, content in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(content)
    checkpoints.publish(directory, path.name, {"step": step, "world_size": 1, "zero_stage": 0})
    return next(c for c in checkpoints.complete(directory) if c.step == step)


def test_the_marker_lists_every_file_with_its_size_and_sha256(tmp_path):
    import hashlib

    found = _fake_checkpoint(tmp_path, 2, {"a.pt": b"abc", "zero/x/fp32.pt": b"x" * 10})
    files = json.loads((found.path / checkpoints.MARKER).read_text())["files"]
    assert files == {"a.pt": {"bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()},
                     "zero/x/fp32.pt": {"bytes": 10, "sha256": hashlib.sha256(b"x" * 10).hexdigest()}}
    assert checkpoints.verify(found) == 2


@pytest.mark.parametrize("fault, words", [
    (lambda f: f.unlink(), "missing, though COMPLETE lists it (1,000 bytes)"),
    (truncate, "500 bytes where COMPLETE recorded 1,000 (truncated or overwritten)"),
    (alter, "its sha256 differs from the one COMPLETE recorded (the file was altered after the save)"),
])
def test_a_missing_truncated_or_altered_file_is_named_in_one_line(tmp_path, fault, words):
    found = _fake_checkpoint(tmp_path, 2, {"model.pt": b"\0" * 1000, "other.pt": b"1"})
    fault(found.path / "model.pt")
    with pytest.raises(checkpoints.CorruptCheckpoint) as refused:
        checkpoints.verify(found)
    message = str(refused.value)
    assert message.startswith(f"{found.path / 'model.pt'}: {words}") and "\n" not in message
    assert f"remove {found.path} to use an earlier checkpoint" in message


def test_the_newest_intact_checkpoint_falls_back_with_a_warning_or_fails(tmp_path):
    _fake_checkpoint(tmp_path, 2, {"model.pt": b"old"})
    newest = _fake_checkpoint(tmp_path, 4, {"model.pt": b"new"})
    (newest.path / "model.pt").write_bytes(b"NEW")
    warnings = []
    assert checkpoints.newest_intact(tmp_path, "fallback", warn=warnings.append).step == 2
    assert len(warnings) == 1 and warnings[0].startswith(f"{newest.path / 'model.pt'}: its sha256 differs")
    assert warnings[0].endswith("falling back to step_00000002")
    with pytest.raises(checkpoints.CorruptCheckpoint, match="model.pt: its sha256 differs"):
        checkpoints.newest_intact(tmp_path, "fail")
    assert checkpoints.newest_intact(tmp_path / "none") is None


def test_a_marker_from_before_checksums_is_trusted_as_it_is(tmp_path):
    found = _fake_checkpoint(tmp_path, 2, {"model.pt": b"abc"})
    (found.path / checkpoints.MARKER).write_text(json.dumps({"step": 2, "world_size": 1, "zero_stage": 0}))
    assert checkpoints.verify(checkpoints.newest(tmp_path)) == 0


def test_on_corrupt_is_a_checked_config_key(tmp_path):
    assert config.load(TINY).checkpoint.on_corrupt == "fallback"
    with pytest.raises(ConfigError, match="on_corrupt must be fallback or fail"):
        config.load(TINY, ["checkpoint.on_corrupt=ignore"])


@pytest.fixture(scope="module")
def finished_run(sample_dataset, tmp_path_factory):
    """4 steps on one rank, ZeRO 1, precision auto, checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("integrity") / "run"
    assert train.run(tiny_config(sample_dataset, out, 4), start_one_rank(), resume=False) == 0
    return out


@pytest.mark.parametrize("fault", [truncate, alter])
def test_resume_falls_back_past_a_damaged_model_file_and_trains_on(fault, finished_run, sample_dataset, tmp_path,
                                                                   caplog):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    damaged = run_dir / "checkpoints" / "step_00000004" / MODEL_FILE
    fault(damaged)
    caplog.set_level("INFO", logger="pretrain")
    assert train.run(tiny_config(sample_dataset, run_dir, 6), start_one_rank(), resume=True) == 0
    warning = next(r for r in caplog.records if str(damaged) in r.getMessage())
    assert warning.levelname == "WARNING" and warning.getMessage().endswith("falling back to step_00000002")
    assert "at step 2 (64 samples consumed)" in caplog.text
    assert summary(run_dir)["status"] == "done"
    assert checkpoints.verify(checkpoint_at(run_dir, 6)) > 0


def test_resume_with_on_corrupt_fail_refuses_naming_the_file(finished_run, sample_dataset, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    damaged = run_dir / "checkpoints" / "step_00000004" / MODEL_FILE
    truncate(damaged)
    cfg = tiny_config(sample_dataset, run_dir, 6, **{"checkpoint.on_corrupt": "fail"})
    with pytest.raises(checkpoints.CorruptCheckpoint) as refused:
        train.run(cfg, start_one_rank(), resume=True)
    assert str(refused.value).startswith(f"{damaged}: ") and "truncated" in str(refused.value)


def test_export_refuses_a_damaged_checkpoint_naming_the_file(finished_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    damaged = run_dir / "checkpoints" / "step_00000004" / MODEL_FILE
    alter(damaged)
    assert export_main([str(damaged.parent), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {damaged}: its sha256 differs") and "\n" not in err
    assert not (tmp_path / "hf").exists()


def test_nan_weights_from_an_altered_optimizer_file_never_exit_0_or_export(finished_run, sample_dataset, tmp_path,
                                                                           caplog, capsys):
    """The fault from the issue: NaN in the optimizer's fp32 masters, under a marker that vouches for them
    (re-written, as by a checkpoint from before markers listed checksums)."""
    import torch

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    newest = checkpoint_at(run_dir, 4)
    (optim_file,) = newest.path.glob("*optim_states.pt")
    saved = torch.load(optim_file, weights_only=False)
    masters = saved["optimizer_state_dict"]["single_partition_of_fp32_groups"]
    with torch.no_grad():
        masters[0][:1000] = float("nan")
    torch.save(saved, optim_file)
    republish(newest)
    caplog.set_level("INFO", logger="pretrain")
    for export_hf in ("false", "true"):  # without an export to refuse, the run still does not end "done"
        cfg = tiny_config(sample_dataset, run_dir, 6, **{"checkpoint.export_hf": export_hf})
        assert train.run(cfg, start_one_rank(), resume=True) == train.DIVERGED
    # Step 5 trains on, step 6 is skipped as non-finite (so not checkpointed); the final check stops the run.
    assert "step 6: non-finite loss or gradient; step skipped" in caplog.text
    assert f"the final weights hold NaN or inf: the run is not done and {run_dir / 'hf'} is not exported" in caplog.text
    assert summary(run_dir)["status"] == "diverged"
    assert not (run_dir / "hf").exists() and checkpoints.newest(run_dir / "checkpoints").step == 4
    # Nor does the offline export write them out.
    assert export_main([str(newest.path), str(tmp_path / "hf")]) == 2
    assert "weight tensors hold NaN or inf" in capsys.readouterr().err and not (tmp_path / "hf").exists()


def test_weights_that_turn_non_finite_are_not_checkpointed(sample_dataset, tmp_path, monkeypatch, caplog):
    """NaN in the weights after a step that was applied: the save refuses, the run diverges, nothing exported."""
    import torch

    from pretrain import engine

    real_step, calls = engine.train_micro_batch, []

    def poisoning_step(eng, batch):
        stats = real_step(eng, batch)
        calls.append(1)
        if len(calls) == 8:  # the last step's optimizer step (2 micro-batches a step on one rank) is done
            with torch.no_grad():
                eng.optimizer.single_partition_of_fp32_groups[0][:10] = float("nan")  # ZeRO 1's fp32 masters
        return stats

    monkeypatch.setattr(engine, "train_micro_batch", poisoning_step)
    caplog.set_level("INFO", logger="pretrain")
    run_dir = tmp_path / "run"
    cfg = tiny_config(sample_dataset, run_dir, 4, **{"checkpoint.export_hf": "true", "train.precision": "fp32"})
    assert train.run(cfg, start_one_rank(), resume=False) == train.DIVERGED
    assert "step 4: the weights hold NaN or inf; not saving step_00000004 (nor exporting)" in caplog.text
    assert checkpoints.newest(run_dir / "checkpoints").step == 2 and not (run_dir / "hf").exists()
    assert summary(run_dir)["status"] == "diverged"


def test_two_ranks_resume_past_a_truncated_file_of_rank_1_or_refuse_it(sample_dataset, tmp_path):
    """Rank 0 checks every rank's files and tells the others which checkpoint to load."""
    out = tmp_path / "run"
    common = {"checkpoint.every_steps": 2, "checkpoint.keep_last": 5}
    result = launch("torchrun", 2, settings(sample_dataset, out, steps=4, **common))
    assert result.returncode == 0, result.stdout[-3000:]
    (damaged,) = (out / "checkpoints" / "step_00000004").glob("*zero_pp_rank_1_mp_rank_00_optim_states.pt")
    truncate(damaged)
    refused = launch("torchrun", 2, ["--resume", *settings(sample_dataset, out, steps=6, **common,
                                                             **{"checkpoint.on_corrupt": "fail"})])
    assert refused.returncode != 0
    assert f"error (rank 0): {damaged}: " in refused.stdout, refused.stdout[-3000:]
    assert f'File "{REPO / "pretrain"}' not in refused.stdout  # torchrun reports the exit, with its own traceback
    resumed = launch("torchrun", 2, ["--resume", *settings(sample_dataset, out, steps=6, **common)])
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"{damaged}: " in resumed.stdout and "falling back to step_00000002" in resumed.stdout
    assert "at step 2 (64 samples consumed) on 2 ranks" in resumed.stdout
