"""pyproject.toml declares what the code imports: every third-party import of a package (lazy imports inside
functions too) is in the base dependencies or in that package's extra, and each extra lists only what its package
imports. tests/test_extras.py installs each extra alone and runs its stage; this reads the source, so it also covers
code paths those runs do not reach."""
import ast
import functools
import importlib.metadata
import re
import sys

import pytest

from tests.pyproject_toml import REPO, read_pyproject

FIRST_PARTY = {"common", "models", "preprocess", "pretrain", "finetune", "cluster"}
STAGES = ("preprocess", "pretrain", "finetune", "cluster")
# The modules that import another distribution than their own name says: torch's TensorBoard writer is a wrapper
# around the tensorboard package, which torch does not require.
IMPORT_ALSO_NEEDS = {"torch.utils.tensorboard": "tensorboard"}
# common/storage.py imports the object-store clients and stream codecs only for URIs and .zst/.lz4 files, which
# only the preprocessing stage takes: [preprocess] declares them, not the base.
PREPROCESS_ONLY = {"smart_open", "boto3", "botocore", "fsspec", "zstandard"}
# Pretraining and finetuning run the model families (models/, no extra of its own). finetune runs pretrain's export
# and DeepSpeed engine (ZeRO finetuning, exporting a run's checkpoint), so its extra covers pretrain's imports, except
# rank discovery under mpirun, which finetuning never uses.
RUNS_CODE_OF = {"pretrain": ("models",), "finetune": ("pretrain", "models")}
NOT_REACHED = {"finetune": {"mpi4py"}}
# Declared without being imported by name: DeepSpeed's TensorBoard monitor, which the pretraining config turns on.
# protobuf: sentencepiece.sentencepiece_model_pb2 (models/hf_tokenizer.py) imports it.
LOADED_BY_A_DEPENDENCY = {"pretrain": {"tensorboard", "protobuf"}, "finetune": {"protobuf"}}
# Declared for what the stage writes rather than what it imports: finetuning's --save-models writes task models for
# transformers (AutoModelFor..., pipeline), and the demo's last step runs one with nothing but the stage's install
# (tests/test_extras.py runs one in the [finetune] environment alone).
FOR_ITS_OUTPUTS = {"finetune": {"transformers"}}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalise(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0))


def declared() -> dict[str, set[str]]:
    """Distribution names by list: "base" and each extra."""
    project = read_pyproject()["project"]
    lists = {"base": project["dependencies"], **project["optional-dependencies"]}
    return {name: {_requirement_name(r) for r in requirements} for name, requirements in lists.items()}


def imports_of(package: str) -> dict[str, set[str]]:
    """Top-level third-party module names the package's source imports, each with the files that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                names = [module.split(".")[0]] + [also for prefix, also in IMPORT_ALSO_NEEDS.items()
                                                  if module == prefix or module.startswith(prefix + ".")]
                for name in names:
                    if name not in FIRST_PARTY and name not in sys.stdlib_module_names and name != "__future__":
                        found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


@functools.cache
def _providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    """The installed distributions that provide a top-level module (the names pip knows them by)."""
    if module in IMPORT_ALSO_NEEDS.values():
        return {_normalise(module)}
    names = _providers().get(module)
    if not names:
        pytest.fail(f"no installed distribution provides {module!r}: install every extra first "
                    "(bash scripts/test.sh does)")
    return {_normalise(name) for name in names}


def needed_by(package: str) -> dict[str, set[str]]:
    """Module → files, for what running ``package`` imports: its own imports, those of the code it runs, and for
    preprocess the object-store clients common/ imports on its behalf."""
    needed = {name: set(files) for name, files in imports_of(package).items()}
    for other in RUNS_CODE_OF.get(package, ()):
        for name, files in imports_of(other).items():
            if name not in NOT_REACHED.get(package, set()):
                needed.setdefault(name, set()).update(files)
    if package == "preprocess":
        for name, files in imports_of("common").items():
            if name in PREPROCESS_ONLY:
                needed.setdefault(name, set()).update(files)
    return needed


def test_the_contracts_need_only_the_base():
    lists = declared()
    missing = {module: sorted(files) for module, files in imports_of("common").items()
               if module not in PREPROCESS_ONLY and not distributions_of(module) & lists["base"]}
    assert not missing, f"common/ imports these, which the base dependencies do not list: {missing}"


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_imports_only_what_its_extra_or_the_base_declares(stage):
    lists = declared()
    allowed = lists["base"] | lists[stage]
    needed = needed_by(stage)
    missing = {module: sorted(files) for module, files in needed.items() if not distributions_of(module) & allowed}
    assert not missing, f"{stage} imports these, which neither [{stage}] nor the base lists: {missing}"


@pytest.mark.parametrize("stage", STAGES)
def test_each_extra_lists_only_what_its_stage_imports(stage):
    lists = declared()
    needed = needed_by(stage)
    provided = set().union(*(distributions_of(module) for module in needed))
    unused = lists[stage] - provided - LOADED_BY_A_DEPENDENCY.get(stage, set()) - FOR_ITS_OUTPUTS.get(stage, set())
    assert not unused, f"[{stage}] lists {sorted(unused)}, which no module of {stage}/ imports"
    assert not lists[stage] & lists["base"], f"[{stage}] repeats base dependencies: {lists[stage] & lists['base']}"


def test_the_base_lists_only_what_the_contracts_import():
    lists = declared()
    provided = set().union(*(distributions_of(module) for module in imports_of("common")
                             if module not in PREPROCESS_ONLY))
    assert lists["base"] <= provided, f"the base lists {sorted(lists['base'] - provided)}, which common/ never imports"


def test_the_audit_sees_lazy_imports():
    """Imports inside functions count: DeepSpeed reaches finetuning only through pretrain/engine.py's functions."""
    assert "deepspeed" in needed_by("finetune") and "boto3" in imports_of("common")
