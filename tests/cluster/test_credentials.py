"""Credentials by value: what cluster.credentials recognises and what it leaves alone (both directions, one table
each), that no message repeats a credential, and that a credential reaching a job from the site file, an option or
a stage argument is refused on Slurm and Kubernetes, naming its source and the fix, by ``python -m cluster`` too.

The tokens below are made up, and split where they are written so that secret scanners leave this file alone."""
import pytest
import yaml

from cluster import credentials, validate
from common.configlib import ConfigError
from tests.cluster.rendering import GOLDEN, JOBS, REPO, render
from tests.cluster.test_cli import cluster, fake_client

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
GITHUB = "ghp_" + "0123456789abcdefghijABCDEFGHIJ123456"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
JWT = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
HEX40 = "9f8e7d6c5b4a39281706f5e4d3c2b1a0" + "9f8e7d6c"

# (text, what it is, the name it is assigned to, the credential itself)
FOUND = [
    (f"export HF_TOKEN={HF}", "Hugging Face token", "HF_TOKEN", HF),
    (f"--comment={GITHUB}", "GitHub token", "--comment", GITHUB),
    ("git clone https://x:" + "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz@github.com/o/r",
     "GitHub token", None, None),
    ("token: gho_" + "0123456789abcdefghijABCDEFGHIJ123456", "GitHub token", "token", None),
    ("SLACK=xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "Slack token", "SLACK", None),
    ("glpat-" + "AbCdEf1234567890XyZw", "GitLab token", None, None),
    ("OPENAI_API_KEY=sk-" + "proj-AbCdEf1234567890AbCdEf1234567890", "OpenAI-style API key", "OPENAI_API_KEY", None),
    ("key=AIza" + "SyA1234567890abcdefghijklmnopqrstuv", "Google API key", "key", None),
    (f"AWS_ACCESS_KEY_ID={AWS_ID}", "AWS access key id", "AWS_ACCESS_KEY_ID", AWS_ID),
    (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", "40-character secret key", "AWS_SECRET_ACCESS_KEY", AWS_SECRET),
    (f"Authorization: Bearer {JWT}", "JSON Web Token", None, JWT),
    ("SLACK_WEBHOOK_URL=https://hooks.slack.com/services/" + "T0000000/B0000000/XXXXXXXXXXXXXXXXXXXXXXXX",
     "Slack webhook URL", "SLACK_WEBHOOK_URL", None),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key", None, None),
    ("-----BEGIN RSA PRIVATE KEY-----", "private key", None, None),
    ("--wikipedia https://alice:" + "s3cr3tPass@example.org/dumps/enwiki.xml.bz2", "URL with a password",
     "--wikipedia", "https://alice:s3cr3tPass@example.org"),
    ("redis://:" + "hunter22@cache:6379/0", "URL with a password", None, None),
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9v==;"
     "EndpointSuffix=core.windows.net", "Azure storage key", "AccountKey", "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9v=="),
    ("https://acct.blob.core.windows.net/c/x?sv=2022-11-02&ss=b&sig=" + "AbCdEf0123456789%2Bxyz%3D",
     "Azure shared access signature", "sig", None),
    (f"FOO_SECRET: {HEX40}", "random-looking value", "FOO_SECRET", HEX40),
    ("--api-key 'Q2xhdWRlIGlzIGEgdGVzdCBrZXk4Nzc2NQ'", "random-looking value", "--api-key", None),
    ('"auth_token": "Zx81Kq0pLm3NvB7cT5yR2wA9"', "random-looking value", "auth_token", None),
    ("export PGPASSWORD='hunter 22'", "password", "PGPASSWORD", "hunter 22"),
    ("--password=correcthorsebatterystaple", "password", "--password", None),
]

# What the renderers and sites legitimately hold
LEFT_ALONE = [
    "export HF_HOME=/scratch/bert/hf-cache",
    "export TOKENIZERS_PARALLELISM=false",                       # TOKEN as part of a word is no credential
    "--tokenizer /data/tokenizers/wiki-books-30k",
    "--books s3://corpora/books/ --output s3://datasets/seq128",  # object stores without user information
    "gs://bucket/path/to/shard-00001-of-00064.arrow",
    "image: nvcr.io/nvidia/pytorch@sha256:" + "0123456789abcdef" * 4,
    "commit: 3e02677a9d1c0b5e2f4a6c8d0e1f2a3b4c5d6e7f",           # hashes assigned to names that hold no secret
    "sha256: 9f86d081884c7d659a2feaa0c55ca3b4c5d6e7f83e02677a9d1c0b5e2f4a6c8d",
    'export HF_TOKEN="${HF_TOKEN}"',                             # references, expanded where the job runs
    "export HF_TOKEN=$HF_TOKEN",
    "HF_TOKEN=$(HF_TOKEN)",
    "export WANDB_API_KEY=$(cat /run/secrets/wandb)",
    "https://${USER}:${PASSWORD}@example.org/x",
    "SSH_KEY=/home/me/.ssh/id_ed25519",                          # a path assigned to a credential's name
    "secretKeyRef: {name: s3-credentials, key: secret_access_key}",
    "imagePullSecrets: [{name: ghcr-pull-credentials-for-org-xyz}]",
    "ssh://git@github.com:22/org/repo.git",
    'scheduler="tcp://$head:8786"',
    "#SBATCH --container-mounts=/lustre/fsw/bert:/lustre/fsw/bert",
    "--password-stdin",
    "--disk-cache-directory-for-everything sk-learn-is-a-library-name-here",
    "mask_token: '[MASK]'",
    "API_TOKEN=my-very-long-but-boring-token-name",               # words, not a random value
]


@pytest.mark.parametrize("text, kind, name, value", FOUND, ids=[row[1] + f" {i}" for i, row in enumerate(FOUND)])
def test_credential_is_found_and_named_without_its_value(text, kind, name, value):
    (finding,) = credentials.find(text)
    assert kind in finding.kind and finding.name == name
    if value is not None:
        assert finding.value == value
    message = finding.describe()
    secret = value or finding.value
    assert secret not in message and secret not in repr(finding)
    assert secret not in credentials.redact(text)
    if kind == "URL with a password":
        assert "hunter22" not in message and "s3cr3tPass" not in message and "…@" in message


@pytest.mark.parametrize("text", LEFT_ALONE)
def test_what_the_project_renders_is_left_alone(text):
    assert credentials.find(text) == []
    assert credentials.redact(text) == text


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("--password", True), ("apiKey", True), ("AccountKey", True), ("X-Auth-Token", True),
    ("PGPASSWORD", True), ("client_secret", True), ("GOOGLE_APPLICATION_CREDENTIALS", True),
    ("TOKENIZERS_PARALLELISM", False), ("--tokenizer", False), ("MONKEY", False), ("AUTHOR", False),
    ("image_pull_policy", False), ("HF_HOME", False),
])
def test_credential_names_are_whole_words(name, secret):
    assert credentials.is_secret_name(name) is secret


