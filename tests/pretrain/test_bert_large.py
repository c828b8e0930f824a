"""BERT-Large through every stage on CPU, as ``python -m bench.pretrain.bert_large`` runs it, with one step of one sequence a
rank in each run (the real size is what this proves; the step rates are the benchmark's): the phase-1
config on 2 ranks (ZeRO 2, precision auto) with a checkpoint, that checkpoint resumed on 1 rank (a universal
checkpoint), phase 2 from phase 1 (``model.init_from``), the export against ``transformers`` and ``python -m finetune``
on it.

Slow: two BERT-Large ranks in memory at once and several full-size checkpoints on disk (the figures are in
bench/results/bert-large-*.json)."""
import json
import os
import sys

import psutil
import pytest

from common import processes
from tests.pretrain.launching import REPO, environment


@pytest.mark.exclusive  # two BERT-Large ranks hold most of the memory
@pytest.mark.slow
def test_bert_large_pretrains_resumes_continues_exports_and_finetunes(shared_data, tmp_path):
    if psutil.virtual_memory().total < 20 * 2 ** 30:
        message = "two BERT-Large ranks need about 17 GB of memory"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # CI's machines have it: never let the check go silently
        pytest.skip(message)
    env = {k: v for k, v in environment().items() if k != "OMP_NUM_THREADS"}  # the script sets it per job
    result = processes.run([sys.executable, "-m", "bench.pretrain.bert_large", "--steps", "1", "--resume-steps", "1",
                            "--phase2-steps", "1", "--batch", "2", "2", "--data", str(shared_data),
                            "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")],
                           cwd=REPO, env=env, text=True, capture_output=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = json.loads(next((tmp_path / "results").glob("bert-large-*.json")).read_text())
    phase1, resumed, phase2 = (found["runs"][name]["summary"] for name in ("phase1", "resume", "phase2"))
    assert (phase1["status"], phase1["step"], phase1["world_size"]) == ("done", 1, 2)
    assert (resumed["status"], resumed["step"], resumed["world_size"]) == ("done", 2, 1)
    assert {"universal_conversion_s", "checkpoint_load_s"} <= set(resumed["timings"])
    assert (phase2["status"], phase2["step"]) == ("done", 1) and "export_hf_s" in phase2["timings"]
    assert found["memory"]["phase1"]["estimate_table"][0].startswith("Model states per GPU: 336,232,258 parameters")
    assert found["logits"]["pass"] and found["logits"]["real_tokens"] > 0
    assert found["offline_export"]["weights_max_abs_diff_vs_run_export"] == 0.0
    assert found["finetune"]["tasks"][0]["task"] == "sst2" and found["finetune"]["tasks"][0]["steps"] == [4]
