"""Tests for preprocess.readers.inputs: expanding input patterns and opening files by extension."""
from __future__ import annotations

import bz2
import io
import pathlib

import pytest

from common.errors import InputError
from preprocess.readers import inputs


@pytest.fixture(scope="module")
def books(shared_data) -> pathlib.Path:
    return shared_data / "books"


def test_expand_inputs_dir_and_glob(tmp_path):
    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    for name in ("a/2.txt", "a/1.txt", "a/deep/3.txt", "a/.skip.txt", ".hidden/4.txt", "b.xml"):
        (tmp_path / name).write_text("x")
    base = str(tmp_path)
    assert inputs.expand_inputs([base]) == [f"{base}/a/1.txt", f"{base}/a/2.txt",
                                             f"{base}/a/deep/3.txt", f"{base}/b.xml"]
    assert inputs.expand_inputs([f"{base}/a/*.txt", f"{base}/a/1.txt", "s3://b/k.xml.bz2"]) == [
        f"{base}/a/1.txt", f"{base}/a/2.txt", "s3://b/k.xml.bz2"]
    assert inputs.expand_inputs([f"{base}/**/*.txt"])[-1] == f"{base}/a/deep/3.txt"
    with pytest.raises(InputError, match=r"\*\.nothing matches no files"):
        inputs.expand_inputs([f"{base}/*.nothing"])
    (tmp_path / "void").mkdir()
    with pytest.raises(InputError, match="void matches no files"):
        inputs.expand_inputs([f"{base}/void"])


def test_expand_inputs_real_books(books):
    found = inputs.expand_inputs([str(books)])
    assert len(found) == 12 and found == sorted(found)
    assert inputs.source_name(found[0]) == "austen-emma.txt"
    assert inputs.source_name("s3://bucket/dumps/x.xml.bz2") == "x.xml.bz2"


def test_open_uri_decompresses_by_extension(tmp_path):
    path = tmp_path / "t.txt.bz2"
    path.write_bytes(bz2.compress(b"hello"))
    with inputs.open_uri(str(path)) as handle:
        assert handle.read() == b"hello"
    assert isinstance(io.BytesIO(), io.IOBase)
