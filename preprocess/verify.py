"""Checking a dataset's shards against the sha256 values its manifest records.

Imports nothing but the standard library, so every stage can verify a dataset it is given.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from preprocess.schema import DatasetFormatError


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_shards(directory: Path, shards: list[dict]) -> int:
    """Hash every shard of ``directory`` listed in ``shards`` (manifest entries); the number verified.

    Raises ``DatasetFormatError`` naming the first shard that is missing or whose bytes differ.
    """
    for entry in shards:
        path = Path(directory) / entry["name"]
        if not path.is_file():
            raise DatasetFormatError(f"{path}: shard listed in the manifest is missing; copy the whole dataset "
                                     "directory again, or re-run preprocessing")
        actual = file_sha256(path)
        if actual != entry["sha256"]:
            raise DatasetFormatError(f"{path}: sha256 {actual[:12]}… but the manifest lists {entry['sha256'][:12]}…; "
                                     "the shard was altered or damaged: copy it again, or re-run preprocessing")
    return len(shards)


__all__ = ["file_sha256", "verify_shards"]
