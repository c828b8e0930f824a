"""Fixtures for the preprocessing tests: real data from ../shared, a real BERT vocabulary, a CLI runner."""
from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

from common import processes
from tests.conftest import require

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLES = REPO_ROOT / "samples"


@pytest.fixture(scope="session")
def real_data(shared_data) -> pathlib.Path:
    return shared_data


@pytest.fixture(scope="session")
def real_wiki(real_data) -> pathlib.Path:
    return require(real_data / "wikipedia" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
                   "the Wikipedia dump slice")


@pytest.fixture(scope="session")
def real_books(real_data) -> pathlib.Path:
    return require(real_data / "books", "the books")


def run_cli(*args: str, env: dict | None = None, timeout: float = 600, check: bool = True):
    """Run ``python -m preprocess ARGS`` as a user would; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    proc = processes.run([sys.executable, "-m", "preprocess", *map(str, args)], cwd=REPO_ROOT, env=full_env,
                         capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"preprocess {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


def read_manifest(dataset: pathlib.Path | str) -> dict:
    return json.loads(pathlib.Path(dataset, "manifest.json").read_text())


def shard_hashes(dataset) -> list[str]:
    return [s["sha256"] for s in read_manifest(dataset)["shards"]]
