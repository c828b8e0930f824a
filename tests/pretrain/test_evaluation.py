"""Evaluation on the held-out split (pretrain.evaluation): the figures by hand, training untouched by it, the same
figures on 1 and 2 ranks and any train micro-batch, resume right after an evaluation, the target ending a run,
keep_best, ``python -m pretrain.evaluate`` against the in-run figures, and each refusal before the first step."""
import json
import math
import shutil

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from pretrain import checkpoints, config, evaluation, train
from pretrain import evaluate as evaluate_cli
from pretrain import export as export_cli
from pretrain.evaluation import lower_is_better, meets
from pretrain.families.electra_loss import roc_auc
from tests.pretrain.launching import TINY, launch, losses, settings

# A few quick steps (ZeRO 0: quick saves and loads); the split's 16 first rows in 2 evaluation micro-batches.
QUICK = {"train.global_batch_size": 8, "train.micro_batch_size": 8, "train.precision": "fp32", "zero.stage": 0,
         "eval.max_rows": 16, "eval.batch_size": 8, "checkpoint.every_steps": 0}


@pytest.fixture(autouse=True)
def _info_logs(caplog):
    caplog.set_level("INFO", logger="pretrain")


def _cfg(dataset, out, steps, **more):
    return config.load(TINY, [a for a in settings(dataset, out, steps=steps, **{**QUICK, **more}) if a != "--set"])


def _records(out, prefix="eval/"):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if any(k.startswith(prefix) for k in r)]


def test_roc_auc_is_sklearns_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    values = rng.integers(0, 6, 200) / 5.0  # many ties
    labels = (rng.random(200) < 0.3).astype(float)
    assert roc_auc(np.stack([values, labels], 1)) == pytest.approx(roc_auc_score(labels, values), abs=1e-12)
    assert math.isnan(roc_auc(np.array([[0.5, 1.0]])))


def test_evaluation_summary_of_every_family_by_hand(tmp_path):
    from pretrain.families.albert import AlbertFamily
    from pretrain.families.bert import BertFamily
    from pretrain.families.deberta_v2 import DebertaFamily
    from pretrain.families.electra import ElectraFamily
    from pretrain.families.spanbert import SpanBertFamily

    # masked-LM loss 2.0 a token over 10 masked tokens, 7 right; the pair head 3 of 4 right.
    bert_stats = [20.0, 7, 10, 2.0, 3, 4, 4, 100, 0]
    for family in (BertFamily(config.ModelConfig(preset="tiny"), "nsp"),
                   AlbertFamily(config.ModelConfig(family="albert", preset="albert_tiny"), "sop", tmp_path)):
        figures = family.evaluation_summary(torch.tensor(bert_stats, dtype=torch.float64))
        head = family.sentence_objective
        assert figures["mlm_accuracy"] == 0.7 and figures[f"{head}_accuracy"] == 0.75
        assert figures["mlm_perplexity"] == pytest.approx(math.exp(2.0), rel=1e-12)
        assert set(family.evaluation_metrics()) == set(figures)
    # SpanBERT: 6 of the 10 masked tokens have boundary targets, with loss 3.0 each and 3 right.
    span = SpanBertFamily(config.ModelConfig(preset="tiny"), config.ObjectiveConfig(sentence_objective="none"),
                          "unused", 0)
    figures = span.evaluation_summary(torch.tensor(bert_stats + [18.0, 3, 6], dtype=torch.float64))
    assert figures["sbo_loss"] == 3.0 and figures["sbo_accuracy"] == 0.5 and "sbo_loss" in span.evaluation_metrics()
    # ELECTRA and DeBERTa-v3: generator accuracy, discriminator accuracy and AUC (a perfect ranking here).
    electra_stats = torch.tensor([20.0, 7, 10, 5.0, 90, 100, 10, 8, 4, 100, 0], dtype=torch.float64)
    scores = np.array([[0.9, 1.0], [0.2, 0.0], [0.8, 1.0], [0.1, 0.0]])
    for family in (ElectraFamily(config.ModelConfig(family="electra", preset="electra_tiny"),
                                 config.ElectraTrainingConfig(), 0),
                   DebertaFamily(config.ModelConfig(family="deberta-v2", preset="deberta_v3_tiny"),
                                 config.ElectraTrainingConfig(), 0, "none")):
        figures = family.evaluation_summary(electra_stats, scores)
        assert (figures["mlm_accuracy"], figures["disc_accuracy"], figures["disc_auc"]) == (0.7, 0.9, 1.0)
        assert {"disc_accuracy", "disc_auc", "mlm_perplexity"} <= set(family.evaluation_metrics())
    assert lower_is_better("mlm_perplexity") and lower_is_better("loss") and not lower_is_better("disc_auc")
    assert meets("mlm_accuracy", 0.72, 0.72) and not meets("mlm_loss", 2.1, 2.0)


