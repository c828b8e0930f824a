"""Hugging Face directories, for every model family: config.json read and type-checked, weights read safely
(safetensors, or ``pytorch_model.bin`` as weights only), and an export written whole or not at all.

Each family's own mapping of names and configs lives beside its model (``models/<family>/hf.py``) and goes through
these functions. Nothing here imports a model, DeepSpeed or torch.distributed.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from common import configlib
from common.errors import CheckpointError, ConfigError, storage_failure
from models.hf_tokenizer import write_tokenizer_files

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_config(directory: str | Path, model_type: str, config_cls):
    """``config_cls`` from a Hugging Face directory's config.json, for every model family: the ``model_type`` must
    be ``model_type`` (absent reads as BERT, as older BERT files omit it), positions absolute; keys the config does
    not model are ignored, and a value it refuses is refused naming the file."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json; pass a Hugging Face {model_type.upper()} directory")
    return config_from_dict(read_json_object(path), path, model_type, config_cls)


def read_json_object(path: str | Path) -> dict:
    """A Hugging Face directory's JSON file (config.json, tokenizer_config.json) as a dict; a one-line
    ``CheckpointError`` naming the file when it is not a JSON object. It is only read: nothing it names is imported
    (``auto_map``, remote code) or run."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # not UTF-8 or not JSON; RecursionError: thousands of nested [
        raise CheckpointError(f"{path}: not valid JSON ({error}); the file is truncated or damaged: export or "
                              "download the model again") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: a JSON {type(raw).__name__}, not an object; the file is damaged or not a "
                              "Hugging Face config: export or download the model again")
    return raw


def find_tokenizer(directory: str | Path):
    """The tokenizer of a model directory, the first found: ours (``tokenizer/``), a ``vocab.txt`` (lowercased as
    its ``tokenizer_config.json`` says), a Hugging Face ``tokenizer.json`` (all that transformers 5 saves), or a
    SentencePiece ``spiece.model`` (Google's ALBERT releases: the model carries its normalizer); None without any."""
    from common.tokenizer import META_FILE, WORDPIECE_FILE, load_tokenizer

    directory = Path(directory)
    if (directory / "tokenizer" / META_FILE).is_file():
        return load_tokenizer(str(directory / "tokenizer"))
    if (directory / WORDPIECE_FILE).is_file():
        settings = directory / "tokenizer_config.json"
        lowercase = bool(read_json_object(settings).get("do_lower_case", True)) if settings.is_file() else True
        return load_tokenizer(str(directory / WORDPIECE_FILE), lowercase=lowercase)
    for name in ("tokenizer.json", "spiece.model"):
        if (directory / name).is_file():
            return load_tokenizer(str(directory / name))
    return None


def config_from_dict(raw: dict, path: str | Path, model_type: str, config_cls):
    """``read_config`` of a config.json already read (e.g. the copy a distillation run records of its teacher's);
    ``path`` names it in the errors. Values are type-checked as a YAML config's are (``configlib``)."""
    if raw.get("model_type", "bert") != model_type:
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not {model_type!r}")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
    known = {f.name for f in dataclasses.fields(config_cls)}
    try:
        config = configlib.from_dict(config_cls, {k: v for k, v in raw.items() if k in known}, str(path))
    except ConfigError as error:
        raise CheckpointError(f"{error}; export or download the model again") from None
    _check_size(config, path)
    return config


# Far beyond any encoder of these families (BERT-Large: 0.34 billion, DeBERTa-v2 xxlarge: 1.5): 40 GB in fp32.
MAX_PARAMETERS = 10 ** 10


def _check_size(config, path) -> None:
    """Refuse, before anything is allocated, a config whose sizes (``vocab_size``, ``hidden_size``, ...) would make
    a model of more than ``MAX_PARAMETERS``: a damaged or hostile file would otherwise exhaust memory building it."""
    size = {name: max(0, int(getattr(config, name, 0) or 0)) for name in (
        "vocab_size", "hidden_size", "embedding_size", "num_hidden_layers", "intermediate_size",
        "max_position_embeddings", "type_vocab_size")}
    width, embedding = size["hidden_size"], size["embedding_size"] or size["hidden_size"]
    estimate = ((size["vocab_size"] + size["max_position_embeddings"] + size["type_vocab_size"]) * embedding
                + size["num_hidden_layers"] * (4 * width * width + 2 * width * size["intermediate_size"]))
    if estimate > MAX_PARAMETERS:
        shown = ", ".join(f"{name} {value:,}" for name, value in size.items() if value)[:300]
        raise CheckpointError(f"{path}: its sizes ({shown}) would make a model of about {estimate:.2e} parameters, "
                              f"more than {MAX_PARAMETERS:.0e} (far beyond any model of this family); refused before "
                              "allocating: the file is damaged or not this model's config: export or download the "
                              "model again")


def is_complete(directory: str | Path) -> bool:
    """A Hugging Face directory with its config and weights (an export cut short has neither or only one)."""
    directory = Path(directory)
    return (directory / "config.json").is_file() and any((directory / name).is_file() for name in WEIGHT_FILES)


def weights_file(directory: str | Path) -> Path:
    directory = Path(directory)
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise CheckpointError(f"{directory}: neither model.safetensors nor pytorch_model.bin found")


def check_weights_file(directory: str | Path) -> Path:
    """Read the weights file's header (not its tensors): a truncated or foreign file is refused here, with
    its name, rather than deep inside a training run. ``pytorch_model.bin`` is read as weights only."""
    path = weights_file(directory)
    try:
        open(path, "rb").close()  # safetensors reports a file it may not read as missing
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        else:
            torch.load(path, map_location="meta", weights_only=True)
    except Exception as error:  # safetensors, zipfile and the weights-only unpickler each raise their own type
        raise _unreadable(path, error) from error
    return path


def load_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    path = weights_file(directory)
    try:
        open(path, "rb").close()  # safetensors reports a file it may not read as missing
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise _unreadable(path, error) from error


def _unreadable(path: Path, error: BaseException) -> Exception:
    """The one-line error for a weights file that could not be read: missing permission (the file may be fine),
    code in a pickle, or a truncated or foreign file."""
    import pickle

    failure = storage_failure(error, path=path, doing="reading the weights", writing=False)
    if failure is not None:
        return failure
    text = str(error).strip().splitlines()
    detail = f"{type(error).__name__}: {text[0] if text else ''}"[:300]
    if isinstance(error, pickle.UnpicklingError):
        return CheckpointError(f"{path}: refused to load: it holds objects other than weights ({detail}); loading "
                               "it could run code: use a model.safetensors export instead")
    return CheckpointError(f"{path}: unreadable ({detail}); the file is truncated or not a weights file: export or "
                           "download it again")


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding NaN or inf."""
    return [name for name, value in state.items()
            if value.is_floating_point() and not bool(torch.isfinite(value).all())]


@dataclasses.dataclass(frozen=True)
class ExportPart:
    """A further network of an export, written into its own subdirectory (e.g. ELECTRA's generator/)."""

    config: dict
    state: dict[str, torch.Tensor]
    max_length: int
    tokenizer_class: str = "BertTokenizer"


def write_export(directory: str | Path, config: dict, state: dict[str, torch.Tensor],
                 tokenizer_dir: str | Path | None, *, max_length: int, tokenizer_class: str = "BertTokenizer",
                 note: str = "the model is untouched: export it again",
                 parts: dict[str, ExportPart] | None = None) -> None:
    """Every model family's Hugging Face directory is written here: ``config`` as config.json, ``state`` as
    model.safetensors, and the tokenizer (ours in ``tokenizer/``, transformers' files beside it:
    ``models.hf_tokenizer``); each of ``parts`` likewise (tokenizer included) in the subdirectory its key names.

    A non-empty ``directory`` that is not an earlier export, and weights holding NaN or inf, are refused. Every
    file, the parts' too, is written into ``<directory>.partial`` and that is renamed to ``directory`` at the end, so
    a kill midway leaves the earlier export (or none), never a half-written ``directory`` nor one without its parts;
    a write that fails for want of space or permission removes it and raises a one-line ``StorageError`` ending
    with ``note``.
    """
    directory = Path(directory)
    parts = parts or {}
    if directory.is_dir() and any(directory.iterdir()) and not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: not empty and not an earlier export, which the export would replace; "
                              "pass a new or empty directory")
    for where, weights in ((directory, state), *((directory / name, part.state) for name, part in parts.items())):
        bad = non_finite(weights)
        if bad:
            raise CheckpointError(f"{where}: not exported: {len(bad)} weight tensors hold NaN or inf (first "
                                  f"{bad[0]}); export an earlier checkpoint of the run")
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an export that was killed
    try:
        partial.mkdir(parents=True)
        _write_files(partial, config, state, tokenizer_dir, max_length, tokenizer_class)
        for name, part in parts.items():
            (partial / name).mkdir()
            _write_files(partial / name, part.config, part.state, tokenizer_dir, part.max_length,
                         part.tokenizer_class)
    except Exception as error:
        failure = storage_failure(error, path=directory, doing="writing the Hugging Face export", note=note)
        if failure is None:
            raise
        shutil.rmtree(partial, ignore_errors=True)  # gives back the space it took
        raise failure from error
    replaced = directory.with_name(directory.name + ".replaced")
    shutil.rmtree(replaced, ignore_errors=True)
    if directory.exists():
        os.rename(directory, replaced)  # a directory cannot be renamed over a non-empty one
    os.rename(partial, directory)
    shutil.rmtree(replaced, ignore_errors=True)


def _write_files(directory: Path, config: dict, state: dict[str, torch.Tensor], tokenizer_dir: str | Path | None,
                 max_length: int, tokenizer_class: str) -> None:
    from safetensors.torch import save_file

    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer_dir is not None:
        shutil.copytree(tokenizer_dir, directory / "tokenizer", dirs_exist_ok=True)
        write_tokenizer_files(tokenizer_dir, directory, max_length=max_length, tokenizer_class=tokenizer_class)
