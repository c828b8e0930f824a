"""pyproject.toml as the tests that audit it read it (tests/test_dependencies.py, tests/test_extras.py)."""
import os
import pathlib

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: CI runs 3.11, where a missing reader is a failure, not a skip
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("reading pyproject.toml needs Python 3.11", allow_module_level=True)  # skips the importing test file

REPO = pathlib.Path(__file__).resolve().parents[1]


def read_pyproject() -> dict:
    """The repository's pyproject.toml, parsed."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())
