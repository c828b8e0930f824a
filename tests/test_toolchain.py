"""The suite runs with the same test tools on every machine: tests/constraints.txt pins the test toolchain (pytest,
the plugins it loads and what they need, hypothesis) and every package only the tests use, scripts/test.sh installs
with it, and only the pinned plugins load. A new pytest once turned a passing assertion into a TypeError on one
machine and not on another (a 0-d tensor given to ``pytest.approx``); these fail first when that can happen again."""
from __future__ import annotations

import importlib.metadata
import re
import shlex

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.pyproject_toml import REPO, read_pyproject

CONSTRAINTS = REPO / "tests" / "constraints.txt"
TOOLCHAIN = ("pytest", "pytest-xdist", "hypothesis")  # what runs the tests; their requirements are pinned too
PLUGINS = {"pytest-xdist", "hypothesis"}  # the distributions whose pytest plugins pyproject.toml's addopts loads


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def pins() -> dict[str, str]:
    """Distribution → pinned version, from tests/constraints.txt (every line ``name==version``)."""
    found = {}
    for number, line in enumerate(CONSTRAINTS.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", \
            f"tests/constraints.txt:{number}: {line!r} is not an exact pin (name==version)"
        found[_name(requirement.name)] = specifiers[0].version
    return found


def installed_by_name() -> list[str]:
    """The requirements scripts/test.sh installs by name (besides the project's extras)."""
    named = []
    for line in (REPO / "scripts" / "test.sh").read_text().replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "pip" in words and "install" in words:
            named += [w for w in words[words.index("install") + 1:]
                      if not w.startswith(("-", ".")) and w != "tests/constraints.txt"]
    return named


def _needs(distribution: str) -> set[str]:
    environment = default_environment() | {"extra": ""}
    return {_name(Requirement(r).name) for r in importlib.metadata.requires(distribution) or []
            if Requirement(r).marker is None or Requirement(r).marker.evaluate(environment)}


def test_every_test_tool_and_test_only_package_is_pinned():
    pinned = pins()
    dev = {_name(Requirement(r).name) for r in read_pyproject()["project"]["optional-dependencies"]["dev"]}
    assert not dev - pinned.keys(), f"pyproject.toml's dev extra lists {sorted(dev - pinned.keys())}, which " \
                                    "tests/constraints.txt does not pin: add name==version there"
    for requirement in map(Requirement, installed_by_name()):
        exact = [s for s in requirement.specifier if s.operator == "=="]
        assert exact or _name(requirement.name) in pinned, \
            f"scripts/test.sh installs {requirement} unpinned: pin it in tests/constraints.txt"
    for tool in TOOLCHAIN:
        unpinned = _needs(tool) - pinned.keys()
        assert not unpinned, f"{tool} needs {sorted(unpinned)}, which tests/constraints.txt does not pin"


def test_the_installed_test_tools_are_the_pinned_versions():
    wrong = {}
    for name, version in pins().items():
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found = "not installed"
        if found != version:
            wrong[name] = f"{found}, pinned {version}"
    assert not wrong, f"installed test tools differ from tests/constraints.txt: {wrong}; " \
                      "bash scripts/test.sh installs the pinned ones"


def test_only_the_pinned_plugins_load(pytestconfig):
    """Whatever else is installed (anyio registers a plugin, a machine may have pytest-benchmark), only xdist's and
    hypothesis' plugins load: pyproject.toml's addopts turns autoloading off and names them."""
    loaded = {_name(dist.project_name) for _, dist in pytestconfig.pluginmanager.list_plugin_distinfo()}
    assert loaded == PLUGINS, f"pytest plugins loaded: {sorted(loaded)}; only {sorted(PLUGINS)} are pinned"
    assert PLUGINS <= pins().keys()


def test_a_tensor_given_to_pytest_approx_is_refused():
    """tests/conftest.py's guard: approx compares numbers; what it does with a tensor changed between releases."""
    import torch

    with pytest.raises(TypeError, match=r"pytest.approx compares numbers: pass float\(tensor\)"):
        pytest.approx(torch.tensor(1.0))
    with pytest.raises(TypeError, match="pytest.approx compares numbers"):
        pytest.approx([1.0, torch.tensor(2.0)])
    assert 1.0 == pytest.approx(float(torch.tensor(1.0)))
