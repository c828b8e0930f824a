"""``python -m cluster render|submit slurm|k8s``: one command for every stage on Slurm and Kubernetes.

    python -m cluster render slurm --stage pretrain --cluster configs/cluster/slurm_pyxis.yaml \\
        --config configs/pretrain/bert_large_phase1_seq128.yaml --set data.path=/lustre/data/seq128
    python -m cluster submit k8s --stage finetune --cluster configs/cluster/k8s.yaml \\
        --config configs/finetune/default.yaml -- --checkpoint /checkpoints/run/hf --data /data --output /checkpoints/ft

``render`` and ``submit --dry-run`` print exactly what would be submitted (validated first); ``submit`` submits it
and prints the job id and where its logs go. After ``--`` go the stage's own arguments: inputs, tokenizer and
output for preprocessing (``python -m preprocess run``), checkpoint, data, output and tasks for finetuning
(``python -m finetune suite``); pretraining takes everything from its config (``--set``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cluster import credentials, stages, submit, validate
from cluster import site as site_module
from common.configlib import ConfigError


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The cluster's options, and the stage's own arguments (everything after the first ``--``)."""
    stage_arguments: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, stage_arguments = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(prog="python -m cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("render", "submit"))
    parser.add_argument("scheduler", choices=("slurm", "k8s"))
    parser.add_argument("--stage", required=True, choices=stages.STAGES)
    parser.add_argument("--cluster", required=True, metavar="SITE.yaml",
                        help="a site file, e.g. configs/cluster/k8s.yaml")
    parser.add_argument("--config", required=True, metavar="STAGE.yaml", help="the stage's config, e.g. "
                        "configs/pretrain/bert_large_phase1_seq128.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a value of the stage config (repeatable), e.g. --set data.path=DIR")
    parser.add_argument("--site-set", dest="site_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a value of the site file (repeatable), e.g. --site-set nodes=2")
    parser.add_argument("--name", help="the job's name (default: bert-STAGE-CONFIGNAME)")
    parser.add_argument("--crd-dir", help="CRD files for validating PyTorchJob/MPIJob (default: "
                                          f"${validate.CRD_DIR_VARIABLE} or ../shared/data/k8s-crds next to the "
                                          "repository)")
    parser.add_argument("--dry-run", action="store_true", help="submit: print what would be submitted, submit nothing")
    return parser.parse_args(argv), stage_arguments


def render(args: argparse.Namespace, stage_arguments: list[str]) -> tuple[str, object, dict]:
    """(text to submit, the rendered object, facts for submission). Everything is checked and validated here."""
    site = site_module.load(args.cluster, args.site_overrides)
    job = stages.prepare(args.stage, args.config, args.overrides, stage_arguments, args.name)
    stages.check_world_size(job, site.world_size())
    stages.check_parts(job, site)
    workdir = site_module.resolve_workdir(site, Path.cwd())
    given = validate.given_values(site, args.cluster, args.site_overrides, job)
    if args.scheduler == "slurm":
        from cluster import slurm

        log_dir = site_module.resolve_log_dir(site, workdir)
        scripts = slurm.render(job, site, workdir=workdir, log_dir=log_dir, site_source=args.cluster)
        validate.refuse_credentials(given, validate.script_texts(scripts))
        for script in scripts:
            validate.validate_sbatch(script.text)
        return slurm.joined(scripts), scripts, {"log_dir": log_dir}
    from cluster import k8s

    documents = k8s.render(job, site, workdir=workdir)
    validate.refuse_credentials(given, validate.manifest_texts(documents))
    validate.validate_manifests(documents, site.kubernetes.version, validate.crd_dir(args.crd_dir))
    return k8s.to_yaml(documents), documents, {"context": site.kubernetes.context}


def main(argv: list[str] | None = None) -> int:
    args, stage_arguments = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        text, rendered, facts = render(args, stage_arguments)
    except ConfigError as error:
        _print_error(error)
        return 2
    if args.action == "render" or args.dry_run:
        sys.stdout.write(text)
        if args.dry_run:
            would = (submit.would_run(facts["log_dir"], rendered) if args.scheduler == "slurm"
                     else [" ".join(submit.kubectl_command(facts["context"]))])
            print(f"dry run: nothing submitted; would run: {'; '.join(would)}", file=sys.stderr)
        return 0
    try:
        if args.scheduler == "slurm":
            result = submit.submit_slurm(rendered, log_dir=facts["log_dir"])
        else:
            result = submit.submit_kubernetes(text, rendered, context=facts["context"])
    except (submit.SubmitError, OSError) as error:
        _print_error(error)
        return 1
    print("\n".join(result.lines))
    return 0


def _print_error(error: Exception) -> None:
    """One ``error:`` line per line of the message. A message may quote what it refuses (a bad value, a stage's
    unrecognised argument, a scheduler's reply): a credential in it is shown redacted."""
    for line in str(error).splitlines() or [""]:
        print(f"error: {credentials.redact(line)}", file=sys.stderr)
