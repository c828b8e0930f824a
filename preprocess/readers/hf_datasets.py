"""Hugging Face datasets directories (``format: datasets``): what ``datasets.Dataset.save_to_disk`` writes.

Such a directory holds ``state.json`` (its ``_data_files``: the data files in order), ``dataset_info.json`` and the
data files ``data-NNNNN-of-NNNNN.arrow``, each an Arrow IPC *stream*; a ``DatasetDict`` directory holds
``dataset_dict.json`` (its ``splits``) and one such directory per split. They are read with pyarrow alone: the
``datasets`` library is never imported, and nothing in the directory is unpickled or run (its JSON files are read as
data, the Arrow metadata is ignored). A data file is read batch by batch, only the needed columns kept, and is one
unit (save_to_disk cuts a large dataset into files of at most 500 MB). A row's position is its index in its file;
a file's name in ids is ``{directory}/{file}`` (splits share file names).
"""
from __future__ import annotations

import json
from typing import Iterator

import pyarrow as pa

from common import storage
from common.errors import InputError
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers.fields import PlainFormat, check_fields, document_of
from preprocess.readers.inputs import open_uri, source_name
from preprocess.records import RawDocument, Rejected

STATE = "state.json"
DATASET_DICT = "dataset_dict.json"


def _read_json(uri: str) -> dict:
    try:
        with open_uri(uri, decompress=False) as stream:
            data = json.loads(stream.read(16 << 20).decode("utf-8"))
    except InputError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{uri}: not valid JSON ({exc}); the datasets directory is damaged — save it again") from exc
    if not isinstance(data, dict):
        raise InputError(f"{uri}: not a JSON object; the datasets directory is damaged — save it again")
    return data


def data_files(directory: str) -> list[str]:
    """The data files of a save_to_disk directory, in order (a DatasetDict's: split by split, as it lists them)."""
    directory = directory.rstrip("/")
    if storage.exists(storage.join(directory, STATE)):
        files = _read_json(storage.join(directory, STATE)).get("_data_files")
        if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("filename"), str)
                                                  and "/" not in f["filename"] for f in files):
            raise InputError(f"{storage.join(directory, STATE)}: no list of data files (_data_files); the datasets "
                             "directory is damaged — save it again")
        return [storage.join(directory, f["filename"]) for f in files]
    if storage.exists(storage.join(directory, DATASET_DICT)):
        splits = _read_json(storage.join(directory, DATASET_DICT)).get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) and "/" not in s for s in splits):
            raise InputError(f"{storage.join(directory, DATASET_DICT)}: no list of splits; the datasets directory "
                             "is damaged — save it again")
        return [uri for split in splits for uri in data_files(storage.join(directory, split))]
    raise InputError(f"{directory}: not a directory written by datasets' save_to_disk (no {STATE} or "
                     f"{DATASET_DICT}); pass the directory that save_to_disk wrote")


def iter_arrow_stream(uri: str, spec: InputSourceConfig, label: str) -> Iterator[RawDocument | Rejected]:
    """The rows of one data file (an Arrow IPC stream).

    Raises:
        InputError: The file cannot be read as an Arrow stream, or its schema lacks the text or id column.
    """
    with open_uri(uri, decompress=False) as stream:
        try:
            reader = pa.ipc.open_stream(stream)
        except Exception as exc:  # ArrowInvalid: not an Arrow stream
            raise InputError(f"{uri}: not an Arrow IPC stream ({type(exc).__name__}: {exc}); the datasets "
                             "directory is damaged — save it again") from exc
        names = reader.schema.names
        check_fields(uri, spec, names)
        columns = [n for n in dict.fromkeys([spec.text_field, spec.id_field, spec.title_field,
                                                   spec.language_field]) if n in names]
        row = 0
        try:
            for batch in reader:
                values = {name: batch.column(name).to_pylist() for name in columns}
                for i in range(batch.num_rows):
                    record = {name: values[name][i] for name in columns}
                    yield document_of(record, spec, label, str(row), f"{label} row {row}")
                    row += 1
        except InputError:
            raise
        except Exception as exc:  # a truncated or corrupt stream, a transport error
            raise InputError(f"{uri}: cannot read past row {row} ({type(exc).__name__}: {exc}); the file is "
                             "damaged or cut short — save the dataset again") from exc


class DatasetsReader(PlainFormat):
    """``preprocess.readers.Reader`` of save_to_disk directories: a source's paths are the directories."""

    format = "datasets"

    def files(self, paths) -> list[str]:
        return [uri for path in paths for uri in data_files(path)]

    def label(self, uri: str) -> str:
        parent, _, name = uri.rstrip("/").replace("\\", "/").rpartition("/")
        return f"{source_name(parent)}/{name}" if parent else name

    def read(self, uri: str, piece, spec, cfg: SourceConfig, cache: dict) -> Iterator[RawDocument | Rejected]:
        return iter_arrow_stream(uri, spec, self.label(uri))

    def memory_class(self, uri: str) -> str:
        return "datasets"

    def cost_per_byte(self, uri: str) -> float:
        return 1.0


READER = DatasetsReader()

__all__ = ["READER", "DatasetsReader", "data_files", "iter_arrow_stream"]
