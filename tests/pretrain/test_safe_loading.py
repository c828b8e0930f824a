"""Loading a checkpoint never runs code: a pickle carrying a payload is refused by resume, export and finetune,
with one line naming the file, and the payload never runs (its marker file never appears)."""
import pathlib
import re
import shutil

import pytest

from pretrain import checkpoints, engine, train
from pretrain.export import main as export_main
from tests.pretrain.faults import checkpoint_at, plant_payload, republish, start_one_rank, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"
# The file each ZeRO stage's payload goes into: stage 0's model file is what the export read with
# weights_only=False; stage 2's optimizer file is read by DeepSpeed's own loaders and its universal conversion.
PLANTED = {0: "mp_rank_00_model_states.pt", 2: "*zero_pp_rank_0_mp_rank_00_optim_states.pt"}  # bf16_… in bf16


@pytest.fixture(scope="module", params=[0, 2])
def planted(request, sample_dataset, tmp_path_factory):
    """A 4-step run with checkpoints at steps 2 and 4, and a payload in step 4 under a re-written marker."""
    stage = request.param
    rendezvous = start_one_rank()
    out = tmp_path_factory.mktemp(f"payload-zero{stage}") / "run"
    cfg = tiny_config(sample_dataset, out, 4, **{"zero.stage": stage})  # precision auto
    assert train.run(cfg, rendezvous, resume=False) == 0
    newest = checkpoint_at(out, 4)
    marker = out.parent / "payload-ran"
    (file,) = newest.path.glob(PLANTED[stage])
    plant_payload(file, marker)
    republish(newest)  # the checksums match: only the safe loading stands in the way
    return stage, out, file, marker


def _one_line_naming(text: str, file: pathlib.Path) -> None:
    lines = [line for line in text.strip().splitlines() if str(file) in line]
    assert len(lines) == 1 and "refused to load" in lines[0] and "Traceback" not in text, text


def test_export_refuses_the_payload_without_running_it(planted, tmp_path, capsys):
    stage, run_dir, file, marker = planted
    assert export_main([str(run_dir / "checkpoints" / "step_00000004"), str(tmp_path / "hf")]) == 2
    _one_line_naming(capsys.readouterr().err, file)
    assert not marker.exists() and not (tmp_path / "hf").exists()


def test_finetune_refuses_the_payload_without_running_it(planted, tmp_path, capsys):
    from finetune import cli

    stage, run_dir, file, marker = planted
    argv = ["glue", "--checkpoint", str(run_dir / "checkpoints" / "step_00000004"), "--tasks", "sst2",
            "--data", str(SAMPLES), "--config", "configs/finetune/tiny.yaml", "--output", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    _one_line_naming(capsys.readouterr().err, file)
    assert not marker.exists()


def test_resume_refuses_the_payload_and_falls_back_or_fails(planted, sample_dataset, tmp_path, caplog):
    stage, original, planted_file, marker = planted
    run_dir = tmp_path / "run"
    shutil.copytree(original, run_dir)  # the run goes on: keep the module's copy as it is
    file = run_dir / "checkpoints" / "step_00000004" / planted_file.name
    common = {"zero.stage": stage, "checkpoint.keep_last": 5}
    with pytest.raises(checkpoints.CorruptCheckpoint) as refused:
        train.run(tiny_config(sample_dataset, run_dir, 6, **common, **{"checkpoint.on_corrupt": "fail"}),
                  start_one_rank(), resume=True)
    _one_line_naming(str(refused.value), file)
    assert not marker.exists()
    caplog.set_level("INFO", logger="pretrain")
    # The default falls back to step 2 with a warning naming the file; step 4 is then trained again.
    assert train.run(tiny_config(sample_dataset, run_dir, 4, **common), start_one_rank(), resume=True) == 0
    warning = next(r.getMessage() for r in caplog.records if str(file) in r.getMessage())
    assert "refused to load" in warning and "falling back to step_00000002" in warning
    assert "resumed from" in caplog.text and "at step 2 (64 samples consumed)" in caplog.text
    assert not marker.exists()


def test_deepspeeds_own_loads_are_weights_only_even_past_the_scan(planted, monkeypatch):
    """The scan names the file; the guarantee is the forced weights-only loading around DeepSpeed's calls."""
    stage, run_dir, file, marker = planted
    monkeypatch.setattr(engine, "refuse_unsafe", lambda path: None)
    with pytest.raises(checkpoints.CorruptCheckpoint, match="refused to load"):
        engine.consolidate_checkpoint(run_dir / "checkpoints", "step_00000004", stage, run_dir.parent / "scratch")
    assert not marker.exists()


def test_every_torch_load_in_the_project_is_weights_only():
    calls = []
    for package in ("pretrain", "finetune", "preprocess", "cluster"):
        for path in (REPO / package).rglob("*.py"):
            source = path.read_text()
            for match in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", source):
                calls.append((path.relative_to(REPO), match.group(0)))
    assert calls, "no torch.load found: the pattern is wrong"
    unsafe = [(str(path), call) for path, call in calls if "weights_only=True" not in call]
    assert not unsafe, unsafe




def test_the_payload_would_run_if_loaded_unsafely(tmp_path):
    """The control: the payload does create its marker when unpickled the unsafe way."""
    import torch

    from tests.pretrain.faults import Payload

    marker = tmp_path / "control-ran"
    torch.save({"weights": torch.zeros(2), "innocent_looking_key": Payload(marker)}, tmp_path / "file.pt")
    torch.load(tmp_path / "file.pt", weights_only=False)
    assert marker.exists()


def test_two_ranks_refuse_a_payload_in_rank_1s_file_as_a_job(sample_dataset, tmp_path):
    """As users resume: torchrun, 2 ranks, ZeRO 1; rank 0 scans every rank's files and all ranks stop."""
    from tests.pretrain.launching import launch, settings

    out, marker = tmp_path / "run", tmp_path / "payload-ran"
    common = {"checkpoint.every_steps": 2, "checkpoint.keep_last": 5, "checkpoint.on_corrupt": "fail"}
    result = launch("torchrun", 2, settings(sample_dataset, out, steps=2, **common))
    assert result.returncode == 0, result.stdout[-3000:]
    newest = checkpoint_at(out, 2)
    (planted_file,) = newest.path.glob("*zero_pp_rank_1_mp_rank_00_optim_states.pt")
    plant_payload(planted_file, marker)
    republish(newest)
    refused = launch("torchrun", 2, ["--resume", *settings(sample_dataset, out, steps=4, **common)])
    assert refused.returncode != 0 and not marker.exists()
    assert f"error (rank 0): {planted_file}: refused to load" in refused.stdout, refused.stdout[-3000:]
    assert f'File "{REPO / "pretrain"}' not in refused.stdout  # torchrun reports the exit, with its own traceback
