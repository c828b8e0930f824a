"""bench.pretrain.evaluation: the share arithmetic and the shipped configs it reads (not its timings)."""
import pytest

from bench.pretrain import evaluation as bench


def test_evaluations_count_the_end_of_run_once():
    assert bench.evaluations(100, 25) == 4          # steps 25, 50, 75, 100: the last is the end's
    assert bench.evaluations(100, 30) == 4          # 30, 60, 90 and the end
    assert bench.evaluations(100, 0) == 1           # the end only


def test_share_is_evaluation_time_over_the_run_time():
    # 4 evaluations of 1,000 rows at 1 s a row against 100 steps of 10 rows at 3 s a row.
    value = bench.share(max_steps=100, every_steps=25, max_rows=1000, global_batch_size=10, eval_s_per_row=1.0,
                        train_s_per_row=3.0)
    assert value == pytest.approx(4000 / (4000 + 3000))


def test_every_shipped_config_is_read_with_its_shape_and_evaluation():
    configs = {c["config"]: c for c in bench.shipped()}
    phase2 = configs["bert_large_phase2_seq512.yaml"]
    assert (phase2["preset"], phase2["seq"], phase2["max_rows"], phase2["target"]) == \
        ("large", 512, 10000, {"mlm_accuracy": 0.72})
    assert configs["bert_large_phase1_seq128.yaml"]["seq"] == 128
    assert configs["tiny.yaml"]["seq"] == 128 and configs["tiny.yaml"]["every_steps"] == 20


def test_shares_use_the_costs_of_the_nearest_sequence_length_and_stay_under_two_percent():
    costs = {128: {"shape": "base/seq128", "eval_s_per_row": 0.2, "train_s_per_row": 1.0},
             512: {"shape": "large/seq512", "eval_s_per_row": 5.0, "train_s_per_row": 7.5}}
    shares = {s["config"]: s for s in bench.shares(bench.shipped(), costs)}
    assert shares["bert_large_phase2_seq512.yaml"]["costs_from"] == "large/seq512"
    assert shares["electra_small.yaml"]["costs_from"] == "base/seq128"
    assert shares["tiny.yaml"]["share"] is None      # max_rows unset: the whole split, whatever its size
    assert all(s["share"] < 0.02 for s in shares.values() if s["share"] is not None), shares