def test_redacted_forms_show_little():
    assert credentials.find(f"X_TOKEN={HF}")[0].redacted == "hf_A…"
    assert credentials.find("--password=hunter22")[0].redacted == "…"  # short: not even 4 characters
    url = "ftp://bob:" + "pw12345678@files.example.org/x"
    assert credentials.find(url)[0].redacted == "ftp://…@files.example.org"


@pytest.mark.parametrize("golden", sorted(JOBS), ids=str)
def test_the_golden_renders_hold_no_credential(golden):
    """The shipped sites render nothing credential-shaped (they reference Secrets by name)."""
    for number, line in enumerate((GOLDEN / golden).read_text().splitlines(), start=1):
        assert credentials.find(line) == [], f"{golden}:{number}"


# ------------------------------------------------------------------------------------------------ refusal

SLURM_PREPROCESS = ["slurm", "--stage", "preprocess", "--config", "configs/preprocess/tiny.yaml"]
K8S_PREPROCESS = ["k8s", "--stage", "preprocess", "--config", "configs/preprocess/tiny.yaml"]
PREPROCESS_ARGUMENTS = {"slurm": ["--books", "samples/books", "--tokenizer", "/srv/t", "--output", "/srv/data/x"],
                        "k8s": ["--books", "s3://corpora/books/", "--tokenizer", "/data/t", "--output", "s3://x/y"]}
