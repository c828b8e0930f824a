"""File access: the standard library for local paths, smart_open for object stores; atomic local writes."""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import stat
import sys

import pytest

from common import processes, storage
from tests.preprocess.conftest import REPO_ROOT


@pytest.mark.parametrize("suffix, compress", [(".bz2", bz2.compress), (".gz", gzip.compress),
                                              (".xz", lzma.compress), ("", bytes)])
def test_local_files_are_decompressed_by_extension_when_asked(tmp_path, suffix, compress):
    text = "héllo, wörld\n"
    path = tmp_path / f"t.txt{suffix}"
    path.write_bytes(compress(text.encode("utf-8")))
    with storage.open_file(str(path), decompress=True) as handle:
        assert handle.read() == text.encode("utf-8")
    with storage.open_file("file://" + str(path), "r", decompress=True) as handle:
        assert handle.read() == text
    with storage.open_file(str(path)) as handle:  # the raw bytes (dump splitting seeks in them)
        assert handle.read() == path.read_bytes()


def test_text_is_utf8_whatever_the_locale(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes('{"title": "Zo\u00eb"}'.encode("utf-8"))  # raw UTF-8, as other tools write JSON
    code = ("from common import storage\n"
            f"assert storage.read_json({str(path)!r}) == {{'title': 'Zo\\u00eb'}}\n")
    processes.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=60,
                  env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0",
                        "PYTHONPATH": str(REPO_ROOT)})


def test_a_failed_local_write_leaves_nothing(tmp_path):
    target = tmp_path / "out" / "x.json"
    with pytest.raises(RuntimeError):
        with storage.open_write(str(target), binary=False) as handle:
            handle.write("half")
            raise RuntimeError("interrupted")
    assert not target.exists() and list((tmp_path / "out").iterdir()) == []


def test_local_files_need_no_object_store_client(tmp_path):
    # smart_open imports every transport's client (boto3, google-cloud-storage) when it is imported.
    dump = tmp_path / "x.xml.bz2"
    dump.write_bytes(bz2.compress(b"<mediawiki/>"))
    code = ("import sys; from common import storage, tokenizer; from preprocess.readers import inputs\n"
            f"storage.write_json({str(tmp_path / 'a.json')!r}, [1])\n"
            f"assert storage.read_json({str(tmp_path / 'a.json')!r}) == [1]\n"
            f"assert inputs.open_uri({str(dump)!r}).read() == b'<mediawiki/>'\n"
            "print(' '.join(m for m in ('smart_open', 'boto3', 'google.cloud.storage') if m in sys.modules))\n")
    out = processes.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=60).stdout
    assert out.strip() == ""


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(tmp_path, mask):
    previous = os.umask(mask)
    try:
        for binary in (True, False):
            target = tmp_path / f"file-{binary}-{mask:o}.json"
            with storage.open_write(str(target), binary=binary) as handle:
                handle.write(b"{}" if binary else "{}")
            assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    finally:
        os.umask(previous)
