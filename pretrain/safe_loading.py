"""Loading checkpoint files never runs code: pickles are read as weights only, DeepSpeed's loaders included.

DeepSpeed 0.19.8 passes ``weights_only=False`` to ``torch.load`` in its checkpoint engine, its ZeRO loaders and
its universal conversion. ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` makes torch override that argument on every call,
so ``weights_only_loading`` sets it around those calls. The few non-tensor types the files legitimately hold
are allowed by ``pretrain.engine`` (which alone knows DeepSpeed's) with ``torch.serialization.add_safe_globals``.
"""
from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path

import torch

from pretrain.checkpoints import CorruptCheckpoint

_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


def refuse_unsafe(path: Path) -> None:
    """Refuse a checkpoint directory holding a pickle that would import anything but the allowed types.

    Only the pickles' opcodes are read (nothing is executed), so the message can name the file; the loads
    themselves then run under ``weights_only_loading``, which is the guarantee.
    """
    for file in sorted(Path(path).rglob("*.pt")):
        try:
            code = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(file))
        except Exception as error:  # zipfile and torch raise their own types for a cut or foreign file
            raise CorruptCheckpoint(f"{file}: unreadable ({type(error).__name__}: {_first_line(error)}); the file "
                                    f"is truncated or not a checkpoint file: restore it from a copy, or remove "
                                    f"{path} to use an earlier checkpoint") from error
        if code:
            raise CorruptCheckpoint(f"{file}: refused to load: it would import {', '.join(code[:3])}, which a "
                                    "checkpoint of weights never needs (loading it could run code); use only "
                                    "checkpoints your own runs wrote, and remove this one")


@contextlib.contextmanager
def weights_only_loading(path: Path):
    """Every ``torch.load`` inside loads weights only, whatever its ``weights_only`` argument says.

    An environment variable, so it also reaches worker processes started inside (DeepSpeed's universal
    conversion has some). A pickle the weights-only unpickler refuses becomes a ``CorruptCheckpoint`` naming
    ``path``.
    """
    previous = os.environ.get(_FORCE)
    os.environ[_FORCE] = "1"
    try:
        yield
    except Exception as error:
        if isinstance(error, pickle.UnpicklingError) or "Weights only load failed" in str(error):
            raise CorruptCheckpoint(f"{path}: refused to load: it holds objects other than weights "
                                    f"({_first_line(error)}); use only checkpoints your own runs wrote") from error
        raise
    finally:
        if previous is None:
            os.environ.pop(_FORCE, None)
        else:
            os.environ[_FORCE] = previous


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else ""