SHIPPED = {"slurm": "slurm_venv.yaml", "k8s": "k8s.yaml"}


def _site(tmp_path, shipped: str, *, env=None, setup=None, extra_sbatch=None) -> str:
    """A copy of a shipped site with a value injected."""
    site = yaml.safe_load((REPO / "configs" / "cluster" / shipped).read_text())
    if env:
        site.setdefault("env", {}).update(env)
    if setup:
        site["setup"] = [*site.get("setup", []), setup]
    if extra_sbatch:
        slurm = site.setdefault("slurm", {})
        slurm["extra_sbatch"] = [*slurm.get("extra_sbatch", []), extra_sbatch]
    path = tmp_path / f"site-{shipped}"
    path.write_text(yaml.safe_dump(site))
    return str(path)


def _refusal(arguments) -> str:
    with pytest.raises(ConfigError) as refused:
        render(arguments)
    return str(refused.value)


INJECTED = {  # where: (site values, stage arguments, what the message names, the credential)
    "env": ({"env": {"HF_TOKEN": HF}}, [], "{site}: env.HF_TOKEN", HF),
    "setup": ({"setup": f"export WANDB_API_KEY={HEX40}"}, [], "{site}: setup[{last}]", HEX40),
    "extra_sbatch": ({"extra_sbatch": f"--comment={GITHUB}"}, [], "{site}: slurm.extra_sbatch[{last_sbatch}]", GITHUB),
    "stage argument": ({}, ["--wikipedia", "https://alice:s3cr3tPass@example.org/enwiki.xml.bz2"],
                       "the stage argument --wikipedia after '--'", "s3cr3tPass"),
    "beam option": ({}, [f"--s3_secret_access_key={AWS_SECRET}"],
                    "the stage argument --s3_secret_access_key after '--'", AWS_SECRET),
}


@pytest.mark.parametrize("scheduler", ["slurm", "k8s"])
@pytest.mark.parametrize("where", sorted(INJECTED))
def test_an_injected_credential_is_refused_naming_its_source(tmp_path, scheduler, where):
    """On Kubernetes setup and extra_sbatch are not rendered, but the site file holding them is refused all the same."""
    values, stage_arguments, names, secret = INJECTED[where]
    shipped = SHIPPED[scheduler]
    site = _site(tmp_path, shipped, **values)
    base = SLURM_PREPROCESS if scheduler == "slurm" else K8S_PREPROCESS
    message = _refusal([*base, "--cluster", site, "--", *PREPROCESS_ARGUMENTS[scheduler], *stage_arguments])
    loaded = yaml.safe_load(open(site))
    expected = names.format(site=site, last=len(loaded.get("setup", [])) - 1,
                            last_sbatch=len(loaded.get("slurm", {}).get("extra_sbatch", [])) - 1)
    assert len(message.splitlines()) == 1 and message.startswith(expected + ": ")
    assert message.endswith(validate.CREDENTIAL_FIX) and secret not in message


@pytest.mark.parametrize("golden", sorted(JOBS), ids=str)
def test_every_stage_and_form_is_scanned(tmp_path, golden):
    """A credential in the site's env is refused in every job the golden files hold, whatever stage and form."""
    arguments = list(JOBS[golden])
    shipped = arguments[arguments.index("--cluster") + 1].rsplit("/", 1)[1]
    arguments[arguments.index("--cluster") + 1] = site = _site(tmp_path, shipped, env={"DEPLOY_KEY": AWS_SECRET})
    message = _refusal(arguments)
    assert message == (f"{site}: env.DEPLOY_KEY: a 40-character secret key (AWS-style) (wJal…) assigned to "
                       f"DEPLOY_KEY: {validate.CREDENTIAL_FIX}")


