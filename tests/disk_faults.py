"""Real full disks and real missing permissions, for the tests of what a user sees when they happen.

A full disk is a small tmpfs mounted over a directory (root may mount one). Missing permission is a ``chmod 000``,
which stops any user but root; root is stopped too in a child process started without the capabilities that
override file permissions (``setpriv``). Where neither is allowed, the child's Python refuses the same operations
with the same errors (an audit hook, and a wrapper of Arrow's ``memory_map``, installed by a ``sitecustomize`` this
module writes): the tests then still run and check the same messages, never skip.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from common import processes

REPO = pathlib.Path(__file__).resolve().parents[1]
_WITHOUT_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]

# Installed in the child when the machine allows neither mounting nor dropping capabilities.
_SITECUSTOMIZE = textwrap.dedent('''
    import errno, os, sys

    _FULL = os.environ.get("DISK_FAULTS_FULL")
    _DENIED = set(filter(None, os.environ.get("DISK_FAULTS_DENIED", "").split(os.pathsep)))
    _SHUT = set(filter(None, os.environ.get("DISK_FAULTS_SHUT", "").split(os.pathsep)))  # read-only directories
    _WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def _under(path, root):
        return path == root or path.startswith(root.rstrip("/") + "/")

    def _hook(event, args):
        if event not in ("open", "os.mkdir") or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        creates = event == "os.mkdir" or bool((args[2] or 0) & _WRITES)
        if _FULL and creates and _under(path, _FULL) and path != _FULL:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        if any(_under(path, denied) for denied in _DENIED) or (
                creates and any(_under(path, shut) and path != shut for shut in _SHUT)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    sys.addaudithook(_hook)
    if _DENIED:  # Arrow maps shards in C++, where no audit event is raised
        import pyarrow

        _map = pyarrow.memory_map

        def memory_map(path, *args, **kwargs):
            _hook("open", (path, "r", 0))
            return _map(path, *args, **kwargs)

        pyarrow.memory_map = memory_map
''')


def _may(command: list[str]) -> bool:
    try:
        return processes.run(command, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class Child:
    """How to start a child process that meets the faults: a command prefix and environment variables."""

    def __init__(self, tmp_path: pathlib.Path):
        self.tmp_path = tmp_path
        self.prefix: list[str] = []
        self.env: dict[str, str] = {"TMPDIR": str(self._mkdir("tmp"))}  # where tracebacks are written
        self._hooked: dict[str, str] = {}
        self._mounts: list[pathlib.Path] = []
        self.mounted = False  # whether full_disk mounted a real file system (else the child's Python refuses)

    def _mkdir(self, name: str) -> pathlib.Path:
        path = self.tmp_path / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def full_disk(self, name: str, size: str = "256k") -> pathlib.Path:
        """A directory on a file system of ``size`` bytes, full once the child has written that much."""
        directory = self._mkdir(name)
        if _may(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)]):
            self._mounts.append(directory)
            self.mounted = True
        else:  # creating anything under it fails as on a full disk
            self._hooked["DISK_FAULTS_FULL"] = str(directory.resolve())
        return directory

    def unreadable(self, *paths: pathlib.Path) -> None:
        """The child may not open ``paths`` (files or directories)."""
        self._take_away(paths, 0, "DISK_FAULTS_DENIED")

    def unwritable(self, *directories: pathlib.Path) -> None:
        """The child may read ``directories`` but create nothing in them."""
        self._take_away(directories, 0o555, "DISK_FAULTS_SHUT")

    def _take_away(self, paths, mode: int, variable: str) -> None:
        for path in paths:
            path.chmod(mode)
        if os.geteuid() != 0:
            return
        if _may([*_WITHOUT_OVERRIDE, "true"]):
            self.prefix = list(_WITHOUT_OVERRIDE)
        else:
            listed = self._hooked.get(variable, "").split(os.pathsep)
            self._hooked[variable] = os.pathsep.join(filter(None, [*listed, *(str(p.resolve()) for p in paths)]))

    def run(self, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        """Run ``python ARGS`` from the repository root; stdout and stderr captured apart."""
        env = {k: v for k, v in os.environ.items()  # not the rendezvous of this process's own process group
               if not k.startswith(("SLURM_", "PMI_", "OMPI_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
        env.update(self.env, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        path = [str(REPO)]
        if self._hooked:
            path.insert(0, str(self._mkdir("sitecustomize")))
            (self.tmp_path / "sitecustomize" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
            env.update(self._hooked)
        env["PYTHONPATH"] = os.pathsep.join(path)
        return processes.run([*self.prefix, sys.executable, *map(str, args)], cwd=REPO, env=env, text=True,
                             capture_output=True, timeout=timeout, check=False)

    def close(self) -> None:
        for directory in self._mounts:
            processes.run(["umount", "-l", str(directory)], capture_output=True, check=False, timeout=60)
        for path in self.tmp_path.rglob("*"):  # give pytest back what it may remove
            with contextlib.suppress(OSError):
                if not path.is_symlink():
                    path.chmod(0o755)


@contextlib.contextmanager
def child_process(tmp_path: pathlib.Path):
    """A ``Child`` whose mounts and permissions are undone afterwards (for a fixture of the test module)."""
    started = Child(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def child(tmp_path):
    """A ``Child`` for one test (the fixture the disk-error tests share; a test module takes it with
    ``child = disk_faults.child``: pyflakes reads a test's ``child`` argument as redefining an imported name)."""
    with child_process(tmp_path) as started:
        yield started


def one_error_line(proc: subprocess.CompletedProcess, alone: bool = False) -> str:
    """The one line a failure printed, after checking the exit status and that no traceback was printed; among
    log lines (pretraining and finetuning log their progress), or ``alone`` on stderr."""
    assert proc.returncode == 2, proc.stderr[-4000:]
    lines = proc.stderr.splitlines() if alone else [
        line for line in proc.stderr.splitlines() if line.startswith("error") or "Traceback" in line]
    assert len(lines) == 1 and lines[0].startswith("error") and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return lines[0]


def traceback_file(line: str) -> pathlib.Path:
    """The traceback file the line names, checked to hold the traceback."""
    assert line.endswith(".traceback)") and "(traceback in " in line, line
    path = pathlib.Path(line.rsplit("(traceback in ", 1)[1][:-1])
    assert "Traceback (most recent call last):" in path.read_text(), path
    return path


def with_debug(proc: subprocess.CompletedProcess, line: str) -> None:
    """With --debug: the traceback on stderr, then the same line (without the traceback file)."""
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback (most recent call last):" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == line.rsplit(" (traceback in ", 1)[0], proc.stderr[-3000:]
