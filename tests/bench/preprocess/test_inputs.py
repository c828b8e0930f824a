"""bench.preprocess.inputs: copies of the benchmark's input hold new documents (distinct ids), made once."""
import bz2
import os

import pytest

from bench.preprocess import inputs as preprocess_inputs

DUMP = b"<mediawiki><siteinfo><dbname>enwiki</dbname></siteinfo><page><title>A</title></page></mediawiki>"


@pytest.fixture
def data(tmp_path):
    (tmp_path / "data" / "wikipedia").mkdir(parents=True)
    (tmp_path / "data" / "books").mkdir()
    (tmp_path / "data" / "wikipedia" / "dump.xml.bz2").write_bytes(bz2.compress(DUMP))
    (tmp_path / "data" / "books" / "tale.txt").write_text("Once upon a time.\n")
    return tmp_path / "data"


def test_copies_of_dumps_get_a_new_dbname_and_books_a_new_name(data, tmp_path):
    inputs = preprocess_inputs.real_inputs(data)
    copies = preprocess_inputs.make_copies(inputs, tmp_path / "work", 3)
    assert copies["wiki"][0] == inputs["wiki"][0] and copies["books"][0] == inputs["books"][0]  # copy 1: originals
    assert [bz2.decompress(open(p, "rb").read()) for p in copies["wiki"]] == [
        DUMP, DUMP.replace(b"enwiki", b"enwiki_copy2"), DUMP.replace(b"enwiki", b"enwiki_copy3")]
    assert [p.rsplit("/", 1)[1] for p in copies["books"]] == ["tale.txt", "tale.copy2.txt", "tale.copy3.txt"]
    assert {open(p).read() for p in copies["books"]} == {"Once upon a time.\n"}
    described = preprocess_inputs.describe_inputs(copies)
    assert described["file_count"] == 6 and described["bytes"] == sum(f["bytes"] for f in described["files"])


def test_copies_are_made_once(data, tmp_path):
    inputs = preprocess_inputs.real_inputs(data)
    first = preprocess_inputs.make_copies(inputs, tmp_path / "work", 2)
    stamp = {p: os.stat(p).st_mtime_ns for p in first["wiki"][1:] + first["books"][1:]}
    again = preprocess_inputs.make_copies(inputs, tmp_path / "work", 2)
    assert again == first
    assert {p: os.stat(p).st_mtime_ns for p in stamp} == stamp


def test_a_dump_without_its_dbname_is_refused_naming_the_file(data, tmp_path):
    dump = data / "wikipedia" / "dump.xml.bz2"
    dump.write_bytes(bz2.compress(DUMP.replace(b"<dbname>enwiki</dbname>", b"")))
    with pytest.raises(SystemExit, match=f"{dump}: expected one <dbname>enwiki</dbname>, found 0"):
        preprocess_inputs.make_copies(preprocess_inputs.real_inputs(data), tmp_path / "work", 2)


def test_missing_data_names_the_option(tmp_path):
    with pytest.raises(SystemExit, match="pass --data"):
        preprocess_inputs.real_inputs(tmp_path)
