"""Resuming under a changed config: what the saved state depends on is refused, the rest applied and logged;
a run's vocabulary is never replaced."""
import json

import pytest

from pretrain import config, resume, train
from tests.pretrain.launching import TINY, settings


@pytest.fixture(autouse=True)
def _info_logs(caplog):
    caplog.set_level("INFO", logger="pretrain")


def _cfg(dataset, out, steps, **more):
    return config.load(TINY, [a for a in settings(dataset, out, steps=steps, **more) if a != "--set"])


def test_settings_are_sorted_into_refused_and_applied():
    saved = resume.flatten({"seed": 1, "model": {"preset": "base", "activation_checkpointing": False},
                            "optimizer": {"lr": 1e-4, "name": "adamw", "betas": (0.9, 0.999)},
                            "schedule": {"total_steps": 10}, "data": {"path": "a", "window_batches": 64}})
    now = resume.flatten({"seed": 2, "model": {"preset": "large", "activation_checkpointing": True},
                          "optimizer": {"lr": 5e-5, "name": "adamw", "betas": [0.9, 0.98]},
                          "schedule": {"total_steps": 20}, "data": {"path": "b", "window_batches": 4,
                                                                    "pad_multiple": 64}, "new_key": 3})
    refused, applied = resume.compare(saved, now)
    assert [d.key for d in refused] == ["data.window_batches", "model.preset", "new_key", "seed"]
    assert [d.key for d in applied] == ["data.pad_multiple", "data.path", "model.activation_checkpointing",
                                        "optimizer.betas", "optimizer.lr", "schedule.total_steps"]
    with pytest.raises(resume.ResumeError) as error:
        resume.check(saved, now, "runs/x/checkpoints/step_00000010")
    message = str(error.value)
    assert "\n" not in message and message.startswith("runs/x/checkpoints/step_00000010 cannot continue")
    assert "model.preset: base -> large" in message and "seed: 1 -> 2" in message and "new_key: (not set) -> 3" in message
    assert [str(d) for d in resume.check(saved, {**saved, "optimizer.lr": 2e-4}, "c")] == ["optimizer.lr: 0.0001 -> 0.0002"]


@pytest.mark.parametrize("change, named", [
    ({"model.preset": "base"}, "model.preset: tiny -> base"),
    ({"zero.stage": 0}, "zero.stage: 1 -> 0"),
    ({"train.global_batch_size": 64}, "train.global_batch_size: 32 -> 64"),
    ({"seed": 99}, "seed: 1234 -> 99"),
])
def test_a_change_the_checkpoint_cannot_take_is_refused_in_one_line(one_rank, sample_dataset, tmp_path, change, named):
    out = tmp_path / "run"
    assert train.run(_cfg(sample_dataset, out, 2), one_rank, resume=False) == 0
    before = (out / "config.yaml").read_text()
    with pytest.raises(resume.ResumeError, match=f"step_00000002 cannot continue under this config: .*{named}"):
        train.run(_cfg(sample_dataset, out, 4, **change), one_rank, resume=True)
    assert (out / "config.yaml").read_text() == before  # nothing recorded that was not used


def test_another_dataset_is_refused_on_resume_and_its_vocabulary_never_replaces_the_runs(
        one_rank, sample_dataset, synthetic_dataset, bert_vocab, tmp_path):
    from preprocess.synthetic import SyntheticSpec, write_synthetic

    out = tmp_path / "run"
    assert train.run(_cfg(sample_dataset, out, 2), one_rank, resume=False) == 0
    same_vocabulary = synthetic_dataset(2_000)
    with pytest.raises(resume.ResumeError, match=r"dataset.shards_sha256: \w{12}… -> \w{12}…"):
        train.run(_cfg(same_vocabulary, out, 4), one_rank, resume=True)
    lines = bert_vocab.read_text().splitlines()
    lines[2000], lines[2001] = lines[2001], lines[2000]  # same size and specials, another vocabulary
    (tmp_path / "vocab.txt").write_text("\n".join(lines) + "\n")
    other = tmp_path / "other-vocabulary"
    write_synthetic(SyntheticSpec(rows=2_000), str(tmp_path / "vocab.txt"), other)
    vocabulary = (out / "tokenizer").read_bytes() if (out / "tokenizer").is_file() else None
    for resuming in (True, False):
        with pytest.raises(resume.ResumeError, match=f"{out / 'tokenizer'}: this run's vocabulary .* is not the one "
                                                     f"{other} was made with"):
            train.run(_cfg(other, out, 4), one_rank, resume=resuming)
    assert vocabulary is None and "[unused" in (out / "tokenizer" / "vocab.txt").read_text()
    assert (out / "tokenizer" / "vocab.txt").read_text().splitlines()[2000] == lines[2001]  # still the run's own


def test_a_new_learning_rate_is_applied_from_the_resumed_step_and_logged(one_rank, sample_dataset, tmp_path, caplog):
    from pretrain.schedule import lr_at

    out = tmp_path / "run"
    assert train.run(_cfg(sample_dataset, out, 2), one_rank, resume=False) == 0
    faster = _cfg(sample_dataset, out, 4, **{"optimizer.lr": 3e-3})
    assert train.run(faster, one_rank, resume=True) == 0
    assert "applied from step 2 on: optimizer.lr: 0.001 -> 0.003" in caplog.text
    rates = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert rates[3] == pytest.approx(lr_at(2, 3e-3, faster.schedule))
    assert "lr: 0.003" in (out / "config.yaml").read_text()



def test_a_checkpoint_written_before_later_keys_resumes_under_their_defaults(monkeypatch):
    """A checkpoint that does not record a key added since (``ADDED_LATER``) was written under the value listed
    there: a run from before TinyBERT's loss or SpanBERT's objective resumes under today's defaults."""
    from dataclasses import asdict

    now = resume.flatten(asdict(config.load(TINY)))
    added = [key for key in now if key.startswith("distillation.") and key in resume.ADDED_LATER]
    added.append("objective.span_boundary")
    assert len(added) == 10 and all(now[key] == resume.ADDED_LATER[key] for key in added)
    saved = {key: value for key, value in now.items() if key not in added}
    assert resume.compare(saved, now) == ([], [])
    monkeypatch.delitem(resume.ADDED_LATER, "distillation.loss")  # unlisted, the missing key would be a change
    assert [d.key for d in resume.compare(saved, now)[0]] == ["distillation.loss"]
