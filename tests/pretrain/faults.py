"""Faults injected into finished checkpoints and runs, for the integrity, safe-loading and export tests."""
from __future__ import annotations

import json
import os
import pathlib

from pretrain import checkpoints, config, engine
from pretrain.launch import Rendezvous
from tests.pretrain.launching import TINY, free_port, settings

ONE_RANK = Rendezvous(0, 1, 0, "127.0.0.1", 0, "single")


def start_one_rank() -> Rendezvous:
    """A process group of one in this process, for ``train.run``."""
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ["DS_ACCELERATOR"] = "cpu"
        engine.init_distributed(Rendezvous(0, 1, 0, "127.0.0.1", free_port(), "single"), timeout_minutes=5)
    return ONE_RANK


def tiny_config(dataset, out, steps: int, **more) -> config.PretrainConfig:
    values = {"checkpoint.every_steps": 2, "checkpoint.keep_last": 5, **more}
    return config.load(TINY, [a for a in settings(dataset, out, steps=steps, **values) if a != "--set"])


def checkpoint_at(run_dir: pathlib.Path, step: int) -> checkpoints.Checkpoint:
    return next(c for c in checkpoints.complete(run_dir / "checkpoints") if c.step == step)


def truncate(file: pathlib.Path, keep: float = 0.5) -> None:
    """Cut the file, as a copy or a disk that filled up would."""
    size = file.stat().st_size
    with open(file, "r+b") as handle:
        handle.truncate(int(size * keep))


def alter(file: pathlib.Path, nbytes: int = 4096) -> None:
    """Overwrite a few KiB in the middle of the file with 0xff (NaN bit patterns in float data)."""
    size = file.stat().st_size
    with open(file, "r+b") as handle:
        handle.seek(size // 2)
        handle.write(b"\xff" * min(nbytes, size // 4))


def republish(checkpoint: checkpoints.Checkpoint) -> None:
    """Rewrite the marker over the files as they are now: what someone who altered the files on purpose
    (or a checkpoint from before markers listed checksums) would present."""
    info = {k: v for k, v in checkpoint.info.items() if k != "files"}
    checkpoints.publish(checkpoint.directory, checkpoint.tag, info)


class Payload:
    """Unpickling this object creates ``path``: a stand-in for any command a pickle could run."""

    def __init__(self, path: pathlib.Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant_payload(file: pathlib.Path, marker: pathlib.Path) -> None:
    """Add a ``Payload`` to a DeepSpeed checkpoint file (loaded here unsafely: the test wrote it)."""
    import torch

    saved = torch.load(file, map_location="cpu", weights_only=False)
    saved["innocent_looking_key"] = Payload(marker)
    torch.save(saved, file)


def summary(run_dir: pathlib.Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
