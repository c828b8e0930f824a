"""bench.preprocess.runs: a measured pipeline run and the irreducible work, on the bundled samples."""
import pathlib

from bench.preprocess import runs as preprocess_runs

SAMPLES = pathlib.Path(__file__).resolve().parents[3] / "samples"


def _setting(tmp_path, bert_vocab) -> preprocess_runs.Setting:
    inputs = {"wiki": [str(SAMPLES / "wikipedia" / "samplewiki-pages-articles.xml.bz2")],
              "books": [str(p) for p in sorted((SAMPLES / "books").glob("*.txt"))]}
    return preprocess_runs.Setting(inputs, bert_vocab, tmp_path, quiet_wait=0)


def test_the_irreducible_work_counts_the_tokens_the_pipeline_counts(tmp_path, bert_vocab):
    setting = _setting(tmp_path, bert_vocab)
    run = preprocess_runs.run_pipeline(setting, tmp_path / "out", preprocess_runs.MODES["workers_1"],
                                       setting.logs / "run.log")
    alone = preprocess_runs.irreducible(setting, setting.logs / "irreducible.log")
    assert alone["corpus_tokens"] == run["corpus_tokens"] > 0
    assert alone["documents"] == run["documents_used"]
    assert alone["startup_cpu_s"] == round(alone["cpu_s"] - alone["work_cpu_s"], 3) > 0
    assert run["cpu_accounting_check"] == "ok" and run["parts"] == 1 and len(run["shard_sha256"]) >= 1
    assert "Traceback" not in (setting.logs / "run.log").read_text()


def test_the_startup_cost_is_the_import_process_measured_whole(tmp_path):
    startup = preprocess_runs.startup_cost(tmp_path / "startup.log", runs=1)
    assert startup["driver_import_cpu_s"] > 0 and startup["driver_import_peak_rss_bytes"] > 0
    assert '"stage": "preprocess"' in (tmp_path / "startup.log").read_text()


def test_cpu_accounting_fails_on_unreaped_processes_or_missing_cpu():
    ok = {"unreaped_processes": 0, "cpu_s": 2.0, "sampled_tree_cpu_s": 2.04}
    assert preprocess_runs.cpu_check(ok) == "ok"
    assert preprocess_runs.cpu_check(ok | {"unreaped_processes": 2}).startswith("FAIL: 2 process(es)")
    assert preprocess_runs.cpu_check(ok | {"sampled_tree_cpu_s": 2.2}).startswith("FAIL: wait4 CPU below")
