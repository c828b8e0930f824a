"""The layout's promises: data code imports no torch; the format module imports no Beam."""
import sys

from common import processes


def _modules_after(import_line: str) -> set[str]:
    code = f"import sys; {import_line}; print(' '.join(sorted(sys.modules)))"
    out = processes.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    return set(out.split())


def test_preprocess_never_imports_torch_or_deepspeed():
    loaded = _modules_after("import preprocess.executors.pipeline, preprocess.stages.pairs, preprocess.cli")
    assert "torch" not in loaded and "deepspeed" not in loaded


def test_format_and_tokenizer_modules_need_no_beam():
    loaded = _modules_after("import common.schema, common.tokenizer, preprocess.instances")
    assert "apache_beam" not in loaded


def test_model_files_import_nothing_distributed_and_no_stage():
    """Every family's model and Hugging Face code (``models/``) imports no stage, no DeepSpeed and nothing of
    torch.distributed, read from the source (lazy imports too) and from what importing every family loads."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    for path in sorted((root / "models").rglob("*.py")):
        imports = [line for line in path.read_text().splitlines() if line.lstrip().startswith(("import ", "from "))]
        assert not [line for line in imports if "deepspeed" in line or "distributed" in line], (path, imports)
    offenders = {path: sorted(names - {"common", "models"}) for path, names in _first_party_imports("models").items()
                 if names - {"common", "models"}}
    assert not offenders, offenders
    loaded = _modules_after("import models.registry; [models.registry.family(t) for t in models.registry.MODEL_TYPES]")
    assert not {"deepspeed", "apache_beam", "pretrain", "finetune"} & loaded


def test_deepspeed_is_touched_in_one_module():
    """pretrain/engine.py imports DeepSpeed; finetune/zero.py (finetuning's engine) asks it for its engine."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    stages = ("common", "models", "preprocess", "pretrain", "finetune", "cluster")
    users = sorted(str(path.relative_to(root)) for package in stages for path in (root / package).rglob("*.py")
                   if any(line.lstrip().startswith(("import deepspeed", "from deepspeed"))
                          for line in path.read_text().splitlines()))
    assert users == ["pretrain/engine.py"], users
    loaded = _modules_after("import pretrain.train, pretrain.loop, pretrain.data, pretrain.families.bert_loss, "
                            "pretrain.checkpoints, finetune.trainer, finetune.zero")
    assert "deepspeed" not in loaded  # imported lazily, when an engine is built


def _first_party_imports(package: str) -> dict[str, set[str]]:
    """The project packages each module of ``package`` imports (top-level name), from its source: lazy imports
    inside functions count too."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(root))] = names & {"common", "models", "preprocess", "pretrain", "finetune", "cluster"}
    return found


def test_common_imports_no_stage():
    offenders = {path: sorted(names - {"common"}) for path, names in _first_party_imports("common").items()
                 if names - {"common"}}
    assert not offenders, offenders


def test_no_stage_imports_the_preprocessing_stage():
    for package in ("models", "pretrain", "finetune", "cluster"):
        offenders = {path: sorted(names) for path, names in _first_party_imports(package).items()
                     if "preprocess" in names}
        assert not offenders, offenders


def test_the_contracts_need_no_beam_and_no_torch():
    loaded = _modules_after("import common.configlib, common.storage, common.tokenizer, common.schema, "
                            "common.verify, common.hashing, common.writelock, common.preprocess_config, "
                            "common.processes")
    assert not {"apache_beam", "torch", "deepspeed"} & loaded


def _module_imports(package: str) -> dict[str, set[str]]:
    """The full dotted names each module of ``package`` imports from (``from a.b import c`` -> ``a.b``)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.update(f"{node.module}.{alias.name}" if node.module in ("models", "pretrain") else node.module
                             for alias in node.names)
        found[str(path.relative_to(root))] = names
    return found


def test_finetuning_reaches_models_only_through_the_registry_and_shares_few_pretraining_modules():
    """No family's model or Hugging Face file: a new family is finetuned through ``models.registry`` alone."""
    shared_models = {"models.registry", "models.attention", "models.hf_io", "models.hf_tokenizer"}
    shared_pretraining = {"pretrain.engine", "pretrain.schedule", "pretrain.weight_decay", "pretrain.compiling",
                          "pretrain.precision", "pretrain.launch", "pretrain.checkpoints", "pretrain.export"}
    offenders = {path: sorted(name for name in names if name.startswith(("models.", "pretrain."))
                              and name not in shared_models | shared_pretraining)
                 for path, names in _module_imports("finetune").items()}
    assert not {path: names for path, names in offenders.items() if names}
