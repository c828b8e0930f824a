"""bench.pretrain.objectives: every recipe is a valid configuration, the probe set is held out, and the table reads the
finetuning report as the finetuning stage writes it."""
from pathlib import Path

import pytest

from bench.pretrain import objectives, objectives_probe
from common.preprocess_config import InstanceConfig
from finetune import report
from pretrain import config as pretrain_config


@pytest.mark.parametrize("name", sorted(objectives.RECIPES))
def test_each_recipe_is_a_valid_preprocessing_and_pretraining_config(name):
    data_switches, train_switches = objectives.RECIPES[name]
    instances = InstanceConfig(**data_switches)
    settings = {**objectives.TRAINING, **train_switches}
    cfg = pretrain_config.load(objectives.PRETRAIN_CONFIG, [f"{k}={v}" for k, v in settings.items()])
    assert (cfg.objective.masking, cfg.objective.sentence_objective) == (instances.masking, instances.sentence_objective)


def test_the_probe_books_are_not_trained_on(tmp_path):
    (tmp_path / "books").mkdir()
    (tmp_path / "wikipedia").mkdir()
    (tmp_path / "wikipedia" / "dump.xml.bz2").write_bytes(b"")
    for name in ("a", "b", "c", "d"):
        (tmp_path / "books" / f"{name}.txt").write_text(name)
    dumps, books, held_out = objectives.split_inputs(tmp_path, quick=False)
    assert [Path(p).name for p in held_out] == ["c.txt", "d.txt"]
    assert not set(books) & set(held_out) and len(dumps) == 1


def _result(task: str, metric: str, values: list[float]) -> dict:
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return {"task": task, "benchmark": "glue", "seeds": list(range(len(values))), "mean": {metric: mean},
            "std": {metric: std}, "runs": [{"seed": i, "metrics": {metric: v}} for i, v in enumerate(values)]}


def test_scores_and_table_read_a_finetuning_report():
    built = report.build([_result("sst2", "accuracy", [0.8, 0.9]), _result("mrpc", "f1", [0.7, 0.8])],
                         checkpoint="x", seconds=1.0, seeds=[1, 2], config={})
    found = objectives.scores(built)
    assert found["sst2"]["accuracy"] == {"mean": 0.85, "std": 0.05, "per_seed": [0.8, 0.9]}
    assert found["mrpc"]["f1"]["per_seed"] == [0.7, 0.8]
    rows = {"floor": {"pretraining": None, "probe": {"accuracy": 0.0, "mlm_loss": 10.3}, "glue": found}}
    table = objectives_probe.table(rows)
    assert "| floor | – | – | 0.000 | 10.30 | 75.0 ± 5.0 | 85.0 ± 5.0 |" in table
