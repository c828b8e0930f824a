"""File I/O on local paths and object-store URIs (smart_open for object stores, the standard library locally).

Local writes go to a temporary name and are renamed into place, so a reader never sees half a file.
Object stores make an object visible only when its upload completes, which gives the same guarantee.
"""
from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

# What smart_open's infer_from_extension does for these, with the same modules; .zst is ours (``_ZstdReader``:
# smart_open needs Python 3.14's compression.zstd or the backports.zstd package for it); .lz4 goes through smart_open.
_LOCAL_CODECS = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}


class _ZstdReader(io.RawIOBase):
    """The decompressed bytes of a zstd stream of one or more frames, read with the zstandard package (which Apache
    Beam requires). Unlike zstandard's own stream reader, a stream that ends inside a frame raises ``EOFError`` (a
    truncated download), and corrupt data an ``OSError`` whose message says so, as the other codecs do."""

    def __init__(self, raw: IO[bytes]):
        import zstandard

        self._raw, self._zstd = raw, zstandard
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._pending, self._offset, self._started = b"", 0, False  # decompressed bytes, and how many were read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._offset == len(self._pending):
            data = self._frame.unused_data if self._frame.eof else b""
            if self._frame.eof:
                self._frame = self._zstd.ZstdDecompressor().decompressobj()
                self._started = False
            data = data or self._raw.read(1 << 20)
            if not data:
                if self._started:
                    raise EOFError("the zstd stream ends inside a frame")
                return 0
            self._started = True
            try:
                self._pending, self._offset = self._frame.decompress(data), 0
            except self._zstd.ZstdError as exc:
                raise OSError(f"corrupt zstd data: {exc}") from None
        # An offset, not a shorter copy each time: a megabyte of input can decompress to tens of megabytes.
        size = min(len(buffer), len(self._pending) - self._offset)
        buffer[:size] = memoryview(self._pending)[self._offset:self._offset + size]
        self._offset += size
        return size

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def _open_zstd(raw: IO[bytes], mode: str, **text) -> IO:
    if "r" not in mode:
        raise ValueError("writing .zst files is not supported; read them only")
    stream = io.BufferedReader(_ZstdReader(raw), 1 << 20)
    return stream if "b" in mode else io.TextIOWrapper(stream, **text)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def join(base: str, *parts: str) -> str:
    if is_local(base):
        return os.path.join(local_path(base), *parts)
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


# Object stores throttle (503 SlowDown), fail (500) and drop connections; botocore's "standard" retry mode retries
# those with exponential backoff and jitter, each wait capped at 20 s. Its default of 3 attempts gives up within
# seconds of a throttling burst; 10 ride one out, and a fault that outlasts them fails the request (and the run)
# with the store's own error. AWS_RETRY_MODE and AWS_MAX_ATTEMPTS, when set, win (botocore's variables).
S3_RETRY_MODE = "standard"
S3_MAX_ATTEMPTS = 10


def s3_retries() -> dict:
    """The retry settings every S3 client of ours uses (``s3_client``, and smart_open through it)."""
    return {"mode": os.environ.get("AWS_RETRY_MODE", S3_RETRY_MODE),  # total_max_attempts counts the first try,
            "total_max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS", S3_MAX_ATTEMPTS))}  # as the variable does


# How an object-store failure reads once Beam has turned it into text (a worker's exception crosses a process).
_STORE_FAILURE = re.compile(r"botocore\.exceptions\.(\w+): (.*?)(?: \[while running '([^']+)'\])?$", re.M)


def store_failure(error: BaseException) -> str | None:
    """What an object store's failure says, in one line, when ``error`` is one (on it, in its chain, or in its
    text after Beam re-raised it elsewhere): the operation, the store's error and the retries spent; else None."""
    seen, current = set(), error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__module__.startswith("botocore"):
            return f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    found = _STORE_FAILURE.search(str(error))
    if found is None:
        return None
    name, message, step = found.groups()
    return f"{name}: {message}" + (f" (in {step})" if step else "")


def s3_client():
    import boto3  # honours AWS_ENDPOINT_URL, so S3-compatible servers work without code changes
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries=s3_retries()))


def _split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def _fsspec(uri: str):
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(f"listing {uri} needs fsspec and its backend for this scheme") from exc
    return fsspec.core.url_to_fs(uri)


