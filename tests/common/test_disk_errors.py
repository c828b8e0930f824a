"""A full disk or missing permission becomes one line naming the path, the cause and the fix, however the error
surfaced: as the OSError itself, raised again inside another type (Beam, process pools), or only as text (Rust's,
Arrow's and torch's writers); the traceback goes to a file the line names, or to the screen with --debug."""
import errno
import os
import pathlib
import pickle

import pyarrow as pa
import pytest

from common import errors
from common.errors import StorageError, report, storage_failure
from common.tokenizer import load_tokenizer

FULL = "/dev/full"  # every write to it fails with ENOSPC, for any user


def _raised(function):
    try:
        function()
    except BaseException as error:  # noqa: BLE001 - the tests look at whatever was raised
        return error
    raise AssertionError(f"{function} raised nothing")


def _write_to_full_disk():
    with open(FULL, "wb") as handle:
        handle.write(b"x" * 65536)


def test_a_real_full_disk_names_the_path_the_caller_was_writing():
    error = _raised(_write_to_full_disk)
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.filename is None
    failure = storage_failure(error, path="/data/out/shard-00001.arrow", doing="writing the dataset",
                              fix="choose another --output", note="nothing was published")
    assert str(failure) == ("/data/out/shard-00001.arrow: no space left on device while writing the dataset; free "
                            "space on that file system, or choose another --output; nothing was published")
    assert failure.errno == errno.ENOSPC and failure.path == "/data/out/shard-00001.arrow"


def test_the_error_is_found_where_another_error_was_raised_while_handling_it_or_from_none():
    def wrapped():
        try:
            _write_to_full_disk()
        except OSError as error:  # what Beam's in-process runner does: a RuntimeError with the text
            raise RuntimeError(f"OSError: {error} [while running 'WriteShards']") from None

    def chained():
        try:
            wrapped()
        except RuntimeError as error:
            raise ValueError("the pipeline failed") from error

    for function in (wrapped, chained):
        failure = storage_failure(_raised(function), path="/data/out")
        assert str(failure).startswith("/data/out: no space left on device; free space on that file system")


def test_only_the_text_survives_a_process_pool_and_names_the_file():
    error = RuntimeError("PermissionError: [Errno 13] Permission denied: '/data/books/a.txt' "
                         "[while running 'BuildDocumentStore/Read']")
    error = pickle.loads(pickle.dumps(error))  # what a worker process sends back
    failure = storage_failure(error, path="/data/out")
    assert str(failure).startswith("/data/books/a.txt: permission denied; give this user access to its directory")
    assert failure.errno == errno.EACCES


def test_arrow_and_rust_errors_of_a_full_disk_are_recognised():
    arrow = _raised(lambda: pa.OSFile(FULL, "wb").write(b"x" * 65536))
    assert str(storage_failure(arrow, path="/data/out/s.arrow")).startswith("/data/out/s.arrow: no space left")
    # safetensors' words (it writes a temporary file and renames it over the target: never aim it at /dev/full)
    rust = Exception('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left '
                     'on device" })')
    assert str(storage_failure(rust, path="/data/hf")).startswith("/data/hf: no space left on device; ")


def test_a_torch_write_that_fails_without_a_cause_is_a_full_disk_when_the_disk_is_full(tmp_path, monkeypatch):
    import torch

    error = _raised(lambda: torch.save({"w": torch.zeros(65536)}, FULL))
    assert "[Errno" not in str(error)  # torch's C++ writer drops the errno
    assert storage_failure(error, path=tmp_path) is None  # not a write the caller vouched for
    roomy = storage_failure(error, path=tmp_path / "step_2", writing=True)
    assert str(roomy).startswith(f"{tmp_path / 'step_2'}: the write failed (RuntimeError: ")
    assert "bytes left) and quota there" in str(roomy)

    monkeypatch.setattr(errors, "free_bytes", lambda path: 4096)
    full = storage_failure(error, path=tmp_path / "step_2", writing=True, doing="writing the checkpoint")
    assert str(full).startswith(f"{tmp_path / 'step_2'}: no space left on device while writing the checkpoint")


