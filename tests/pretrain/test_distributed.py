"""Data-parallel training on 2 CPU processes: ZeRO 0-3 against one process, exact resume, another world size,
and the four launch paths (deepspeed, mpiexec, torchrun, srun)."""
import json
import shutil

import pytest

from tests.pretrain.launching import launch, losses, settings

# One launcher per ZeRO stage, so that every launch path is exercised by a real training run.
LAUNCHERS = {0: "deepspeed", 1: "mpiexec", 2: "torchrun", 3: "srun"}
STEPS, CHECKPOINT_AT = 6, 3


def _ok(result):
    assert result.returncode == 0, result.stdout[-4000:]
    return result


@pytest.fixture(scope="module")
def reference(sample_dataset, tmp_path_factory):
    """One process, the global batch as 2 accumulation steps, no dropout, fp32."""
    out = tmp_path_factory.mktemp("single") / "run"
    _ok(launch("python", 1, settings(sample_dataset, out, steps=STEPS, **{
        "zero.stage": 0, "train.precision": "fp32", "model.hidden_dropout_prob": 0.0,
        "model.attention_probs_dropout_prob": 0.0})))
    return losses(out)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_on_two_ranks_matches_one_process(stage, reference, sample_dataset, tmp_path):
    out = tmp_path / "run"
    result = _ok(launch(LAUNCHERS[stage], 2, settings(sample_dataset, out, steps=STEPS, **{
        "zero.stage": stage, "train.precision": "fp32", "model.hidden_dropout_prob": 0.0,
        "model.attention_probs_dropout_prob": 0.0, "checkpoint.every_steps": CHECKPOINT_AT})))
    assert "on 2 ranks" in result.stdout and "micro-batch 16 x 2 ranks x 1 accumulation" in result.stdout
    got = losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, want in reference.items():
        assert got[step] == pytest.approx(want, rel=1e-5, abs=1e-5), (step, got[step], want)
    assert got[STEPS] < got[1]
    if stage == 2:  # the checkpoint resumes on 1 process (universal checkpoint), from the same sample
        resumed = tmp_path / "one-rank"
        (resumed / "checkpoints").mkdir(parents=True)
        shutil.copytree(out / "checkpoints" / "step_00000003", resumed / "checkpoints" / "step_00000003")
        result = _ok(launch("python", 1, ["--resume", *settings(sample_dataset, resumed, steps=STEPS, **{
            "zero.stage": 2, "train.precision": "fp32", "model.hidden_dropout_prob": 0.0,
            "model.attention_probs_dropout_prob": 0.0})]))
        assert "converting it to a universal checkpoint" in result.stdout
        assert "resumed from" in result.stdout and "at step 3 (96 samples consumed) on 1 ranks" in result.stdout
        timings = json.loads((resumed / "summary.json").read_text())["timings"]
        assert timings["universal_conversion_s"] > 0 and timings["checkpoint_load_s"] > 0
        assert len(json.loads((out / "summary.json").read_text())["timings"]["checkpoint_save_s"]) == 2
        after = losses(resumed)
        for step in range(CHECKPOINT_AT + 1, STEPS + 1):
            assert after[step] == pytest.approx(got[step], rel=1e-5, abs=1e-5), step


# bf16 at two stages, in micro-batches of 2 rows: on a CPU that emulates bf16 each step is still quick.
RESUMED = [(0, "fp32", 32), (1, "bf16", 4), (2, "fp32", 32), (3, "bf16", 4)]  # stage, precision, global batch


@pytest.mark.parametrize("stage, precision, batch", RESUMED)
def test_resume_reproduces_every_later_loss_bitwise(stage, precision, batch, sample_dataset, tmp_path):
    """Dropout on (so the ranks' RNG states must be restored); each precision, each ZeRO stage."""
    common = {"zero.stage": stage, "train.precision": precision, "checkpoint.every_steps": CHECKPOINT_AT,
              "checkpoint.keep_last": 5, "train.global_batch_size": batch, "train.micro_batch_size": batch // 2}
    full, part = tmp_path / "full", tmp_path / "part"
    _ok(launch("torchrun", 2, settings(sample_dataset, full, steps=STEPS, **common)))
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000003", part / "checkpoints" / "step_00000003")
    result = _ok(launch("torchrun", 2, ["--resume", *settings(sample_dataset, part, steps=STEPS, **common)]))
    assert f"at step 3 ({3 * batch} samples consumed) on 2 ranks" in result.stdout
    want, got = losses(full), losses(part)
    assert sorted(got) == list(range(CHECKPOINT_AT + 1, STEPS + 1))
    assert all(got[step] == want[step] for step in got), (got, want)


def test_dynamic_masks_train_alike_on_one_process_and_two_ranks_and_resume_bitwise(synthetic_dataset, tmp_path):
    """RoBERTa's rows (packed, stored unmasked, no pair loss): each rank masks its own rows (keys from seed, epoch,
    row) and the masked count is all-reduced; 2 ranks match the single process's losses and a resumed run repeats
    them bit for bit."""
    dataset = synthetic_dataset(2_000, kind="full_sentences", masking="dynamic", document_tokens=60)
    common = {"objective.masking": "dynamic", "objective.masked_lm_prob": 0.3, "objective.sentence_objective": "none",
              "train.precision": "fp32",
              "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0}
    single = tmp_path / "single"
    _ok(launch("python", 1, settings(dataset, single, steps=STEPS, **{**common, "zero.stage": 0})))
    full, part = tmp_path / "full", tmp_path / "part"
    two_ranks = {**common, "zero.stage": 1, "checkpoint.every_steps": CHECKPOINT_AT, "checkpoint.keep_last": 5}
    result = _ok(launch("torchrun", 2, settings(dataset, full, steps=STEPS, **two_ranks)))
    assert "dynamic token masking of 0.3 of the tokens (at most 39 a row; [MASK] 0.8, random 0.1)" in result.stdout
    want, got = losses(single), losses(full)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert all(got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-5) for step in want), (got, want)
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000003", part / "checkpoints" / "step_00000003")
    _ok(launch("torchrun", 2, ["--resume", *settings(dataset, part, steps=STEPS, **two_ranks)]))
    resumed = losses(part)
    assert sorted(resumed) == list(range(CHECKPOINT_AT + 1, STEPS + 1))
    assert all(resumed[step] == got[step] for step in resumed), (resumed, got)
