"""Which checkpoints exist and which are complete; publishing and pruning them.

A checkpoint is ``<run>/checkpoints/step_00001000/`` as written by DeepSpeed on every rank. It counts
only once ``COMPLETE`` exists in it: rank 0 writes that marker (atomically, by rename) after every rank
has returned from the save. A save that crashes midway leaves a directory without the marker, which
resume ignores and the next successful save removes.

The marker also lists every file of the checkpoint with its size and sha256, so that a file truncated,
altered or lost after the save is found before anything reads it (``verify``). sha256 because it is the
hash the dataset manifests already use and, with the SHA extensions of current x86 and ARM CPUs, hashlib
reads it at disk speed; a faster non-cryptographic hash would not be in the standard library.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import CheckpointError, StorageError, storage_failure
from models import registry
from models.hf_io import is_complete, read_json_object

MARKER = "COMPLETE"
ON_CORRUPT = ("fallback", "fail")
_TAG = re.compile(r"step_(\d{8})")


class CorruptCheckpoint(CheckpointError):
    """A complete checkpoint whose files no longer match its marker, or that cannot be read safely."""


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
                # A link is never followed, not even to read the marker: ``verify`` refuses it, naming it.
                info = {} if _link_in(child) else json.loads((child / MARKER).read_text())
                found.append(Checkpoint(directory, child.name, int(match.group(1)), info))
    return sorted(found, key=lambda c: c.step)


def newest(directory: Path) -> Checkpoint | None:
    found = complete(directory)
    return found[-1] if found else None


def publish(directory: Path, tag: str, info: dict) -> None:
    """Mark ``directory/tag`` complete, listing its files' sizes and hashes. Call on rank 0 after all ranks
    finished saving (on a shared filesystem: rank 0 must see every rank's files)."""
    target = directory / tag / MARKER
    temporary = target.with_name(MARKER + ".tmp")
    listed = {**info, "files": file_list(directory / tag)}
    try:
        temporary.write_text(json.dumps(listed, indent=2, sort_keys=True) + "\n")
        os.replace(temporary, target)
    except OSError as error:
        failure = save_failure(error, directory, tag)
        if failure is None:
            raise
        raise failure from error


def save_failure(error: BaseException, directory: Path, tag: str) -> StorageError | None:
    """The one-line error for a save of ``directory/tag`` that failed for want of space or permission (None for
    any other failure): it names the checkpoint and the cause, and which complete checkpoint is kept."""
    try:
        kept = newest(directory)
    except OSError:  # the directory itself cannot be read
        kept = None
    note = (f"{kept.tag}, the newest complete checkpoint, is untouched and --resume continues from it" if kept
            else "no earlier checkpoint of this run is complete")
    if storage_failure(error, writing=True) is None and not (directory / tag).is_dir():
        try:  # DeepSpeed logs and drops a failure to create the directory; torch then finds no parent directory
            (directory / tag).mkdir(parents=True, exist_ok=True)
        except OSError as cause:
            error = cause
    return storage_failure(error, path=directory / tag, doing="writing the checkpoint", writing=True, note=note)


def file_list(path: Path) -> dict[str, dict]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` for every file under the checkpoint ``path``."""
    listed = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        name = file.relative_to(path).as_posix()
        if name not in (MARKER, MARKER + ".tmp"):
            listed[name] = {"bytes": file.stat().st_size, "sha256": sha256(file)}
    return listed


def sha256(file: Path) -> str:
    with open(file, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def verify(checkpoint: Checkpoint) -> int:
    """Check every file the marker lists: present, of the recorded size, with the recorded sha256.

    Raises ``CorruptCheckpoint`` naming the first file that differs; returns the number of files checked
    (0 for a marker written before markers listed files, which can only be trusted as it is).
    """
    fix = f"restore the file from a copy, or remove {checkpoint.path} to use an earlier checkpoint"
    link = _link_in(checkpoint.path)
    if link is not None:  # every later check, and DeepSpeed's loader, would read whatever it points at
        raise CorruptCheckpoint(f"{link}: a symbolic link (to {os.readlink(link)}) in a checkpoint marked {MARKER}; "
                                "a checkpoint holds its own files: copy the files themselves into it (cp -L), or "
                                f"remove {checkpoint.path} to use an earlier checkpoint")
    listed = checkpoint.info.get("files") or {}
    for name, recorded in sorted(listed.items()):
        file = checkpoint.path / name
        if not file.is_file():
            raise CorruptCheckpoint(f"{file}: missing, though {MARKER} lists it ({recorded['bytes']:,} bytes); {fix}")
        size = file.stat().st_size
        if size != recorded["bytes"]:
            raise CorruptCheckpoint(f"{file}: {size:,} bytes where {MARKER} recorded {recorded['bytes']:,} "
                                    f"(truncated or overwritten); {fix}")
        if sha256(file) != recorded["sha256"]:
            raise CorruptCheckpoint(f"{file}: its sha256 differs from the one {MARKER} recorded (the file was "
                                    f"altered after the save); {fix}")
    return len(listed)


def _link_in(path: Path) -> Path | None:
    """The first symbolic link at or under the checkpoint directory ``path`` (links are not followed), or None."""
    if path.is_symlink():
        return path
    for root, directories, files in os.walk(path):
        for name in sorted(directories + files):
            if (Path(root) / name).is_symlink():
                return Path(root) / name
    return None


def newest_intact(directory: Path, on_corrupt: str = "fallback", *,
                  check: Callable[[Checkpoint], object] | None = None,
                  warn: Callable[[str], None] | None = None) -> Checkpoint | None:
    """The newest complete checkpoint that passes ``verify`` (and ``check``, which raises CheckpointError).

    ``on_corrupt="fallback"`` skips a corrupt one with a warning naming the file and takes the next older;
    ``"fail"`` raises at the first. Returns None when there is no complete checkpoint; raises when every
    complete checkpoint is corrupt (there is nothing safe to resume from and starting over would hide it).
    """
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
    found = complete(directory)
    for position, candidate in enumerate(reversed(found)):
        try:
            verify(candidate)
            if check is not None:
                check(candidate)
            return candidate
        except CheckpointError as error:
            older = found[-position - 2] if position + 1 < len(found) else None
            if on_corrupt == "fail" or older is None:
                raise
            if warn is not None:
                warn(f"{error} -- falling back to {older.tag}")
    return None


def best(directory: Path, metric: str) -> Checkpoint | None:
    """The complete checkpoint whose evaluation (recorded in its marker by ``pretrain.train``) is best by ``metric``
    (lowest for a loss or perplexity, highest otherwise; the older of equals), or None when none records it."""
    from pretrain.evaluation import better

    chosen, value = None, None
    for candidate in complete(directory):
        figure = (candidate.info.get("evaluation") or {}).get(metric)
        if isinstance(figure, (int, float)) and better(metric, float(figure), value):
            chosen, value = candidate, float(figure)
    return chosen


def prune(directory: Path, keep_last: int, keep_best: str | None = None) -> list[str]:
    """Remove all but the newest ``keep_last`` complete checkpoints (and, with ``keep_best``, the best by that
    evaluation metric, ``best``), and any unfinished ones older than the newest complete one (left by a crash).
    Returns the removed tags."""
    done = complete(directory)
    if not done:
        return []
    keep = {c.tag for c in done[-keep_last:]}
    kept_best = best(directory, keep_best) if keep_best else None
    if kept_best is not None:
        keep.add(kept_best.tag)
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


# A run directory's Hugging Face export (``hf/``), written when the run finishes.

def is_complete_run_export(directory: str | Path) -> bool:
    """``models.hf_io.is_complete``, and for a family whose run exports more than one network (its
    ``export_parts``) each of its subdirectories too: an ELECTRA run's export without generator/ was cut short by an
    older, two-step export."""
    directory = Path(directory)
    if not is_complete(directory):
        return False
    try:
        model_type = read_json_object(directory / "config.json").get("model_type", "bert")
    except CheckpointError:  # not a JSON object: not an export this pipeline wrote whole
        return False
    parts = registry.family(model_type).export_parts if model_type in registry.MODEL_TYPES else ()
    return all(is_complete(directory / part) for part in parts)


def export_directory(run_directory: str | Path) -> Path:
    """Where a pretraining run directory holds its Hugging Face export (written when the run finishes)."""
    return Path(run_directory) / "hf"


def finished_export(run_directory: str | Path) -> Path | None:
    """The Hugging Face export of a pretraining run directory when it is there whole (``is_complete_run_export``),
    else None."""
    directory = export_directory(run_directory)
    return directory if is_complete_run_export(directory) else None
