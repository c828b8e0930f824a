"""The offline validation catches what an API server, an operator or sbatch would refuse, including the typos
that the CRD schemas alone let through."""
import copy

import pytest

from cluster import validate
from tests.cluster.rendering import JOBS, crds, render  # noqa: F401  (crds: a fixture)


@pytest.fixture(scope="module")
def pytorchjob(crds):  # noqa: F811
    return render(JOBS["k8s-pretrain-pytorchjob.yaml"])[1]


def _refused(documents, crd_dir, message):
    with pytest.raises(validate.ValidationError, match=message):
        validate.validate_manifests(documents, "1.31", crd_dir)


def test_typo_in_a_pod_template_inside_a_custom_resource_is_caught(pytorchjob, crds):  # noqa: F811
    import jsonschema

    documents = copy.deepcopy(pytorchjob)
    container = documents[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["imagee"] = container.pop("image")
    # The CRD's own schema accepts it (it allows unknown fields) ...
    schema = validate._crd_schemas(str(crds))[("kubeflow.org", "PyTorchJob", "v1")]
    jsonschema.Draft7Validator(schema).validate(documents[1])
    # ... the strict pod template check does not.
    _refused(documents, crds, r"PyTorchJob bert-pretrain-bert-large-phase1-seq128: the pod template at "
                              r"spec\.pytorchReplicaSpecs\.Worker\.template .*at spec\.containers\[0\]: Additional "
                              r"properties are not allowed \('imagee' was unexpected\)")


def test_wrong_types_in_a_custom_resource_are_caught_by_its_crd(pytorchjob, crds):  # noqa: F811
    documents = copy.deepcopy(pytorchjob)
    documents[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "three"
    _refused(documents, crds, r"does not match the PyTorchJob CRD: at spec\.pytorchReplicaSpecs\.Worker\.replicas: "
                              r"'three' is not of type 'integer'")


def test_core_kinds_are_strict(crds):  # noqa: F811
    documents = copy.deepcopy(render(JOBS["k8s-pretrain-indexed-job.yaml"])[1])
    documents[1]["spec"]["publishNotReadyAdresses"] = True
    _refused(documents, crds, r"Service .* at spec: Additional properties are not allowed \('publishNotReadyAdresses'")
    documents = copy.deepcopy(render(JOBS["k8s-finetune.yaml"])[1])
    documents[1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = ["8"]
    _refused(documents, crds, r"Job .* at spec\.template\.spec\.containers\[0\]\.resources\.limits")


def test_a_custom_resource_without_its_crd_is_refused(pytorchjob, tmp_path):
    (tmp_path / "unrelated.yaml").write_text("kind: ConfigMap\napiVersion: v1\n")
    _refused(pytorchjob, tmp_path, r"no CRD schema for PyTorchJob kubeflow\.org/v1 in .*--crd-dir")
    _refused(pytorchjob, tmp_path / "missing", r"the CRD directory .*missing does not exist")


def test_batch_scripts_are_checked():
    text, _ = render(JOBS["slurm_local_cpu-pretrain.sbatch"])
    validate.validate_sbatch(text)
    with pytest.raises(validate.ValidationError, match="not valid bash"):
        validate.validate_sbatch(text.replace("done\n", "", 1))
    with pytest.raises(validate.ValidationError, match="comes after the first command"):
        validate.validate_sbatch(text + "#SBATCH --exclusive\n")
