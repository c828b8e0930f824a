"""preprocess.readers.hf_datasets: directories written by the real ``datasets.Dataset.save_to_disk``, read with
pyarrow alone (the library is a test-only dependency: tests/constraints.txt)."""
from __future__ import annotations

import json
import sys

import datasets
import pytest

from common import processes
from common.errors import InputError
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers import hf_datasets
from preprocess.records import RawDocument, Rejected
from tests.preprocess.conftest import REPO_ROOT

CFG = SourceConfig()
ROWS = {"text": [f"Document {i} of the set. It has two sentences." if i % 7 else None for i in range(40)],
        "uid": [f"u{i}" for i in range(40)], "title": [f"Title {i}" for i in range(40)]}


def _spec(path, **kwargs) -> InputSourceConfig:
    return InputSourceConfig(name="hf", format="datasets", paths=[str(path)], **kwargs)


def _read_all(spec) -> list:
    reader = hf_datasets.READER
    return [r for uri in reader.files(spec.paths) for r in reader.read(uri, None, spec, CFG, {})]


def test_a_saved_dataset_of_several_files_reads_row_by_row(tmp_path):
    directory = tmp_path / "corpus"
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(directory), num_shards=3)
    files = hf_datasets.READER.files([str(directory)])
    assert [f.rsplit("/", 1)[1] for f in files] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    records = _read_all(_spec(directory, id_field="uid", title_field="title"))
    docs = [r for r in records if isinstance(r, RawDocument)]
    failed = [r for r in records if isinstance(r, Rejected)]
    assert [d.doc_id for d in docs] == [f"hf:u{i}" for i in range(40) if i % 7]
    assert docs[0].text == f"Title 1\n{ROWS['text'][1]}" and docs[0].source == "corpus/data-00000-of-00003.arrow"
    assert [(r.reason, r.doc_id) for r in failed][:2] == [("null_text", "hf:corpus/data-00000-of-00003.arrow:0"),
                                                          ("null_text", "hf:corpus/data-00000-of-00003.arrow:7")]
    assert failed[0].detail == "corpus/data-00000-of-00003.arrow row 0: 'text' is null"
    positions = [r.doc_id for r in _read_all(_spec(directory)) if isinstance(r, RawDocument)]
    assert positions[0] == "hf:corpus/data-00000-of-00003.arrow:1"  # without id_field: file and row
    assert hf_datasets.READER.label(files[2]) == "corpus/data-00002-of-00003.arrow"


def test_a_dataset_dict_reads_every_split(tmp_path):
    directory = tmp_path / "dd"
    split = datasets.Dataset.from_dict({"text": ["One. Two.", "Three. Four."]})
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(directory))
    labels = [hf_datasets.READER.label(uri) for uri in hf_datasets.READER.files([str(directory)])]
    assert labels == ["train/data-00000-of-00001.arrow", "test/data-00000-of-00001.arrow"]
    assert len([r for r in _read_all(_spec(directory)) if isinstance(r, RawDocument)]) == 4


def test_a_missing_text_column_or_a_directory_of_something_else_fails_in_one_line(tmp_path):
    directory = tmp_path / "corpus"
    datasets.Dataset.from_dict({"content": ["a"], "url": ["u"]}).save_to_disk(str(directory))
    with pytest.raises(InputError) as raised:
        _read_all(_spec(directory))
    assert "\n" not in str(raised.value) and "'text'" in str(raised.value) and "content, url" in str(raised.value)
    with pytest.raises(InputError, match="not a directory written by datasets' save_to_disk"):
        hf_datasets.READER.files([str(tmp_path)])
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../../etc/passwd"}]}))
    with pytest.raises(InputError, match="damaged"):
        hf_datasets.READER.files([str(directory)])


def test_reading_imports_no_datasets_library(tmp_path):
    directory = tmp_path / "corpus"
    datasets.Dataset.from_dict({"text": ["One sentence. Another one."]}).save_to_disk(str(directory))
    code = ("import sys\nfrom common.preprocess_config import InputSourceConfig, SourceConfig\n"
            "from preprocess.readers import hf_datasets\n"
            f"spec = InputSourceConfig(name='hf', format='datasets', paths=[{str(directory)!r}])\n"
            "records = [r for u in hf_datasets.READER.files(spec.paths)\n"
            "           for r in hf_datasets.READER.read(u, None, spec, SourceConfig(), {})]\n"
            "print(len(records), 'datasets' in sys.modules, 'dill' in sys.modules)\n")
    out = processes.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=120).stdout
    assert out.split() == ["1", "False", "False"]