def test_evaluation_leaves_training_bitwise_unchanged_and_resume_after_it_continues(one_rank, split_dataset,
                                                                                    tmp_path, monkeypatch):
    off, on, resumed = tmp_path / "off", tmp_path / "on", tmp_path / "resumed"
    every = {"eval.every_steps": 2, "checkpoint.every_steps": 2}
    assert train.run(_cfg(split_dataset, on, 4, **every), one_rank, resume=False) == 0
    with monkeypatch.context() as patched:  # the same dataset read as if it had no split: evaluation off
        patched.setattr(evaluation, "open_evaluation", lambda *args, **kwargs: None)
        assert train.run(_cfg(split_dataset, off, 4, **{"eval.every_steps": 2}), one_rank,
                         resume=False) == 0  # max_rows and every_steps on a dataset without a split
    assert losses(on) == losses(off) and len(losses(on)) == 4
    assert [r["step"] for r in _records(on)] == [2, 4] and _records(off) == []
    assert "evaluation" not in json.loads((off / "summary.json").read_text())
    # Resume from the checkpoint of step 2, taken right after its evaluation: the same losses and figures after.
    shutil.copytree(on, resumed)
    shutil.rmtree(resumed / "checkpoints" / checkpoints.tag_for(4))
    assert train.run(_cfg(split_dataset, resumed, 4, **every), one_rank, resume=True) == 0
    # The copied records past step 2 were dropped on resume: those of steps 3 and 4 are the resumed run's.
    lines = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4]
    assert losses(resumed) == losses(on)
    figures = lambda out: {r["step"]: {k: v for k, v in r.items() if k != "eval/seconds"}  # noqa: E731
                           for r in _records(out)}
    assert figures(resumed) == figures(on)
    summary = json.loads((on / "summary.json").read_text())
    assert summary["evaluation"]["last"]["step"] == 4 and 0 <= summary["evaluation"]["last"]["mlm_accuracy"] <= 1
    assert math.isclose(summary["evaluation"]["last"]["mlm_perplexity"],
                        math.exp(summary["evaluation"]["last"]["mlm_loss"]))


def test_the_target_ends_the_run_with_a_checkpoint_the_export_and_the_time_to_it(one_rank, split_dataset, tmp_path,
                                                                                caplog):
    out = tmp_path / "run"
    cfg = _cfg(split_dataset, out, 6, **{"eval.every_steps": 1, "eval.target": "{mlm_loss: 100.0}",
                                         "checkpoint.export_hf": "true"})
    assert train.run(cfg, one_rank, resume=False) == 0
    summary = json.loads((out / "summary.json").read_text())
    target = summary["target"]
    assert target["reached"] and target["step"] == 1 and target["samples"] == 8 and target["tokens"] > 0
    assert target["wall_seconds_from_first_step"] > 0 and summary["step"] == 1
    assert checkpoints.newest(out / "checkpoints").step == 1 and checkpoints.finished_export(out)
    # Never reached: the run's last line says so.
    caplog.clear()
    cfg = _cfg(split_dataset, tmp_path / "never", 2, **{"eval.target": "{mlm_accuracy: 0.999}"})
    assert train.run(cfg, one_rank, resume=False) == 0
    assert "target not reached: mlm_accuracy" in caplog.records[-1].getMessage()
    assert json.loads((tmp_path / "never" / "summary.json").read_text())["target"]["reached"] is False


def test_keep_best_keeps_the_best_checkpoint_and_the_cli_scores_it_as_the_run_did(one_rank, split_dataset,
                                                                                   tmp_path, capsys):
    out = tmp_path / "run"
    # keep_last 1, so the best checkpoint survives only through keep_best; NSP accuracy barely moves in 3 steps,
    # so the best (the first of equals) is an early one.
    cfg = _cfg(split_dataset, out, 3, **{"eval.every_steps": 1, "checkpoint.keep_best": "nsp_accuracy",
                                         "checkpoint.keep_last": 1, })
    assert train.run(cfg, one_rank, resume=False) == 0
    evals = {r["step"]: r["eval/nsp_accuracy"] for r in _records(out)}
    best_step = max(sorted(evals), key=lambda s: (evals[s], -s))
    kept = {c.step for c in checkpoints.complete(out / "checkpoints")}
    assert kept == {3, best_step} and best_step < 3, evals
    assert checkpoints.best(out / "checkpoints", "nsp_accuracy").step == best_step
    assert json.loads((out / "summary.json").read_text())["evaluation"]["best"]["step"] == best_step
    # The CLI on the run's last checkpoint: the in-run final evaluation, to 1e-6.
    report = tmp_path / "scores.json"
    assert evaluate_cli.main(["--model", str(out), "--data", str(split_dataset), "--max-rows", "16",
                              "--batch-size", "8", "--output", str(report)]) == 0
    scored, in_run = json.loads(report.read_text())["figures"], _records(out)[-1]
    for name, value in scored.items():
        assert value == pytest.approx(in_run[f"eval/{name}"], abs=1e-6), name
    assert "mlm_accuracy" in capsys.readouterr().out
    # The best checkpoint's export, scored as a Hugging Face directory: that step's in-run figures.
    assert export_cli.main([str(out), str(tmp_path / "best"), "--best"]) == 0
    assert evaluate_cli.main(["--model", str(tmp_path / "best"), "--data", str(split_dataset), "--max-rows", "16",
                              "--batch-size", "8", "--output", str(report)]) == 0
    scored, in_run = json.loads(report.read_text())["figures"], {r["step"]: r for r in _records(out)}[best_step]
    for name, value in scored.items():
        assert value == pytest.approx(in_run[f"eval/{name}"], abs=1e-6), name


