"""Virtual environments the tests build to run the project as a user installs it (tests/test_extras.py: each extra
alone; tests/test_demo.py: the README's demo). They are kept under ~/.cache/bert-pipeline/extras/<checkout>/, one
set per checkout (an editable install points at one), and those of checkouts that no longer exist are removed."""
from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from common import processes
from tests.pyproject_toml import REPO


def torch_requirement() -> str:
    """The torch build scripts/test.sh installs first (a local CPU wheel here), so both stay in step."""
    found = re.search(r'"(torch==[^"]+)"', (REPO / "scripts" / "test.sh").read_text())
    assert found, "scripts/test.sh no longer installs a pinned torch (\"torch==X\"); update tests/venvs.py"
    return found.group(1)


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would put another installation on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def run(command: list, what: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    result = processes.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout,
                           check=False, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{what} failed (exit {result.returncode}):\n$ {' '.join(map(str, command))}\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}", pytrace=False)
    return result


def cache_root() -> pathlib.Path:
    """This checkout's environments (an editable install points at one checkout)."""
    base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "bert-pipeline" / "extras"
    root = base / hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    root.mkdir(parents=True, exist_ok=True)
    (root / "checkout").write_text(str(REPO))
    for other in base.iterdir():  # a checkout that is gone (a CI clone) leaves its environments behind
        checkout = other / "checkout"
        if other != root and checkout.is_file() and not pathlib.Path(checkout.read_text(), "pyproject.toml").is_file():
            shutil.rmtree(other, ignore_errors=True)
    return root
