"""Checking a dataset against its manifest: paths inside the directory, every shard present, of its size
and sha256, the totals adding up. ``python -m preprocess verify DIR`` runs all of it.

Imports nothing but the standard library and the format's rules, so every stage can verify a dataset.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from common.schema import MANIFEST_NAME, DatasetFormatError, check_manifest


def inside(directory: Path, name: str, what: str) -> Path:
    """``directory / name``, refusing a ``name`` from the manifest that could point outside ``directory``."""
    relative = Path(str(name))
    if not str(name) or relative.is_absolute() or ".." in relative.parts:
        raise DatasetFormatError(f"{Path(directory) / MANIFEST_NAME}: {what} {name!r} is not a relative path inside "
                                 "the dataset directory; the manifest was altered: re-run preprocessing")
    return Path(directory) / relative


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
        path = inside(Path(directory), entry["name"], "shard name")
        if not path.is_file():
            raise DatasetFormatError(f"{path}: shard listed in the manifest is missing; copy the whole dataset "
                                     "directory again, or re-run preprocessing")
        actual = file_sha256(path)
        if actual != entry["sha256"]:
            raise DatasetFormatError(f"{path}: sha256 {actual[:12]}… but the manifest lists {entry['sha256'][:12]}…; "
                                     "the shard was altered or damaged: copy it again, or re-run preprocessing")
    return len(shards)


def verify_dataset(directory: str | Path) -> str:
    """Check everything the manifest of ``directory`` says; a one-line summary, or ``DatasetFormatError``."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise DatasetFormatError(f"{directory}: no {MANIFEST_NAME}; the preprocessing run did not finish (or this is "
                                 "not a dataset directory)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DatasetFormatError(f"{manifest_path}: not readable JSON ({error}); copy it again, or re-run "
                                 "preprocessing") from None
    check_manifest(manifest, str(directory))
    started = time.perf_counter()
    tokenizer = inside(directory, manifest["tokenizer"]["dir"], "tokenizer.dir")
    if not tokenizer.is_dir():
        raise DatasetFormatError(f"{tokenizer}: the dataset's tokenizer is missing; copy the whole dataset again")
    listed = sum(int(entry["rows"]) for entry in manifest["shards"])
    if listed != int(manifest["rows"]):
        raise DatasetFormatError(f"{manifest_path}: its shards hold {listed} rows but it lists {manifest['rows']} in "
                                 "all; the manifest was altered or some shards are missing from it")
    for entry in manifest["shards"]:
        path = inside(directory, entry["name"], "shard name")
        if path.is_file() and "bytes" in entry and path.stat().st_size != entry["bytes"]:
            raise DatasetFormatError(f"{path}: {path.stat().st_size} bytes but the manifest lists {entry['bytes']}; "
                                     "the file is truncated or altered: copy it again, or re-run preprocessing")
    count = verify_shards(directory, manifest["shards"])
    size = sum(path.stat().st_size for path in (directory / e["name"] for e in manifest["shards"]))
    return (f"{directory}: {count} shards, {listed:,} rows, {size / 2**20:,.1f} MiB verified against the manifest "
            f"(sizes, row totals, sha256) in {time.perf_counter() - started:.1f} s")


__all__ = ["file_sha256", "inside", "verify_dataset", "verify_shards"]
