"""bench.preprocess.report: the figures made from the runs (medians over quiet runs, paired ratios, checks)."""
from bench.preprocess import report as preprocess_report

SHA = ["a" * 64]


def _run(cpu: float, wall: float, contended: bool = False, sha=SHA) -> dict:
    return {"cpu_s": cpu, "wall_s": wall, "contended": contended, "peak_tree_rss_bytes": 1000, "corpus_tokens": 500,
            "shard_sha256": sha, "cpu_accounting_check": "ok"}


def _irr(cpu: float, contended: bool = False) -> dict:
    return {"cpu_s": cpu, "work_cpu_s": cpu - 1, "contended": contended, "corpus_tokens": 500}


def test_contended_runs_are_left_out_of_medians_and_ratios():
    runs = {"workers_1": [_run(10, 10), _run(30, 40, contended=True), _run(12, 11)],
            "workers_2": [_run(11, 6), _run(11, 6), _run(11, 6)]}
    irr_runs = [_irr(5), _irr(5), _irr(6)]
    e2e = preprocess_report.end_to_end(runs, irr_runs, input_bytes=100, startup={"driver_import_cpu_s": 0.5})
    one = e2e["workers_1"]
    assert (one["cpu_s"], one["wall_s"]) == (11, 10.5)
    assert one["cpu_ratio_vs_irreducible_runs"] == [2.0, 2.0]   # each run against the irreducible run beside it
    assert one["medians_over"] == "2 uncontended run(s)"
    assert one["startup_share_of_cpu"] == round(0.5 / 11, 4) and one["peak_rss_per_input_byte"] == 10.0
    assert e2e["workers_2"]["cpu_ratio_vs_irreducible_runs"] == [2.2, 2.2, round(11 / 6, 3)]


def test_checks_fail_on_different_shards_or_a_budget_not_kept():
    runs = {"workers_1": [_run(10, 10)], "workers_2": [_run(10, 5, sha=["b" * 64])]}
    irr_runs = [_irr(5, contended=True)]
    found = preprocess_report.checks(runs, {"corpus_tokens": 500}, irr_runs, None, None)
    assert found["shards_identical_1_vs_2_workers"] is False and not preprocess_report.all_pass(found)
    assert found["contended_runs"] == ["irreducible #1"]
    runs["workers_2"] = [_run(10, 5)]
    budget = {"quarter": {"under_budget": False, "shards_identical": False}}
    found = preprocess_report.checks(runs, {"corpus_tokens": 500}, irr_runs, budget, {"shards_identical": True})
    assert found["budget_quarter_under_budget"] is False and "budget_smallest_accepted_under_budget" not in found
    assert not preprocess_report.all_pass(found)
    del found["budget_quarter_under_budget"], found["budget_quarter_shards_identical"]
    assert preprocess_report.all_pass(found)   # contended runs are flagged, not failed


def test_targets_leave_the_startup_share_out_of_a_quick_run():
    e2e = {mode: {"cpu_ratio_vs_irreducible": 1.2, "startup_share_of_cpu": 0.2} for mode in ("workers_1", "workers_2")}
    full = preprocess_report.targets(e2e, speedup=1.7, quick=False)
    assert {name: t["pass"] for name, t in full.items()} == {
        "cpu_ratio_workers_1": True, "cpu_ratio_workers_2": True, "speedup_1_to_2_workers": False,
        "startup_share_workers_1": False}
    assert full["speedup_1_to_2_workers"]["target"] == ">= 1.8"
    assert "startup_share_workers_1" not in preprocess_report.targets(e2e, speedup=1.7, quick=True)