def open_file(uri: str, mode: str = "rb", decompress: bool = False) -> IO:
    """Open a local path or object-store URI for reading or writing, decompressing by extension when asked.

    Local files open with the standard library: importing smart_open imports every transport's client library
    (boto3, google-cloud-storage) in each process, which a local run never uses.
    Text modes read and write UTF-8.
    """
    text = {} if "b" in mode else {"encoding": "utf-8"}
    zstd = decompress and uri.lower().endswith(".zst")
    if zstd:
        return _open_zstd(open_file(uri, "rb"), mode, **text)
    if is_local(uri):
        path = local_path(uri)
        extension = os.path.splitext(path)[1].lower()
        if not decompress or extension != ".lz4":
            codec = _LOCAL_CODECS.get(extension) if decompress else None
            if codec is None:
                return open(path, mode, **text)
            return codec(path, mode if "b" in mode else mode.rstrip("t") + "t", **text)
    import smart_open

    transport = {"client": s3_client()} if uri.startswith("s3://") else {}  # the same retries for every S3 call
    return smart_open.open(uri, mode, compression="infer_from_extension" if decompress else "disable",
                           transport_params=transport, **text)


def _umask() -> int:
    """The process's file-creation mask."""
    try:
        with open("/proc/self/status") as status:  # Linux: read without setting it
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere reading it means setting it, so it is set straight back
    os.umask(mask)
    return mask


@contextmanager
def open_write(uri: str, binary: bool = True):
    """Open ``uri`` for writing; the file appears complete or not at all."""
    mode = "wb" if binary else "w"
    if is_local(uri):
        path = local_path(uri)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path) or ".")
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from the rest of the team
        try:
            with os.fdopen(fd, mode, **({} if binary else {"encoding": "utf-8"})) as handle:
                yield handle
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    else:
        with open_file(uri, mode) as handle:
            yield handle


def open_read(uri: str, binary: bool = True) -> IO:
    return open_file(uri, "rb" if binary else "r")


def write_json(uri: str, data) -> None:
    with open_write(uri, binary=False) as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")


def read_json(uri: str):
    with open_read(uri, binary=False) as handle:
        return json.load(handle)


def upload_file(local_file: str, uri: str) -> None:
    """Copy a local file to ``uri`` (a local path or object-store URI)."""
    with open(local_file, "rb") as src, open_write(uri) as dst:
        shutil.copyfileobj(src, dst, 1 << 22)


def exists(uri: str) -> bool:
    if is_local(uri):
        return os.path.exists(local_path(uri))
    if uri.startswith("s3://"):
        bucket, key = _split_s3(uri)
        response = s3_client().list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        return any(obj["Key"] == key or obj["Key"].startswith(key.rstrip("/") + "/")
                   for obj in response.get("Contents", []))
    fs, path = _fsspec(uri)
    return fs.exists(path)


def list_files(prefix_uri: str) -> list[str]:
    """Every file below ``prefix_uri`` (a directory), as full URIs, sorted."""
    if is_local(prefix_uri):
        root = Path(local_path(prefix_uri))
        if not root.is_dir():
            return []
        return sorted(str(p) for p in root.rglob("*") if p.is_file())
    if prefix_uri.startswith("s3://"):
        bucket, key = _split_s3(prefix_uri)
        key = key.rstrip("/") + "/" if key else ""
        paginator = s3_client().get_paginator("list_objects_v2")
        return sorted(f"s3://{bucket}/{obj['Key']}" for page in paginator.paginate(Bucket=bucket, Prefix=key)
                      for obj in page.get("Contents", []))
    fs, path = _fsspec(prefix_uri)
    scheme = prefix_uri.split("://", 1)[0]
    return sorted(f"{scheme}://{p}" for p in fs.find(path))


def remove_tree(uri: str) -> None:
    """Delete a directory (or every object under a prefix); a missing one is fine."""
    if is_local(uri):
        shutil.rmtree(local_path(uri), ignore_errors=True)
        return
    if uri.startswith("s3://"):
        bucket, _ = _split_s3(uri)
        client = s3_client()
        keys = [_split_s3(u)[1] for u in list_files(uri)]
        for start in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]]})
        return
    fs, path = _fsspec(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def size_of(uri: str) -> int:
    if is_local(uri):
        return os.path.getsize(local_path(uri))
    if uri.startswith("s3://"):
        bucket, key = _split_s3(uri)
        return int(s3_client().head_object(Bucket=bucket, Key=key)["ContentLength"])
    fs, path = _fsspec(uri)
    return int(fs.size(path))


