"""bench.preprocess.budget: the memory floor, measured as a process of its own, and how a budget is described."""
import json
import sys

from bench import record
from bench.preprocess import budget as preprocess_budget
from bench.preprocess import runs as preprocess_runs
from common import processes


def test_the_floor_holds_more_than_the_imports_alone(tmp_path, bert_vocab):
    setting = preprocess_runs.Setting({"wiki": [], "books": []}, bert_vocab, tmp_path, quiet_wait=0)
    floor = preprocess_budget.memory_floor(setting, tmp_path / "floor.log", runs=1)
    imports = json.loads(processes.run([sys.executable, "-m", "bench.stage_imports", "preprocess"], cwd=record.REPO,
                                       capture_output=True, text=True, check=True, timeout=120).stdout)
    # The tokenizer and a pipeline's run come on top of the same imports.
    assert floor["one_trivial_pipeline_peak_bytes"] > imports["peak_rss_bytes"]
    assert "python -m bench.preprocess.floor" in floor["method"] and "(1 runs)" in floor["method"]
    # pymongo is one of Beam's own dependencies, so at least it is there to hide.
    assert floor["optional_clients_hidden_peak_bytes"] < floor["one_trivial_pipeline_peak_bytes"]


def test_a_hidden_package_fails_to_import_in_the_floor_probe(tmp_path, bert_vocab):
    result = processes.run([sys.executable, "-m", "bench.preprocess.floor", str(bert_vocab), "--hide", "apache_beam"],
                           cwd=record.REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "apache_beam is hidden by bench.preprocess.floor --hide" in result.stderr


def test_a_missing_tokenizer_fails_the_floor_probe(tmp_path):
    result = processes.run([sys.executable, "-m", "bench.preprocess.floor", str(tmp_path / "none")], cwd=record.REPO,
                           capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and str(tmp_path / "none") in result.stderr


def test_a_budget_is_described_as_refused_or_kept():
    refused = {"budget_bytes": 2**20 * 186, "refused": "error: --max-memory 186M is below ...", "under_budget": False}
    assert preprocess_budget.describe_budget("quarter", refused) == \
        "quarter 186.0 MiB: refused (error: --max-memory 186M is below ...)"
    kept = {"budget_bytes": 2**20 * 309, "parts_chosen": 34, "peak_tree_rss_bytes": 2**20 * 266, "under_budget": True,
            "shards_identical": True}
    assert preprocess_budget.describe_budget("smallest_accepted", kept) == (
        "smallest_accepted 309.0 MiB: 34 parts, peak 266.0 MiB, under budget True, shards identical True")


def test_the_budget_at_scale_is_a_quarter_of_the_unbudgeted_peak_and_checks_the_shards(tmp_path, monkeypatch):
    from bench.preprocess import report as preprocess_report

    (tmp_path / "in.txt").write_bytes(b"x" * 1000)
    (tmp_path / "logs").mkdir()
    calls = []

    def fake_run(setting, output, args, log):
        calls.append(args)
        budgeted = "--max-memory" in args
        if budgeted:
            log.write_text("INFO preprocess: max-memory 250M: 7 parts (estimated peak 240M per part)\n")
        return {"peak_tree_rss_bytes": (200 if budgeted else 1000) << 20, "wall_s": 2.0, "cpu_s": 2.0, "parts": 7
                if budgeted else 1, "instances": 5, "shard_sha256": ["a", "b" if budgeted else "c"]}

    monkeypatch.setattr(preprocess_budget, "run_pipeline", fake_run)
    setting = preprocess_runs.Setting({"wiki": [], "books": [str(tmp_path / "in.txt")]}, tmp_path, tmp_path, 0)
    scaled = preprocess_budget.budget_at_scale(setting, 32)
    assert calls[1][-2:] == ["--max-memory", str((1000 << 20) // 4)]
    quarter = scaled["quarter"]
    assert quarter["parts_chosen"] == 7 and quarter["under_budget"] and not quarter["shards_identical"]
    assert scaled["unbudgeted"]["peak_rss_per_input_byte"] == round((1000 << 20) / 1000, 2)
    assert preprocess_report.describe_at_scale(scaled) == (
        "at 32x (0.0 MiB): unbudgeted peak 1000.0 MiB; quarter 250.0 MiB: 7 parts, peak 200.0 MiB, under budget "
        "True, shards identical False")
