"""Which checkpoints exist and which are complete; publishing and pruning them.

A checkpoint is ``<run>/checkpoints/step_00001000/`` as written by DeepSpeed on every rank. It counts
only once ``COMPLETE`` exists in it: rank 0 writes that marker (atomically, by rename) after every rank
has returned from the save. A save that crashes midway leaves a directory without the marker, which
resume ignores and the next successful save removes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

MARKER = "COMPLETE"
_TAG = re.compile(r"step_(\d{8})")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


@dataclass(frozen=True)
class Checkpoint:
    directory: Path          # the parent passed to DeepSpeed
    tag: str
    step: int
    info: dict               # the marker's contents: world size, zero stage, consumed samples...

    @property
    def path(self) -> Path:
        return self.directory / self.tag


def complete(directory: Path) -> list[Checkpoint]:
    """Published checkpoints under ``directory``, oldest first."""
    found = []
    if directory.is_dir():
        for child in directory.iterdir():
            match = _TAG.fullmatch(child.name)
            if match and (child / MARKER).is_file():
                found.append(Checkpoint(directory, child.name, int(match.group(1)),
                                        json.loads((child / MARKER).read_text())))
    return sorted(found, key=lambda c: c.step)


def newest(directory: Path) -> Checkpoint | None:
    found = complete(directory)
    return found[-1] if found else None


def publish(directory: Path, tag: str, info: dict) -> None:
    """Mark ``directory/tag`` complete. Call on rank 0 after all ranks finished saving."""
    target = directory / tag / MARKER
    temporary = target.with_name(MARKER + ".tmp")
    temporary.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, target)


def prune(directory: Path, keep_last: int) -> list[str]:
    """Remove all but the newest ``keep_last`` complete checkpoints, and any unfinished ones older than
    the newest complete one (left by a crash). Returns the removed tags."""
    done = complete(directory)
    if not done:
        return []
    keep = {c.tag for c in done[-keep_last:]}
    removed = []
    for child in sorted(directory.iterdir()):
        match = _TAG.fullmatch(child.name)
        if not match or child.name in keep:
            continue
        if (child / MARKER).is_file() or int(match.group(1)) < done[-1].step:
            (child / MARKER).unlink(missing_ok=True)  # first, so a half-removed one is never taken as complete
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child.name)
    return removed
