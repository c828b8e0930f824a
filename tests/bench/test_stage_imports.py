"""bench.stage_imports: a stage's start-up imports in a process of their own, reported as one JSON line."""
import json
import sys

from bench import record
from common import processes


def test_reports_the_imports_of_the_preprocessing_driver():
    out = processes.run([sys.executable, "-m", "bench.stage_imports", "preprocess"], cwd=record.REPO,
                        capture_output=True, text=True, check=True, timeout=120).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["stage"] == "preprocess"
    assert found["import_cpu_s"] > 0 and found["peak_rss_bytes"] > 0


def test_an_unknown_stage_is_refused():
    result = processes.run([sys.executable, "-m", "bench.stage_imports", "nothing"], cwd=record.REPO,
                           capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "invalid choice: 'nothing'" in result.stderr
