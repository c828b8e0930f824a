"""bench.finetune.deployment on the tiny presets: our exports go to ONNX with outputs equal to ``transformers``', a
model whose ONNX outputs differ is not timed, and the results file holds every field the docs quote. No timing is
asserted."""
import json

import pytest

from bench.finetune import deployment
from bench.finetune import deployment_models as models

SETTINGS = deployment.Settings(size="tiny", models=("bert", "distilled"), seq=32, repeats=1, latency_warmup=0,
                               latency_iterations=2, throughput_batch=4, throughput_warmup=0, throughput_iterations=1,
                               child_timeout_s=300)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    work = tmp_path_factory.mktemp("deployment")
    path = deployment.run(SETTINGS, work / "models", work / "results")
    assert path.name.startswith("deployment-") and path.name.endswith("-tiny.json")
    return json.loads(path.read_text())


def test_the_student_has_the_distillation_preset_s_depth():
    assert models.student_layers(12) == 6  # configs/pretrain/distilbert_base.yaml: 6 of BERT-base's 12
    assert models.student_layers(2) == 1


@pytest.mark.parametrize("family", ["albert", "electra"])
def test_each_family_s_onnx_export_equals_transformers(tmp_path, family):
    exported = models.build_exports("tiny", tmp_path, (family,))
    hf_dir = exported[family]["hf_dir"]
    onnx_path = tmp_path / family / "onnx" / "model.onnx"
    export = models.export_onnx(hf_dir, onnx_path, seq=32)
    assert export["outputs"][0] == "last_hidden_state"
    assert ("pooler_output" in export["outputs"]) == (family == "albert")  # ELECTRA has no pooler
    check = models.verify_onnx(hf_dir, onnx_path, seq=32, threads=1)
    assert check["within_tolerance"] and check["max_abs_diff"] <= models.TOLERANCE
    assert check["shapes_checked"] == [[1, 32], [3, 32]]


def test_a_model_whose_onnx_outputs_differ_is_not_timed(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "TOLERANCE", -1.0)  # no difference passes
    settings = deployment.Settings(size="tiny", models=("electra",), seq=16, repeats=1)
    with pytest.raises(RuntimeError, match="not timed"):
        deployment.run(settings, tmp_path / "models", tmp_path / "results")
    assert not list((tmp_path / "results").glob("*.json"))


def test_the_onnx_outputs_equal_transformers_for_teacher_and_student(recorded):
    for name in SETTINGS.models:
        entry = recorded["models"][name]
        assert entry["onnx_check"]["within_tolerance"], entry["onnx_check"]
        assert entry["onnx_check"]["max_abs_diff"] <= models.TOLERANCE
        assert entry["safetensors_bytes"] > 0 and entry["onnx_bytes"] > 0
    teacher, student = (recorded["models"][n]["config"] for n in ("bert", "distilled"))
    assert (teacher["num_hidden_layers"], student["num_hidden_layers"]) == (2, 1)
    assert teacher["hidden_size"] == student["hidden_size"]


def test_the_results_hold_every_field(recorded):
    for key in ("benchmark", "date", "command", "machine", "versions", "method", "settings", "weights", "threads",
                "models", "measurements", "summary", "distillation", "foreign_load_cores_during_measurements"):
        assert key in recorded, key
    assert recorded["benchmark"] == "deployment"
    assert recorded["versions"]["onnxruntime"] and recorded["versions"]["torch"]
    assert recorded["threads"]["torch_intra_op"] == recorded["threads"]["onnxruntime_intra_op"] == SETTINGS.threads

    measurements = recorded["measurements"]
    assert len(measurements) == len(SETTINGS.models) * len(deployment.RUNTIMES) * 2 * SETTINGS.repeats
    for m in measurements:
        batch = SETTINGS.latency_batch if m["kind"] == "latency" else SETTINGS.throughput_batch
        assert (m["batch"], m["seq"]) == (batch, SETTINGS.seq)
        assert len(m["iterations_s"]) == (SETTINGS.latency_iterations if m["kind"] == "latency"
                                          else SETTINGS.throughput_iterations)
        assert m["peak_rss_bytes"] >= m["hwm_after_load_bytes"] > 0
        assert m["threads"] == SETTINGS.threads and m["interop_threads"] == 1
        # A deployment on ONNX Runtime needs no torch: its child never imports it.
        assert m["torch_imported"] == (m["runtime"] == "torch")

    for name in SETTINGS.models:
        entry = recorded["summary"][name]
        assert entry["parameters"] > 0 and entry["safetensors_mib"] > 0 and entry["onnx_mib"] > 0
        for runtime in deployment.RUNTIMES:
            figures = entry["runtimes"][runtime]
            for field in ("latency_ms", "throughput_seq_per_s", "peak_rss_mib_latency", "peak_rss_mib_throughput"):
                assert set(figures[field]) == {"median", "min", "max", "n"}

    distillation = recorded["distillation"]
    assert distillation["paper"] == {"smaller_percent": 40, "faster_percent": 60, "score_percent": 97}
    assert {"smaller_percent_parameters", "smaller_percent_safetensors", "smaller_percent_onnx",
            "faster_percent_latency_torch", "faster_percent_latency_onnxruntime"} <= set(distillation["ours"])
    if deployment.DISTILLATION_RESULTS.is_file():
        score = distillation["score"]["scores"]["sst2.accuracy"]
        assert score["percent"] == pytest.approx(100 * score["student"] / score["teacher"], abs=0.05)


def test_the_tables_name_every_model_and_runtime(recorded):
    table = deployment.tables(recorded["summary"], SETTINGS)
    for name in SETTINGS.models:
        for runtime in deployment.RUNTIMES:
            assert f"| {name} |" in table and f"| {runtime} |" in table
