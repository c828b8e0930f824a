"""Bad input gets one clear message naming the file, or a dead letter; nothing partial is ever published."""
from __future__ import annotations

import bz2
import json
import shutil
import subprocess
import sys
import time

import pytest

from common import processes
from tests.preprocess.conftest import REPO_ROOT, read_manifest, run_cli

CONFIG = "configs/preprocess/tiny.yaml"


@pytest.fixture(scope="module")
def two_books(tmp_path_factory, real_books):
    """A small valid corpus (two real books) that bad files are added to."""
    folder = tmp_path_factory.mktemp("books")
    for name in ("austen-persuasion.txt", "chesterton-thursday.txt"):
        shutil.copy(real_books / name, folder / name)
    return folder


def _run(tmp_path, bert_vocab, *inputs, extra=()):
    out = tmp_path / "out"
    proc = run_cli("run", "--config", CONFIG, *inputs, "--tokenizer", bert_vocab, "--output", out, *extra, check=False)
    return proc, out


def _assert_clear_failure(proc, out, *needles):
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("error: "), proc.stderr[-3000:]
    for needle in needles:
        assert needle.lower() in message.lower(), message
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not out.with_name(out.name + ".incomplete").exists(), "partial output left behind"


def test_truncated_bz2_is_detected(tmp_path, real_wiki, two_books, bert_vocab):
    data = real_wiki.read_bytes()
    bad = tmp_path / "enwiki-truncated.xml.bz2"
    bad.write_bytes(data[: len(data) // 2])
    proc, out = _run(tmp_path, bert_vocab, "--wikipedia", bad, "--books", two_books)
    _assert_clear_failure(proc, out, "enwiki-truncated.xml.bz2", "truncated")


def test_corrupt_bz2_is_detected(tmp_path, real_wiki, two_books, bert_vocab):
    data = bytearray(real_wiki.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)
    bad = tmp_path / "enwiki-corrupt.xml.bz2"
    bad.write_bytes(bytes(data))
    proc, out = _run(tmp_path, bert_vocab, "--wikipedia", bad, "--books", two_books)
    _assert_clear_failure(proc, out, "enwiki-corrupt.xml.bz2")


@pytest.mark.parametrize("name,content,needle", [
    ("malformed.xml", b"<mediawiki><page><title>A</title><ns>0</ns><id>1</id><revision><text>x</revision></page>",
     "line"),
    ("latin1.xml", "<mediawiki><siteinfo><dbname>x</dbname></siteinfo><page><title>Caf\xe9</title><ns>0</ns>"
                   "<id>1</id><revision><text>caf\xe9</text></revision></page></mediawiki>".encode("latin-1"),
     "utf-8"),
    ("empty.xml", b"", "empty"),
    ("empty.xml.bz2", bz2.compress(b""), "empty"),
])
def test_broken_xml_gives_a_clear_error(tmp_path, two_books, bert_vocab, name, content, needle):
    bad = tmp_path / name
    bad.write_bytes(content)
    proc, out = _run(tmp_path, bert_vocab, "--wikipedia", bad, "--books", two_books)
    _assert_clear_failure(proc, out, name, needle)


def test_missing_input_is_named(tmp_path, two_books, bert_vocab):
    proc, out = _run(tmp_path, bert_vocab, "--wikipedia", tmp_path / "nowhere.xml.bz2", "--books", two_books)
    _assert_clear_failure(proc, out, "nowhere.xml.bz2")


def test_vocabulary_without_special_tokens_is_refused(tmp_path, two_books):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nthe\nof\n##s\n")
    proc, out = _run(tmp_path, vocab, "--books", two_books)
    _assert_clear_failure(proc, out, "vocab.txt", "[CLS]", "[MASK]")


def test_unknown_config_key_names_key_and_file(tmp_path, two_books, bert_vocab):
    proc, out = _run(tmp_path, bert_vocab, "--books", two_books, extra=("--set", "instances.dupe_factr=3"))
    _assert_clear_failure(proc, out, "dupe_factr")
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("instances:\n  max_seq_lenght: 128\n")
    proc = run_cli("run", "--config", bad_config, "--books", two_books, "--tokenizer", bert_vocab,
                   "--output", tmp_path / "o2", check=False)
    _assert_clear_failure(proc, tmp_path / "o2", "bad.yaml", "max_seq_lenght")


def test_bad_documents_become_dead_letters_and_the_job_goes_on(tmp_path, two_books, bert_vocab):
    corpus = tmp_path / "books"
    shutil.copytree(two_books, corpus)
    (corpus / "empty-book.txt").write_bytes(b"")
    (corpus / "latin1-book.txt").write_bytes(("Caf\xe9 society. " * 400 + "\n\n").encode("latin-1") * 5)
    huge = tmp_path / "hugewiki-pages-articles.xml"
    big_page = "A sentence of an enormous page. " * 20000
    huge.write_text(
        "<mediawiki><siteinfo><dbname>hugewiki</dbname></siteinfo>"
        f"<page><title>Huge</title><ns>0</ns><id>7</id><revision><text>{big_page}</text></revision></page>"
        "</mediawiki>", encoding="utf-8")
    proc, out = _run(tmp_path, bert_vocab, "--wikipedia", huge, "--books", corpus,
                     extra=("--set", "sources.max_document_chars=200000", "--set", "sources.book_encoding_fallback=null"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = read_manifest(out)["statistics"]["documents"]["failed"]
    assert failed == {"empty_file": 1, "not_utf8": 1, "too_large": 1}
    letters = [json.loads(line) for line in (out / "dead_letters.jsonl").read_text().splitlines()]
    assert {(d["source"], d["reason"]) for d in letters} == {
        ("empty-book.txt", "empty_file"), ("latin1-book.txt", "not_utf8"),
        ("hugewiki-pages-articles.xml", "too_large")}
    assert all(d["doc_id"] for d in letters)


def test_existing_dataset_is_not_overwritten_without_asking(tmp_path, two_books, bert_vocab):
    proc, out = _run(tmp_path, bert_vocab, "--books", two_books)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = read_manifest(out)["shards"]
    proc, _ = _run(tmp_path, bert_vocab, "--books", two_books)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    proc, _ = _run(tmp_path, bert_vocab, "--books", two_books, extra=("--overwrite",))
    assert proc.returncode == 0 and read_manifest(out)["shards"] == before


def test_interrupted_run_publishes_nothing_and_a_rerun_succeeds(tmp_path, real_wiki, two_books, bert_vocab):
    out = tmp_path / "out"
    args = [sys.executable, "-m", "preprocess", "run", "--config", CONFIG, "--wikipedia", str(real_wiki),
            "--books", str(two_books), "--tokenizer", str(bert_vocab), "--output", str(out)]
    staging = out.with_name(out.name + ".incomplete")
    with processes.started(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        # Kill it mid-run: once the corpus index exists, instances and shards are still to come.
        deadline = time.time() + 120
        while not (staging / "_work" / "index.json").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert proc.poll() is None, "the run finished before it could be interrupted"
        processes.kill_session(proc.pid)  # the driver and every worker of its session
        proc.wait(timeout=30)
    assert not out.exists(), "a killed run must not leave a dataset under the output name"
    assert not (staging / "manifest.json").exists()
    rerun = run_cli(*args[3:])
    assert rerun.returncode == 0 and (out / "manifest.json").exists() and not staging.exists()