@pytest.mark.parametrize("code,cause,remedy", [
    (errno.EDQUOT, "disk quota exceeded", "free space within your quota there, or have it raised"),
    (errno.EROFS, "read-only file system", "remount it read-write"),
    (errno.EACCES, "permission denied", "give this user read access to it"),
    (errno.EPERM, "operation not permitted", "give this user read access to it"),
])
def test_each_expected_cause_has_its_own_words_and_remedy(tmp_path, code, cause, remedy):
    existing = tmp_path / "f"
    existing.write_text("x")
    failure = storage_failure(OSError(code, os.strerror(code), str(existing)), writing=False)
    assert str(failure) == f"{existing}: {cause}; {remedy}"


def test_other_errors_are_not_taken_for_a_disk_fault():
    assert storage_failure(ValueError("bad value")) is None
    assert storage_failure(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")) is None
    already = StorageError("/x: no space left on device; free space on that file system")
    try:
        raise RuntimeError("while handling") from already
    except RuntimeError as error:
        assert storage_failure(error, path="/y") is already  # said by the code that knew the path


def test_report_prints_one_line_and_writes_the_traceback_to_a_file_it_names(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    error = _raised(_write_to_full_disk)
    report("/data/out: no space left on device", error, debug=False, traceback_file="preprocess")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: /data/out: no space left on device (traceback in ")
    saved = pathlib.Path(err.split("(traceback in ")[1].rstrip(")\n"))
    assert saved.parent == tmp_path and "OSError: [Errno 28] No space left on device" in saved.read_text()

    report("/data/out: no space left on device", error, debug=True, traceback_file="preprocess")
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1] == "error: /data/out: no space left on device"


def test_report_says_to_use_debug_when_the_traceback_cannot_be_written_either(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "missing"))
    report("a\nb", ValueError("x"), debug=False, traceback_file="pretrain-rank3", label="error (rank 3)")
    assert capsys.readouterr().err == "error (rank 3): a b (run again with --debug for the traceback)\n"


def test_a_tokenizer_file_this_user_may_not_read_is_named_in_one_line(tmp_path, bert_vocab, monkeypatch):
    from common import storage

    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(bert_vocab.read_bytes())

    def denied(path, *args, **kwargs):  # root reads any file: the refusal is injected where the file is opened
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(storage, "open", denied, raising=False)
    with pytest.raises(errors.InputError) as refused:
        load_tokenizer(str(vocab))
    assert refused.value.message == f"{vocab}: permission denied while reading the tokenizer; give this user read " \
                                    "access to it"


def _truncate(path: pathlib.Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture
def saved_tokenizers(tmp_path, bert_vocab):
    from preprocess import vocab
    from tests.common.test_tokenizer import _generated_sentences

    wordpiece = tmp_path / "wordpiece"
    load_tokenizer(str(bert_vocab)).save(str(wordpiece))
    sentencepiece = tmp_path / "sentencepiece"
    vocab.train_sentencepiece(iter(_generated_sentences()), vocab_size=400, output_dir=str(sentencepiece))
    return wordpiece, sentencepiece


@pytest.mark.parametrize("kind,file,words", [
    ("wordpiece", "vocab.txt", "ids where tokenizer.json records 30,522; the file is truncated or was replaced"),
    ("wordpiece", "tokenizer.json", "not valid JSON"),
    ("sentencepiece", "spm.model", "not a readable SentencePiece model"),
])
def test_a_truncated_tokenizer_file_is_named_in_one_line_with_the_fix(saved_tokenizers, kind, file, words):
    directory = saved_tokenizers[0 if kind == "wordpiece" else 1]
    _truncate(directory / file)
    with pytest.raises(errors.InputError) as refused:
        load_tokenizer(str(directory))
    message = refused.value.message
    assert message.startswith(f"{directory / file}: ") and words in message and "\n" not in message
    assert "truncated" in message and ("copy" in message or "re-save" in message)


def test_a_garbage_sentencepiece_model_is_named_in_one_line(tmp_path):
    model = tmp_path / "spm.model"
    model.write_bytes(os.urandom(3000))
    with pytest.raises(errors.InputError) as refused:
        load_tokenizer(str(model))
    assert refused.value.message.startswith(f"{model}: not a readable SentencePiece model (")
    assert "truncated or not a .model" in refused.value.message and "\n" not in refused.value.message
