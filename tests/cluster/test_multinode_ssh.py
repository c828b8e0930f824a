"""Multi-node pretraining without a scheduler: ``deepspeed --hostfile`` with two hosts, both this machine reached over
ssh, started through pdsh (the DeepSpeed launcher's default), one process per "node", on CPU."""
import os
import subprocess

from common import processes
from pretrain import checkpoints
from tests.cluster.live import STEPS, summary, tiny_run
from tests.pretrain.launching import RUN, TINY, environment, free_port, losses

pytest_plugins = ["tests.cluster.live"]


def test_deepspeed_hostfile_trains_on_two_ssh_nodes_like_two_local_processes(ssh_nodes, sample_dataset,
                                                                             two_rank_reference, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in ssh_nodes.hosts))
    # A remote process gets sshd's bare environment plus what the launcher exports: PYTHON*, the accelerator's
    # own variables (none for CPU) and every line of .deepspeed_env in the working directory or the home directory.
    # The CPU-kind caps go too (the AVX2 emulation): kernels of another instruction set round differently.
    caps = "".join(f"{name}={os.environ[name]}\n" for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
                   if name in os.environ)
    (tmp_path / ".deepspeed_env").write_text("DS_ACCELERATOR=cpu\nOMP_NUM_THREADS=1\n" + caps)
    out = tmp_path / "run"
    command = ["deepspeed", "--hostfile", str(hostfile), "--launcher", "pdsh", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), RUN, "--config", TINY, *tiny_run(sample_dataset, out)]
    result = processes.run(command, cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=300, env=environment(PATH=f"{ssh_nodes.bin}{os.pathsep}{os.environ['PATH']}"))
    assert result.returncode == 0, result.stdout[-5000:]
    # pdsh prefixes each remote line with its host: both nodes ran, and the launcher shipped the accelerator choice.
    for host in ssh_nodes.hosts:
        assert any(line.startswith(f"{host}: ") for line in result.stdout.splitlines()), host
    assert "export DS_ACCELERATOR=cpu" in result.stdout
    assert "micro-batch 16 x 2 ranks x 1 accumulation" in result.stdout
    assert summary(out)["status"] == "done" and summary(out)["world_size"] == 2
    final = checkpoints.newest(out / "checkpoints")
    assert final is not None and final.step == STEPS and final.info["world_size"] == 2
    # Same ranks, same data slices, same arithmetic: every step's loss equals the two local processes' run.
    assert losses(out) == two_rank_reference
