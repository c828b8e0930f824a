"""Fixtures and helpers of the multi-host tests (``test_netns_*.py``), as a pytest plugin
(``pytest_plugins = ["tests.cluster.multihost"]``): the hosts, the run they share, launching it across them, and what
"the same run" means (every loss, the final checkpoint's weights, the export's, bit for bit).
PYTEST_DONT_REWRITE (a plugin module: no assertion rewriting)
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import subprocess
import time

import pytest
import torch

from pretrain import checkpoints, engine
from tests.cluster.live import need
from tests.cluster.netns import Hosts, leftovers
from tests.pretrain.conftest import sample_dataset  # noqa: F401  (re-exported for the tests)
from tests.pretrain.launching import RUN, TINY, free_port, launch, losses, settings

__all__ = ["RUN", "TINY", "losses"]
STEPS = 24              # the tiny model: a few steps before a link is cut, and enough after it to compare runs
CHECKPOINT_EVERY = 4


def run_args(dataset, out, **more) -> list[str]:
    """The run every multi-host test launches (``--set`` arguments), with its export."""
    return settings(dataset, out, steps=STEPS, **{"checkpoint.every_steps": CHECKPOINT_EVERY,
                                                  "checkpoint.keep_last": 10, "checkpoint.export_hf": "true", **more})


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """``host-a`` and ``host-b``, each a network namespace with its own address, host name and sshd. A machine that
    cannot make them fails the test in CI (CI=true) and skips it elsewhere, with the reason."""
    reason = Hosts.available()
    need(reason is None, f"the multi-host tests cannot make hosts: {reason}")
    made = Hosts(tmp_path_factory.mktemp("hosts"), count=2)
    with made:
        yield made
    assert not leftovers(made.prefix), f"left behind: {leftovers(made.prefix)}"


@dataclasses.dataclass(frozen=True)
class Reference:
    run: pathlib.Path
    losses: dict[int, float]
    checkpoint: dict[str, torch.Tensor]   # the final checkpoint's fp32 weights (ZeRO's masters, consolidated)
    export: dict[str, torch.Tensor]       # hf/model.safetensors


def outcome(out: pathlib.Path, scratch: pathlib.Path) -> Reference:
    """What a finished run left: its losses, its final checkpoint's weights and its export's."""
    from safetensors.torch import load_file

    return Reference(out, losses(out), checkpoint_weights(out, STEPS, scratch),
                     load_file(out / "hf" / "model.safetensors"))


def checkpoint_weights(out: pathlib.Path, step: int, scratch: pathlib.Path) -> dict[str, torch.Tensor]:
    """The fp32 weights of the run's checkpoint at ``step`` (ZeRO's masters, consolidated)."""
    found = [c for c in checkpoints.complete(out / "checkpoints") if c.step == step]
    assert found, f"no complete checkpoint of step {step} in {out}"
    return engine.consolidate_checkpoint(found[0].directory, found[0].tag, found[0].info["zero_stage"],
                                         scratch / f"step-{step}")


def assert_equal_weights(mine: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(mine) == sorted(theirs), what
    different = [name for name in mine if not torch.equal(mine[name], theirs[name])]
    assert not different, f"{what}: {different[:5]} differ from the one-host run"


def step_seconds(out: pathlib.Path, first: int = 2, last: int = STEPS) -> float:
    """The median wall time of steps ``first`` to ``last`` of a run (its global batch over the logged sequences per
    second; step 1 holds the start-up)."""
    import json
    import statistics

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["consumed_samples"] / r["step"] / r["sequences_per_second"] for r in records
                             if first <= r["step"] <= last)


def assert_same_run(out: pathlib.Path, reference: Reference) -> None:
    got = outcome(out, out.parent / f"{out.name}-universal")
    assert sorted(got.losses) == list(range(1, STEPS + 1))
    assert got.losses == reference.losses, (got.losses, reference.losses)
    for what in ("checkpoint", "export"):
        assert_equal_weights(getattr(got, what), getattr(reference, what), what)


@pytest.fixture(scope="module")
def one_host_reference(sample_dataset, tmp_path_factory) -> Reference:
    """The same run on one host: two processes under torchrun on this machine (127.0.0.1)."""
    out = tmp_path_factory.mktemp("one-host") / "run"
    result = launch("torchrun", 2, run_args(sample_dataset, out))
    assert result.returncode == 0, result.stdout[-4000:]
    return outcome(out, out.parent / "universal")


def deepspeed_command(hosts: Hosts, workdir: pathlib.Path, args: list[str], *more: str) -> list[str]:
    """``deepspeed --hostfile`` over pdsh for one rank on each host, started from ``workdir`` on host-a (which
    must be the working directory: the launcher ships ``.deepspeed_env`` from there)."""
    hostfile = workdir / "hostfile"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in hosts.names))
    # A remote rank gets sshd's bare environment plus the launcher's exports: PYTHON*, and each line of
    # .deepspeed_env. The CPU-kind caps go too (kernels of another instruction set round differently).
    caps = "".join(f"{name}={os.environ[name]}\n" for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
                   if name in os.environ)
    (workdir / ".deepspeed_env").write_text("DS_ACCELERATOR=cpu\nOMP_NUM_THREADS=1\n" + caps)
    return ["deepspeed", "--hostfile", str(hostfile), "--launcher", "pdsh", "--master_port", str(free_port()),
            *more, RUN, "--config", TINY, *args]


def rank_hosts(output: str) -> dict[int, tuple[str, str]]:
    """Rank -> (host name, address) from rank 0's start-up line ("2 ranks on 2 hosts: host-a (10.77.0.1) rank 0;
    ...")."""
    line = re.search(r"\d+ ranks on \d+ hosts?: (.*)", output)
    assert line, "no line naming the ranks' hosts"
    found = {}
    for host, address, ranks in re.findall(r"(\S+) \(([^)]*)\) ranks? ([\d,-]+)", line.group(1)):
        for span in ranks.split(","):
            low, _, high = span.partition("-")
            found.update({r: (host, address) for r in range(int(low), int(high or low) + 1)})
    return found


