"""Offline validation of everything rendered, before it is printed or submitted.

* Core Kubernetes kinds (ConfigMap, Service, Job, Deployment) strictly against the OpenAPI schemas that the PyPI
  package ``kubernetes-validate`` ships: an unknown or misspelt field is an error (``kubectl --validate=strict``).
* Custom resources (PyTorchJob, MPIJob) against the CRDs' own ``openAPIV3Schema`` with ``jsonschema``. Those schemas
  let unknown fields through (none sets additionalProperties: false), so the pod templates inside them are also
  validated strictly as core ``PodTemplate``s.
* Slurm scripts: ``bash -n`` (syntax), and every ``#SBATCH`` line before the first command (sbatch ignores later ones).
* Credentials: every line of every script and every string of every manifest is scanned (cluster.credentials), and
  so is every value the user gave (site keys, options, stage arguments) that a job might not render; a credential
  is refused naming where it came from. This runs first: the other checks' messages may quote what they refuse.

The CRD files come from ``--crd-dir``, the ``BERT_PIPELINE_CRD_DIR`` variable, or ``../shared/data/k8s-crds`` next
to the repository; any directory of CRD YAML files works, e.g. ``kubectl get crd pytorchjobs.kubeflow.org -o yaml``.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path

from cluster import credentials
from common import processes
from common.configlib import ConfigError

CRD_DIR_VARIABLE = "BERT_PIPELINE_CRD_DIR"
REPOSITORY = Path(__file__).resolve().parents[1]
DEFAULT_CRD_DIR = REPOSITORY.parent / "shared" / "data" / "k8s-crds"
CORE_GROUPS = ("v1", "batch/v1", "apps/v1")
CREDENTIAL_FIX = ("reference a Kubernetes Secret (secretKeyRef) or an environment variable the job inherits "
                  "(Slurm --export), never the value")


class ValidationError(ConfigError):
    """A rendered job that a scheduler or API server would refuse."""


def crd_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(CRD_DIR_VARIABLE) or DEFAULT_CRD_DIR)


def validate_manifests(documents: list[dict], kube_version: str, crds: Path) -> None:
    for document in documents:
        what = f"{document.get('kind')} {document.get('metadata', {}).get('name')}"
        if document.get("apiVersion") in CORE_GROUPS:
            _core(document, kube_version, what)
            continue
        _custom(document, crds, what)
        for path, template in _pod_templates(document):
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": document["metadata"]["name"]}, "template": template}
            _core(pod_template, kube_version, f"{what}: the pod template at {path}", prefix=("template",))


def _core(document: dict, kube_version: str, what: str, prefix: tuple = ()) -> None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(document, kube_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        location = _path(list(error.absolute_path)[len(prefix):])
        raise ValidationError(f"{what} is not a valid {document['kind']} for Kubernetes {kube_version}: "
                              f"at {location}: {error.message}") from None
    except kubernetes_validate.SchemaNotFoundError as error:
        raise ValidationError(f"{what}: {error.message}") from None


def _custom(document: dict, crds: Path, what: str) -> None:
    import jsonschema

    group, _, version = document.get("apiVersion", "").rpartition("/")
    schema = _crd_schemas(str(crds)).get((group, document.get("kind"), version))
    if schema is None:
        raise ValidationError(
            f"{what}: no CRD schema for {document.get('kind')} {document.get('apiVersion')} in {crds}; point "
            f"--crd-dir (or {CRD_DIR_VARIABLE}) at a directory with its CustomResourceDefinition, e.g. "
            f"`kubectl get crd <plural>.{group} -o yaml > DIR/<plural>.yaml`")
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        raise ValidationError(f"{what} does not match the {document['kind']} CRD: at "
                              f"{_path(list(error.absolute_path))}: {error.message}")


@functools.lru_cache(maxsize=4)
def _crd_schemas(directory: str) -> dict:
    """(group, kind, version) -> openAPIV3Schema for every CRD in the directory."""
    import yaml

    folder = Path(directory)
    if not folder.is_dir():
        raise ValidationError(f"the CRD directory {folder} does not exist: custom resources (PyTorchJob, MPIJob) "
                              f"are validated against their CRDs; pass --crd-dir or set {CRD_DIR_VARIABLE}")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD files are large; libyaml reads them in ms
    schemas = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        for document in yaml.load_all(path.read_text(encoding="utf-8"), Loader=loader):
            if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
                continue
            spec = document["spec"]
            for version in spec.get("versions", []):
                schema = (version.get("schema") or {}).get("openAPIV3Schema")
                if schema:
                    schemas[(spec["group"], spec["names"]["kind"], version["name"])] = schema
    return schemas


def _pod_templates(document: dict):
    """(path, template) of every pod template in a custom resource: spec.<x>ReplicaSpecs.<role>.template."""
    for key, replicas in (document.get("spec") or {}).items():
        if key.endswith("ReplicaSpecs") and isinstance(replicas, dict):
            for role, replica in replicas.items():
                if isinstance(replica, dict) and "template" in replica:
                    yield f"spec.{key}.{role}.template", replica["template"]


def _path(parts: list) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".") or "the top level"


def validate_sbatch(script: str) -> None:
    lines = script.splitlines()
    if not lines or not lines[0].startswith("#!"):
        raise ValidationError("the batch script must start with #!/bin/bash")
    first_command = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), len(lines))
    late = [line for line in lines[first_command:] if line.startswith("#SBATCH")]
    if late:
        raise ValidationError(f"{late[0]!r} comes after the first command, where sbatch ignores it")
    result = processes.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise ValidationError(f"the batch script is not valid bash: {result.stderr.strip()}")


# ------------------------------------------------------------------------------------------------ credentials

def refuse_credentials(given: list[tuple[str, str]], rendered: list[tuple[str, str]]) -> None:
    """Refuse a job that holds a credential, one line per credential naming where it came from and the fix.

    ``rendered``: (where, text) of everything the job is made of (``script_texts``, ``manifest_texts``): whatever
    its source, nothing rendered escapes. ``given``: (label, value) of what the user gave (``given_values``), which
    names a credential's source, and is scanned too: a site file holding a credential is refused even where the
    scheduler at hand does not render that key (``setup`` on Kubernetes)."""
    lines, seen = [], set()
    for where, text in [*rendered, *given]:
        for finding in credentials.find(text):
            if finding.value in seen:
                continue
            seen.add(finding.value)
            source = next((index for index, (_, value) in enumerate(given) if finding.value in value), None)
            # a rendered place is named by keys and options the user chose, which could hold a credential too
            label = credentials.redact(where if source is None else given[source][0])
            line = f"{label}: {finding.describe()}: {CREDENTIAL_FIX}"
            # in the order of the user's files and options; what only the rendering holds comes last
            lines.append((len(given) if source is None else source, line))
    if lines:
        raise ValidationError("\n".join(line for _, line in sorted(lines, key=lambda line: line[0])))


def given_values(site, site_file: str, site_overrides: list[str], job) -> list[tuple[str, str]]:
    """(label, value) of every value the user gave, in the order that names a source best: a --site-set before
    the site file's key it replaced, a --set before the stage config's key."""
    given = [(f"--site-set {key}", value) for key, _, value in (o.partition("=") for o in site_overrides)]
    given += [(f"{site_file}: {key}", value) for key, value in _leaves(site)]
    given += [(f"--set {key}", value) for key, _, value in (o.partition("=") for o in job.overrides)]
    given += _stage_arguments(list(job.arguments))
    given += [(f"{job.config_source}: {key}", value) for key, value in _leaves(job.config)]
    return given


def script_texts(scripts) -> list[tuple[str, str]]:
    """(where, line) of every line of the batch scripts (``cluster.slurm.Rendered``)."""
    return [(f"the batch script {script.name}, line {number}", line)
            for script in scripts for number, line in enumerate(script.text.splitlines(), start=1)]


def manifest_texts(documents: list[dict]) -> list[tuple[str, str]]:
    """(where, text) of every string in the manifests: a container's command line as one text (an option and its
    value together), an environment entry as NAME=value. References to Secrets (valueFrom) hold no value."""
    texts: list[tuple[str, str]] = []

    def walk(node, path: str, what: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("name"), str) and isinstance(node.get("value"), str):  # an env entry
                texts.append((f"{what}: {path}[{node['name']}]", f"{node['name']}={node['value']}"))
                return
            for key, value in node.items():
                if key == "valueFrom":
                    continue
                key_path = f"{path}.{key}" if path else str(key)
                texts.append((f"{what}: {key_path} (the key)", str(key)))  # node selectors, labels: user-given keys
                walk(value, key_path, what)
        elif isinstance(node, list):
            if node and all(isinstance(item, str) for item in node):
                texts.append((f"{what}: {path}", " ".join(node)))
                return
            for index, item in enumerate(node):
                walk(item, f"{path}[{index}]", what)
        elif isinstance(node, str):
            texts.append((f"{what}: {path}", node))

    for document in documents:
        walk(document, "", f"{document.get('kind')} {document.get('metadata', {}).get('name')}")
    return texts


def _leaves(node, prefix: str = ""):
    """(dotted key, text) of every value in a config: dataclass fields, mapping keys, list positions."""
    if dataclasses.is_dataclass(node):
        node = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _leaves(value, f"{prefix}[{index}]")
    elif node is not None:
        yield prefix, str(node)


_OPTION = re.compile(r"^--?[A-Za-z][A-Za-z0-9_.-]*$")


def _stage_arguments(arguments: list[str]) -> list[tuple[str, str]]:
    """(label, argument) of the stage's arguments: each named by its option where it has one (--wikipedia URL,
    --books=URI) and by its position otherwise; a name that is itself a credential is not repeated."""
    given = []
    for index, argument in enumerate(arguments):
        option = argument.split("=", 1)[0] if argument.startswith("-") else (arguments[index - 1] if index else "")
        named = _OPTION.match(option) and not credentials.find(option)
        given.append((f"the stage argument {option if named else index + 1} after '--'", argument))
    return given
