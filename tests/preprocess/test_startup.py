"""The command line's start-up: which of Apache Beam's optional client libraries a run imports."""
from __future__ import annotations

import subprocess
import sys

import pytest

from preprocess import cli
from tests.preprocess.conftest import REPO_ROOT, SAMPLES

CLIENTS = ("pymongo", "boto3", "botocore", "google.cloud.storage", "smart_open", "apache_beam.io.gcp.bigquery",
           "requests")


def test_hidden_modules_fail_to_import_only_meanwhile():
    name = "json.tool"  # a real module: importable before and after
    sys.modules.pop(name, None)
    with cli._modules_hidden((name, "json")):  # json is imported already: left alone
        with pytest.raises(ImportError):
            __import__(name)
        import json  # noqa: F401
    assert __import__(name) and name in sys.modules


def test_a_local_run_imports_no_object_store_client(tmp_path, bert_vocab):
    out = tmp_path / "dataset"
    code = ("import sys; from preprocess import cli\n"
            f"status = cli.main(['run', '--config', 'configs/preprocess/tiny.yaml', '--wikipedia', "
            f"{str(SAMPLES / 'wikipedia')!r}, '--books', {str(SAMPLES / 'books')!r}, '--tokenizer', "
            f"{str(bert_vocab)!r}, '--output', {str(out)!r}])\n"
            f"print('LOADED', *[m for m in {CLIENTS!r} if m in sys.modules])\n"
            "sys.exit(status)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "manifest.json").exists()
    assert proc.stdout.strip().splitlines()[-1] == "LOADED"
    assert "bson" not in proc.stderr and "apitools" not in proc.stderr


def test_blingfire_is_imported_before_beam():
    # Its import resolves the path of every module already loaded (inspect.getframeinfo): after Beam's, 0.1 s more.
    code = ("import sys; from preprocess import cli; cli.load_pipeline_modules([]); names = list(sys.modules)\n"
            "print(names.index('blingfire') < names.index('apache_beam'))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
