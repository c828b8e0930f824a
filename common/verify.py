"""Checking a dataset against its manifest: paths inside the directory, every shard present, of its size
and sha256, the totals adding up; the held-out split's evaluation shards as the training shards.
``python -m preprocess verify DIR`` runs all of it.

Imports nothing but the standard library and the format's rules, so every stage can verify a dataset.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

from common.errors import DatasetFormatError
from common.manifest import Manifest


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_shard_files(manifest: Manifest) -> None:
    """Every shard the manifest lists exists with the size it lists (cheap: no byte is read)."""
    for entry in manifest.shards:
        path = manifest.shard_path(entry)
        if not path.is_file():
            raise DatasetFormatError(f"{path}: shard listed in the manifest is missing; copy the whole dataset "
                                     "directory again, or re-run preprocessing")
        size = path.stat().st_size
        if entry.bytes is not None and size != entry.bytes:
            raise DatasetFormatError(f"{path}: {size} bytes but the manifest lists {entry.bytes}; the file is "
                                     "truncated or altered: copy it again, or re-run preprocessing")


def verify_shards(manifest: Manifest) -> int:
    """Hash every shard the manifest lists; the number verified.

    Raises ``DatasetFormatError`` naming the first shard that is missing or whose bytes differ.
    """
    for entry in manifest.shards:
        path = manifest.shard_path(entry)
        if not path.is_file():
            raise DatasetFormatError(f"{path}: shard listed in the manifest is missing; copy the whole dataset "
                                     "directory again, or re-run preprocessing")
        actual = file_sha256(path)
        if actual != entry.sha256:
            raise DatasetFormatError(f"{path}: sha256 {actual[:12]}… but the manifest lists {str(entry.sha256)[:12]}…; "
                                     "the shard was altered or damaged: copy it again, or re-run preprocessing")
    return len(manifest.shards)


def verify_dataset(directory: str | Path) -> str:
    """Check everything the manifest of ``directory`` says; a one-line summary, or ``DatasetFormatError``."""
    directory = Path(directory)
    manifest = Manifest.read(directory)
    started = time.perf_counter()
    tokenizer = manifest.tokenizer_path()
    if not tokenizer.is_dir():
        raise DatasetFormatError(f"{tokenizer}: the dataset's tokenizer is missing; copy the whole dataset again")
    splits = [manifest] + ([manifest.evaluation_split()] if manifest.evaluation is not None else [])
    for split in splits:  # the training shards, then the held-out split's
        split.check_totals()
        check_shard_files(split)
    count = sum(verify_shards(split) for split in splits)
    size = sum(split.shard_path(entry).stat().st_size for split in splits for entry in split.shards)
    held_out = "" if len(splits) == 1 else f" (with {splits[1].rows:,} evaluation rows in {len(splits[1].shards)})"
    return (f"{directory}: {count} shards, {sum(split.rows for split in splits):,} rows{held_out}, "
            f"{size / 2**20:,.1f} MiB verified against the manifest (sizes, row totals, sha256) in "
            f"{time.perf_counter() - started:.1f} s")


__all__ = ["check_shard_files", "file_sha256", "verify_dataset", "verify_shards"]
