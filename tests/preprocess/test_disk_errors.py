"""A full disk or missing permission during preprocessing: one line on stderr naming the path, the cause and the fix
(exit 2), nothing published, the traceback in a file the line names; with --debug, the traceback on the screen."""
import shutil

import pytest

from tests.disk_faults import child_process, one_error_line, traceback_file, with_debug
from tests.preprocess.conftest import SAMPLES

CONFIG = "configs/preprocess/tiny.yaml"
BOOKS = SAMPLES / "books"


@pytest.fixture
def child(tmp_path):
    with child_process(tmp_path) as started:
        yield started


def _run(child, output, *more, tokenizer=None, bert_vocab=None, books=BOOKS):
    return child.run(["-m", "preprocess", "run", "--config", CONFIG, "--books", books,
                      "--tokenizer", tokenizer or bert_vocab, "--output", output, *more])


@pytest.mark.parametrize("workers", [[], ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]],
                         ids=["in-process", "worker-processes"])
def test_a_full_disk_names_the_output_and_publishes_nothing(child, bert_vocab, workers):
    # Room for the tokenizer (bert-base's vocab.txt, 226 KiB) but not for the documents: the failure comes from
    # inside Beam, in this process or (second case) only as text from a worker process.
    disk = child.full_disk("disk", size="300k")
    proc = _run(child, disk / "out", *workers, bert_vocab=bert_vocab)
    line = one_error_line(proc, alone=True)
    assert line.startswith(f"error: {disk / 'out'}"), line  # where the data is staged (or its lock, next to it)
    assert ": no space left on device while writing the dataset; free space on that file system, or choose " \
           "another --output; nothing was published (traceback in " in line
    if child.mounted:  # a real file system of 300 KiB: the tokenizer fits, the documents do not
        assert line.startswith(f"error: {disk / 'out.incomplete'}: "), line
    assert "No space left on device" in traceback_file(line).read_text()
    assert list(disk.iterdir()) == []  # no dataset, no staging, no lock

    with_debug(_run(child, disk / "out", *workers, "--debug", bert_vocab=bert_vocab), line)


def test_an_output_directory_this_user_may_not_write_is_named(child, bert_vocab, tmp_path):
    parent = tmp_path / "shut"
    parent.mkdir()
    child.unreadable(parent)
    line = one_error_line(_run(child, parent / "out", bert_vocab=bert_vocab), alone=True)
    assert line.startswith(f"error: {parent / 'out'}"), line  # the lock or the staging directory next to it
    assert ": permission denied while writing the dataset; give this user access to its directory, or choose " \
           "another --output; nothing was published" in line
    traceback_file(line)


def test_a_tokenizer_this_user_may_not_read_is_named(child, bert_vocab, tmp_path):
    vocab = tmp_path / "vocab.txt"
    shutil.copy(bert_vocab, vocab)
    child.unreadable(vocab)
    proc = _run(child, tmp_path / "out", tokenizer=vocab)
    line = one_error_line(proc, alone=True)
    assert line.startswith(f"error: {vocab}: permission denied while reading the tokenizer; give this user read "
                           "access to it (traceback in "), line
    assert not (tmp_path / "out").exists()


def test_an_input_this_user_may_not_read_is_named(child, bert_vocab, tmp_path):
    books = tmp_path / "books"
    shutil.copytree(BOOKS, books)
    shut = min(books.iterdir())
    child.unreadable(shut)
    line = one_error_line(_run(child, tmp_path / "out", bert_vocab=bert_vocab, books=books), alone=True)
    assert line.startswith(f"error: {shut}: permission denied"), line
    traceback_file(line)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()


def test_verify_names_a_shard_this_user_may_not_read(child, bert_vocab, tmp_path):
    dataset = tmp_path / "dataset"
    assert child.run(["-m", "preprocess", "run", "--config", CONFIG, "--books", BOOKS, "--tokenizer", bert_vocab,
                      "--output", dataset]).returncode == 0
    shard = max(dataset.glob("shard-*.arrow"))
    child.unreadable(shard)
    line = one_error_line(child.run(["-m", "preprocess", "verify", dataset]), alone=True)
    assert line.startswith(f"error: {shard}: permission denied while verifying the dataset; give this user read "
                           "access to it (traceback in "), line
    with_debug(child.run(["-m", "preprocess", "verify", dataset, "--debug"]), line)