def test_refusals_before_the_first_step(one_rank, split_dataset, sample_dataset, tmp_path):
    cases = [({"eval.max_rows": 10 ** 6}, "eval.max_rows is 1000000"),
             ({"eval.target": "{disc_auc: 0.9}"}, "eval.target names disc_auc"),
             ({"checkpoint.keep_best": "nonsense"}, "checkpoint.keep_best names nonsense"),
             ({"eval.data": str(sample_dataset)}, "needs an evaluation split, but .*pretrain-data")]
    for change, message in cases:
        with pytest.raises(ConfigError, match=message):
            train.run(_cfg(split_dataset, tmp_path / "refused", 1, **change), one_rank, resume=False)
        assert not (tmp_path / "refused" / "checkpoints").exists()
    with pytest.raises(ValueError, match="eval.every_steps is -1"):
        _cfg(split_dataset, tmp_path / "x", 1, **{"eval.every_steps": -1})


def test_without_a_split_the_sizing_keys_turn_evaluation_off_and_the_rest_is_refused(sample_dataset, tmp_path):
    """A shipped config (every_steps, max_rows) on a dataset made before the split: evaluation off, logged once by
    ``open_evaluation``; a target or keep_best, which cannot mean anything without one, still refused."""
    from common.manifest import Manifest
    from pretrain import data, families

    manifest = Manifest.read(sample_dataset)
    cfg = _cfg(sample_dataset, tmp_path / "x", 1, **{"eval.every_steps": 5, "eval.max_rows": 10000})
    family = families.for_config(cfg)
    assert evaluation.open_split(cfg.eval, cfg.checkpoint, family, manifest, data_path=str(sample_dataset)) is None
    assert str(sample_dataset) in data._SAID_NO_EVALUATION
    for change, key in (({"eval.target": "{mlm_accuracy: 0.72}"}, "eval.target"),
                        ({"checkpoint.keep_best": "mlm_accuracy"}, "checkpoint.keep_best")):
        cfg = _cfg(sample_dataset, tmp_path / "x", 1, **change)
        with pytest.raises(ConfigError, match=f"{key} needs an evaluation split"):
            evaluation.open_split(cfg.eval, cfg.checkpoint, family, manifest, data_path=str(sample_dataset))


def test_a_split_of_another_tokenizer_sequence_length_or_recipe_is_refused(one_rank, split_dataset, tmp_path):
    for field, value, named in (("max_seq_length", 64, "sequence length 64 against 128"),
                                ("vocab_sha256", "b" * 64, "another tokenizer"),
                                ("sentence_objective", "sop", "objective sentence_objective sop against nsp")):
        other = tmp_path / field
        shutil.copytree(split_dataset, other)
        manifest = json.loads((other / "manifest.json").read_text())
        where = {"vocab_sha256": manifest["tokenizer"], "sentence_objective": manifest.get("objective", {})}
        where.get(field, manifest)[field] = value
        (other / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ConfigError, match=f"eval.data: the evaluation split of .* {named}"):
            train.run(_cfg(split_dataset, tmp_path / "refused", 1, **{"eval.data": str(other)}), one_rank,
                      resume=False)


def test_the_figures_are_the_same_on_two_ranks_any_micro_batch_and_zero_stage(one_rank, split_dataset, tmp_path):
    """lr 1e-30 (below every weight's ulp) keeps the weights the seeded initial ones on both world sizes, so the
    figures must match bitwise: 1 rank, micro-batch 8, ZeRO 1 against 2 ranks, micro-batch 2 (2 accumulation steps),
    ZeRO 2, with the split's 3 evaluation micro-batches 2 and 1 (and a dummy forward) over the ranks."""
    same = {"optimizer.lr": 1e-30, "eval.max_rows": 24}
    assert train.run(_cfg(split_dataset, tmp_path / "one", 1, **same, **{"zero.stage": 1}), one_rank,
                     resume=False) == 0
    args = settings(split_dataset, tmp_path / "two", steps=1,
                    **{**QUICK, **same, "train.micro_batch_size": 2, "zero.stage": 2})
    result = launch("torchrun", 2, args)
    assert result.returncode == 0, result.stdout[-3000:]
    one, two = (_records(tmp_path / name)[-1] for name in ("one", "two"))
    assert {k: v for k, v in one.items() if k != "eval/seconds"} == {k: v for k, v in two.items()
                                                                     if k != "eval/seconds"}
