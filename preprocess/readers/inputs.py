"""What every reader of input files shares (``preprocess.readers``): opening local paths and URIs, turning read errors
into one clear message, and expanding input patterns into files.

File-level problems (unreadable URI, truncated or corrupt compression) raise ``InputError``.
"""
from __future__ import annotations

import codecs
import fnmatch
import glob
import lzma
import os
import re
import zlib
from typing import IO

from common import storage
from common.errors import InputError

_GLOB_CHARS = re.compile(r"[*?\[]")
COMPRESSED_SUFFIXES = (".bz2", ".gz", ".xz", ".zst")  # what ``open_uri`` decompresses by extension


def is_compressed(uri: str) -> bool:
    return uri.endswith(COMPRESSED_SUFFIXES)


def source_name(uri: str) -> str:
    """The base name of a local path or URI ("s3://b/dumps/x.xml.bz2" -> "x.xml.bz2")."""
    return uri.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]


def _is_remote(uri: str) -> bool:
    return "://" in uri


def is_empty_local(uri: str) -> bool:
    # A 0-byte .bz2 raises EOFError like a truncated one; it is an empty file, not a truncated one.
    return not _is_remote(uri) and os.path.isfile(uri) and os.path.getsize(uri) == 0


def _open_hint(uri: str, exc: BaseException) -> str:
    if uri.startswith("s3://"):
        return ("check that the bucket and key exist, that AWS credentials are configured "
                "(AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an instance role) "
                "and, for a non-AWS store, that AWS_ENDPOINT_URL is set")
    if isinstance(exc, FileNotFoundError):
        return "the file does not exist; check the path (relative paths are resolved from the working directory)"
    if isinstance(exc, PermissionError):
        return "the file is not readable; check its permissions"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory; pass the files in it (or let expand_inputs list them)"
    return "check that the path or URI is right and readable from this machine"


def open_uri(uri: str, mode: str = "rb", decompress: bool = True) -> IO:
    """Open a local path or URI (``storage.open_file``), decompressing by extension (.bz2, .gz, .xz, ...).

    Args:
        uri: A local path or a URI smart_open understands (s3://, gs://, file://, ...).
        mode: The open mode, "rb" by default.
        decompress: False for the raw (seekable) bytes of a compressed file.

    Returns:
        A file object; close it (use ``with``).

    Raises:
        InputError: The URI cannot be opened; the message keeps the original reason.
    """
    try:
        return storage.open_file(uri, mode, decompress=decompress)
    except Exception as exc:  # FileNotFoundError, botocore ClientError, NoCredentialsError, ...
        raise InputError(f"cannot open {uri}: {type(exc).__name__}: {exc}; "
                         f"{_open_hint(uri, exc)}") from exc


def read_error(uri: str, exc: BaseException, decoded: int | None = None) -> InputError:
    """Turn an exception raised while reading (decompressing) a stream into one clear InputError."""
    if isinstance(exc, EOFError) and decoded == 0 and is_empty_local(uri):
        return InputError(f"{uri}: empty file (0 bytes); re-download it or remove it from the inputs")
    if isinstance(exc, EOFError):
        return InputError(
            f"{uri}: the compressed stream ends early (truncated download?): {exc}; "
            "re-download it and check its size and checksum")
    if isinstance(exc, (zlib.error, lzma.LZMAError)) or (
            isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, PermissionError))
            and any(w in str(exc).lower() for w in ("invalid data", "not a gzip", "corrupt",
                                                    "crc", "magic", "compressed"))):
        return InputError(
            f"{uri}: corrupt compressed data ({type(exc).__name__}: {exc}); "
            "the file is damaged — re-download it and check its checksum")
    return InputError(f"cannot read {uri}: {type(exc).__name__}: {exc}; {_open_hint(uri, exc)}")


class Utf8Check:
    """Finds the offset of the first byte that is not valid UTF-8 in a stream fed piece by piece."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.seen = 0
        self.bad_offset: int | None = None

    def feed(self, data: bytes, final: bool = False) -> None:
        if self.bad_offset is None:
            pending = len(self._decoder.getstate()[0])  # bytes of a character cut between pieces
            try:
                self._decoder.decode(data, final)
            except UnicodeDecodeError as exc:
                self.bad_offset = self.seen - pending + exc.start
        self.seen += len(data)


def _list_s3(uri: str) -> list[str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    match = _GLOB_CHARS.search(key)
    prefix = key[:match.start()] if match else key
    pattern = key if match else None
    found = []
    try:
        paginator = storage.s3_client().get_paginator("list_objects_v2")  # with our retries
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                name = obj["Key"]
                if name.endswith("/"):
                    continue  # a "folder" marker object
                if pattern is None and source_name(name).startswith("."):
                    continue
                if pattern is None or fnmatch.fnmatchcase(name, pattern):
                    found.append(f"s3://{bucket}/{name}")
    except Exception as exc:  # NoSuchBucket, AccessDenied, NoCredentialsError, endpoint errors
        raise InputError(f"cannot list {uri}: {type(exc).__name__}: {exc}; "
                         f"{_open_hint(uri, exc)}") from exc
    return found


def _list_dir(path: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if not name.startswith(".") and os.path.isfile(full):
                found.append(full)
    return found


def expand_inputs(uris: list[str]) -> list[str]:
    """Expand directories and glob patterns into a sorted, de-duplicated list of files.

    A local directory gives all regular files under it (recursively, hidden files and
    directories skipped); a local glob gives its matches; an s3:// URI ending in "/" or holding
    glob characters is listed with boto3 (AWS_ENDPOINT_URL is honoured by boto3). Anything else
    is passed through as is.

    Args:
        uris: Paths, URIs or patterns.

    Returns:
        The files, sorted by full URI, without duplicates.

    Raises:
        InputError: A directory or pattern matches no file, or an S3 listing fails.
    """
    result: set[str] = set()
    for uri in uris:
        if uri.startswith("s3://") and (uri.endswith("/") or _GLOB_CHARS.search(uri)):
            found = _list_s3(uri)
        elif not _is_remote(uri) and os.path.isdir(uri):
            found = _list_dir(uri)
        elif not _is_remote(uri) and glob.has_magic(uri):
            found = []
            for match in sorted(glob.glob(uri, recursive=True)):
                found.extend(_list_dir(match) if os.path.isdir(match) else [match])
        else:
            result.add(uri)
            continue
        if not found:
            raise InputError(f"{uri} matches no files; check the path or pattern")
        result.update(found)
    return sorted(result)


class WholeFileReader:
    """What most readers (``preprocess.readers.Reader``) share: a source's files listed by ``expand_inputs``, named by
    their base name, and read whole (a reader that can cut its files overrides ``splittable`` and ``pieces``)."""

    def files(self, paths) -> list[str]:
        return expand_inputs(list(paths))

    def label(self, uri: str) -> str:
        """The file's name in document ids and dead letters (unique within a source)."""
        return source_name(uri)

    def splittable(self, uri: str, spec=None) -> bool:
        return False

    def pieces(self, uri: str, size: int, count: int, spec=None, exact: bool = False) -> list[tuple[float, tuple]]:
        return []