def test_nothing_rendered_escapes_the_scan():
    """Whatever a credential's source, the rendered field is named when no given value holds it."""
    _, documents = render(JOBS["k8s-pretrain-pytorchjob.yaml"])
    documents[1]["metadata"]["labels"]["team"] = GITHUB
    documents[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"] = {JWT: "true"}
    documents[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"] += [
        "--token", HF]
    with pytest.raises(ConfigError) as refused:
        validate.refuse_credentials([], validate.manifest_texts(documents))
    assert str(refused.value).splitlines() == [
        f"PyTorchJob bert-pretrain-bert-large-phase1-seq128: metadata.labels.team: a GitHub token (ghp_…): "
        f"{validate.CREDENTIAL_FIX}",
        "PyTorchJob bert-pretrain-bert-large-phase1-seq128: spec.pytorchReplicaSpecs.Master.template.spec."
        f"nodeSelector.eyJh… (the key): a JSON Web Token (eyJh…): {validate.CREDENTIAL_FIX}",
        "PyTorchJob bert-pretrain-bert-large-phase1-seq128: spec.pytorchReplicaSpecs.Worker.template.spec."
        f"containers[0].args: a Hugging Face token (hf_A…) assigned to --token: {validate.CREDENTIAL_FIX}"]

    _, scripts = render(JOBS["slurm_local_cpu-pretrain.sbatch"])
    script = scripts[0]
    leaked = type(script)(script.text.replace("set -uo pipefail", f"set -uo pipefail\nexport X_TOKEN={HF}"),
                          script.log_pattern, script.name)
    with pytest.raises(ConfigError, match=r"^the batch script bert-pretrain-tiny, line \d+: a Hugging Face token "
                                          r"\(hf_A…\) assigned to X_TOKEN: reference a Kubernetes Secret"):
        validate.refuse_credentials([], validate.script_texts([leaked]))


@pytest.mark.parametrize("scheduler, client", [("slurm", "sbatch"), ("k8s", "kubectl")])
def test_submission_is_refused_before_the_scheduler_is_called(tmp_path, scheduler, client):
    read = fake_client(tmp_path / "bin", client, "1")
    site = _site(tmp_path, SHIPPED[scheduler], env={"HF_TOKEN": HF})
    base = SLURM_PREPROCESS if scheduler == "slurm" else K8S_PREPROCESS
    result = cluster("submit", *base, "--cluster", site, "--site-set", f"log_dir={tmp_path / 'logs'}", "--",
                     *PREPROCESS_ARGUMENTS[scheduler], path_first=str(tmp_path / "bin"))
    assert result.returncode == 2 and result.stderr.startswith(f"error: {site}: env.HF_TOKEN: a Hugging Face token")
    with pytest.raises(FileNotFoundError):
        read()  # never called
    assert not (tmp_path / "logs").exists()


def test_references_to_secrets_and_inherited_variables_pass(tmp_path):
    site = _site(tmp_path, "slurm_venv.yaml", setup='export HF_TOKEN="${HF_TOKEN:?export HF_TOKEN before sbatch}"',
                 env={"TOKENIZERS_PARALLELISM": "false"})
    text, _ = render([*SLURM_PREPROCESS, "--cluster", site, "--", *PREPROCESS_ARGUMENTS["slurm"]])
    assert "export TOKENIZERS_PARALLELISM=false" in text


def test_the_command_exits_with_one_line_per_credential(tmp_path):
    site = _site(tmp_path, "slurm_venv.yaml", env={"HF_TOKEN": HF}, extra_sbatch=f"--comment={GITHUB}")
    result = cluster("render", *SLURM_PREPROCESS, "--cluster", site, "--", *PREPROCESS_ARGUMENTS["slurm"])
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert [line.split(": a ", 1)[0] for line in lines] == [f"error: {site}: env.HF_TOKEN",
                                                            f"error: {site}: slurm.extra_sbatch[1]"]
    assert all(line.endswith(validate.CREDENTIAL_FIX) for line in lines)
    assert HF not in result.stderr and GITHUB not in result.stderr and "Traceback" not in result.stderr


def test_a_message_that_quotes_a_credential_shows_it_redacted():
    """Other refusals may quote what they refuse (here a stage's unrecognised argument): the command redacts it."""
    result = cluster("render", "slurm", "--stage", "pretrain", "--cluster", "configs/cluster/slurm_local_cpu.yaml",
                     "--config", "configs/pretrain/tiny.yaml", "--", f"--token={HF}")
    assert result.returncode == 2 and "pretraining takes no arguments" in result.stderr
    assert HF not in result.stderr and "hf_A…" in result.stderr
