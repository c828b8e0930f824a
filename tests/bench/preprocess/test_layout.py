"""bench.preprocess.layout: a pipeline run with the rows per key-range group scaled down, on the bundled samples."""
import pathlib

from bench.preprocess import layout as preprocess_layout
from bench.preprocess import runs as preprocess_runs

SAMPLES = pathlib.Path(__file__).resolve().parents[3] / "samples"


def test_the_emulated_run_has_more_groups_and_the_same_rows(tmp_path, bert_vocab):
    inputs = {"wiki": [str(SAMPLES / "wikipedia" / "samplewiki-pages-articles.xml.bz2")],
              "books": [str(p) for p in sorted((SAMPLES / "books").glob("*.txt"))]}
    setting = preprocess_runs.Setting(inputs, bert_vocab, tmp_path, quiet_wait=0)
    one_worker = preprocess_runs.MODES["workers_1"]
    real = preprocess_runs.run_pipeline(setting, tmp_path / "real", one_worker, setting.logs / "real.log")
    emulated = preprocess_runs.run_pipeline(setting, tmp_path / "emulated", one_worker, setting.logs / "emulated.log",
                                            launcher=preprocess_layout.emulated_launcher(1024.0))
    # Groups of 16384 / 1024 = 16 rows instead of 16384: the layout of a corpus 1024 times as large (the
    # samples' rows fill less than one group of the real size, whose count is rounded up to one).
    assert real["layout"]["group_bits"] == 0 and emulated["layout"]["group_bits"] >= 6
    assert emulated["instances"] == real["instances"] > 0
    assert emulated["cpu_accounting_check"] == "ok"