@contextlib.contextmanager
def started_on_hosts(hosts: Hosts, commands: dict[str, list[str]], logs: pathlib.Path, **popen_arguments):
    """Each host's command started at once, its output to ``logs/<host>.log``; every session killed on leaving."""
    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        procs = {}
        for host, argv in commands.items():
            output = stack.enter_context(open(logs / f"{host}.log", "w"))
            procs[host] = stack.enter_context(hosts.started(host, argv, stdout=output, stderr=subprocess.STDOUT,
                                                            **popen_arguments))
        yield procs


def wait_all(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    return {host: proc.wait(timeout=max(0.1, deadline - time.monotonic())) for host, proc in procs.items()}


def run_on_hosts(hosts: Hosts, commands: dict[str, list[str]], *, timeout: float, cwd: pathlib.Path,
                 **popen_arguments) -> dict[str, tuple[int, str]]:
    """Each host's command run to the end at once: host -> (exit status, output)."""
    logs = cwd / "logs"
    with started_on_hosts(hosts, commands, logs, cwd=cwd, **popen_arguments) as procs:
        statuses = wait_all(procs, timeout)
    return {host: (status, (logs / f"{host}.log").read_text()) for host, status in statuses.items()}


def ranks_on(hosts: Hosts, host: str) -> list:
    """The pretraining ranks running on ``host`` (psutil processes: ``run.py`` started with ``--local_rank``)."""
    from tests.live_processes import alive, with_words

    return with_words(alive(hosts.pids(host)), "run.py", "--local_rank")


def wait_for_step(out: pathlib.Path, step: int, launcher: subprocess.Popen, log: pathlib.Path,
                  timeout: float = 180) -> None:
    """Until the run has logged ``step`` (the launcher still running)."""
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + timeout
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= step):
        assert launcher.poll() is None, f"the launcher ended ({launcher.returncode}):\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"step {step} not reached in {timeout:.0f} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.05)


def error_line(logs: pathlib.Path, rank: int) -> str:
    """The error line a rank printed (``error (rank N): ...``) in its log (``deepspeed --enable_each_rank_log``)."""
    files = sorted(logs.glob(f"*_rank{rank}.log"))
    assert files, f"no log of rank {rank} in {logs}"
    text = files[-1].read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith(f"error (rank {rank}): ")]
    assert len(lines) == 1, f"rank {rank}: {len(lines)} error lines:\n{text[-3000:]}"
    return lines[0]
