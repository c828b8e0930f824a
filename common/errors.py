"""The error types every stage shares. Each message names the file (or key) at fault and the fix; the entry points
print it as one line."""
from __future__ import annotations

import contextlib
import errno as _errno
import os
import re
import sys
import tempfile
import traceback


class ConfigError(ValueError):
    """A config file or override that cannot be turned into the typed config."""


class CheckpointError(ValueError):
    """A checkpoint or model directory that cannot be used; the message names the path and what to do."""


class DatasetFormatError(ValueError):
    """A dataset directory that is incomplete, of another format version, or does not match the model."""


class InputError(Exception):
    """Bad input that stops the job: the message names the file (or URI) and the problem and the fix.

    Raised for file-level problems (truncated or corrupt compression, malformed XML, an unreadable
    URI, a vocabulary without the BERT special tokens). Document-level problems become ``Rejected``
    records instead, so one bad page among millions does not stop a run.
    """

    MARKER = "[preprocess input error]"

    def __init__(self, message: str):
        super().__init__(f"{self.MARKER} {message}")
        self.message = message


class OutputLockedError(RuntimeError):
    """Another live process is writing the same output."""


class StorageError(Exception):
    """A file that could not be written or read for a reason outside the program: a full disk, a quota, missing
    permission, a read-only file system. The message names the path, the cause and the fix (``storage_failure``)."""

    def __init__(self, message: str, path: str | None = None, errno: int | None = None):
        super().__init__(message)
        self.path, self.errno = path, errno


# The expected causes: errno -> (the cause as a user reads it, what to do there).
_CAUSES = {
    _errno.ENOSPC: ("no space left on device", "free space on that file system"),
    _errno.EDQUOT: ("disk quota exceeded", "free space within your quota there, or have it raised"),
    _errno.EACCES: ("permission denied", "give this user {access}"),
    _errno.EPERM: ("operation not permitted", "give this user {access}"),
    _errno.EROFS: ("read-only file system", "remount it read-write"),
}
# What C++ writers (torch.save's zip writer, iostreams) say when a write fails; they drop the errno.
_WRITE_FAILED = ("file write failed", "unexpected pos", "basic_ios::clear", "failed writing file")
# A write that failed for want of space leaves next to nothing free; the margin covers other writers (the job's
# other ranks) freeing a little since.
NEARLY_FULL_BYTES = 64 << 20
# Where error texts quote a path: Python's "[Errno 13] Permission denied: '/x'", Arrow's "local file '/x'".
_QUOTED_PATH = re.compile(r"""(?:: |file )['"]([^'"\n]*/[^'"\n]*)['"]""")


def _chain(error: BaseException):
    """``error`` and every exception it was raised from or while handling (Beam and the process pools re-raise
    a worker's error inside their own types; ``raise ... from None`` hides, but keeps, the original)."""
    seen, pending = set(), [error]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__]


def _os_cause(error: BaseException, writing: bool) -> tuple[int | None, str | None, str] | None:
    """(errno, path if known, the failing error's first line) of the expected OS failure behind ``error``."""
    chain = list(_chain(error))
    for current in chain:  # the OSError object itself, when it survived
        if isinstance(current, OSError) and current.errno in _CAUSES:
            named = current.filename if isinstance(current.filename, (str, bytes, os.PathLike)) else None
            path = os.fsdecode(named) if named is not None else _path_in(str(current))
            return current.errno, path, _first_line(current)
    for current in chain:  # only its text: Beam's worker errors, Rust's and Arrow's messages
        text = str(current)
        for code in _CAUSES:
            if os.strerror(code).lower() in text.lower():
                return code, _path_in(text), _first_line(current)
    if writing:
        for current in chain:
            if any(marker in str(current) for marker in _WRITE_FAILED):
                return None, None, _first_line(current)
    return None


def _path_in(text: str) -> str | None:
    match = _QUOTED_PATH.search(text)
    return match.group(1) if match else None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def free_bytes(path: str | os.PathLike | None) -> int | None:
    """Bytes an unprivileged user may still write on the file system holding ``path`` (or its nearest existing
    parent); None when there is no such path."""
    if path is None:
        return None
    current = os.path.abspath(os.fspath(path))
    while not os.path.exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    try:
        stats = os.statvfs(current)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def storage_failure(error: BaseException, *, path: str | os.PathLike | None = None, doing: str | None = None,
                    writing: bool | None = None, fix: str | None = None,
                    note: str | None = None) -> StorageError | None:
    """The one-line ``StorageError`` for the expected OS failure behind ``error`` (no space, quota, permission,
    read-only file system), or None when ``error`` is something else.

    The failure is found on the exception, on any exception it was raised from or while handling, or in their
    text where only that survived. The message names the failing path the error names, else ``path`` (what the
    caller was writing), the cause, what was being done (``doing``, e.g. "writing the checkpoint"), the remedy,
    ``fix`` as the alternative to it, and ``note`` (what was kept). With ``writing=True`` a write that failed
    without a cause (torch's C++ writer drops the errno) counts too: the file system's free space tells whether it
    was full.
    """
    said = next((current for current in _chain(error) if isinstance(current, StorageError)), None)
    if said is not None:  # the code that knew what it was writing already said it
        return said
    found = _os_cause(error, writing is True)
    if found is None:
        return None
    code, where, detail = found
    where = where or (os.fspath(path) if path is not None else None)
    free = free_bytes(where) if code is None else None
    if free is not None and free < NEARLY_FULL_BYTES:
        code = _errno.ENOSPC
    if code is None:
        cause = f"the write failed ({detail})"
        remedy = f"check the free space{f' ({free:,} bytes left)' if free is not None else ''} and quota there"
    else:
        cause, remedy = _CAUSES[code]
        access = {True: "write access to it", False: "read access to it"}.get(writing, "access to it")
        if where and "://" not in where and not os.path.lexists(where):  # being created, or its directory is shut
            access = "write access to its directory" if writing else "access to its directory"
        remedy = remedy.format(access=access)
    message = (f"{where or 'a file'}: {cause}{f' while {doing}' if doing else ''}; {remedy}"
               f"{f', or {fix}' if fix else ''}{f'; {note}' if note else ''}")
    return StorageError(message, path=where, errno=code)


def report(line: str, error: BaseException, *, debug: bool, traceback_file: str | None = None,
           label: str = "error") -> None:
    """Print an expected failure as one line, ``label: line``, on stderr.

    With ``debug`` its traceback is printed above the line. Otherwise, given ``traceback_file`` (a file name
    prefix), the traceback is written to a new file in the temporary directory and the line names it; where even
    that cannot be written (the same full disk), the line says to run again with --debug.
    """
    line = " ".join(line.split("\n"))
    if debug:
        traceback.print_exception(error, file=sys.stderr)
    elif traceback_file is not None:
        name = None
        try:
            handle, name = tempfile.mkstemp(prefix=f"{traceback_file}-", suffix=".traceback")
            with os.fdopen(handle, "w") as log:
                traceback.print_exception(error, file=log)
            line += f" (traceback in {name})"
        except OSError:
            if name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(name)  # cut short: better none than half of one
            line += " (run again with --debug for the traceback)"
    print(f"{label}: {line}", file=sys.stderr, flush=True)
