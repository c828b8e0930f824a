"""Shared pytest setup: the repository root's packages import without installing them."""
import os
import pathlib
import sys

import pytest

_REPO_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """The shared real data (../shared/data next to the repository): required in CI, else optional."""
    path = (pathlib.Path(_REPO_ROOT) / ".." / "shared" / "data").resolve()
    if not path.is_dir():
        message = f"the shared real data directory is missing: {path}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
