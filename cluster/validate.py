"""Offline validation of everything rendered, before it is printed or submitted.

* Core Kubernetes kinds (ConfigMap, Service, Job, Deployment) strictly against the OpenAPI schemas that the PyPI
  package ``kubernetes-validate`` ships: an unknown or misspelt field is an error (``kubectl --validate=strict``).
* Custom resources (PyTorchJob, MPIJob) against the CRDs' own ``openAPIV3Schema`` with ``jsonschema``. Those schemas
  let unknown fields through (none sets additionalProperties: false), so the pod templates inside them are also
  validated strictly as core ``PodTemplate``s.
* Slurm scripts: ``bash -n`` (syntax), and every ``#SBATCH`` line before the first command (sbatch ignores later ones).

The CRD files come from ``--crd-dir``, the ``BERT_PIPELINE_CRD_DIR`` variable, or ``../shared/data/k8s-crds`` next
to the repository; any directory of CRD YAML files works, e.g. ``kubectl get crd pytorchjobs.kubeflow.org -o yaml``.
"""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from preprocess.configlib import ConfigError

CRD_DIR_VARIABLE = "BERT_PIPELINE_CRD_DIR"
REPOSITORY = Path(__file__).resolve().parents[1]
DEFAULT_CRD_DIR = REPOSITORY.parent / "shared" / "data" / "k8s-crds"
CORE_GROUPS = ("v1", "batch/v1", "apps/v1")


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
    result = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    if result.returncode != 0:
        raise ValidationError(f"the batch script is not valid bash: {result.stderr.strip()}")
