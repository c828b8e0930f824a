"""Hugging Face interop: load any BERT directory (config.json + safetensors or .bin) and export ours.

Parameter names already match ``transformers``' ``BertForPreTraining``, so conversion only deals with
the differences between checkpoints: an encoder-only ``BertModel`` has no ``bert.`` prefix and no heads,
older files carry a ``position_ids`` buffer, and the tied decoder is stored once.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from common import configlib
from common.errors import ConfigError, storage_failure
from pretrain.checkpoints import CheckpointError
from pretrain.model import BertConfig, BertForPreTraining

_TIED_OR_BUFFERS = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def load_config(directory: str | Path) -> BertConfig:
    return read_config(directory, "bert", BertConfig)


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


def config_from_dict(raw: dict, path: str | Path, model_type: str, config_cls):
    """``read_config`` of a config.json already read (e.g. the copy a distillation run records of its teacher's);
    ``path`` names it in the errors. Values are type-checked as a YAML config's are (``configlib``)."""
    if raw.get("model_type", "bert") != model_type:
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not {model_type!r}")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
    known = {f.name for f in dataclasses.fields(config_cls)}
    try:
        return configlib.from_dict(config_cls, {k: v for k, v in raw.items() if k in known}, str(path))
    except ConfigError as error:
        raise CheckpointError(f"{error}; export or download the model again") from None


# The networks a run's export of a ``model_type`` holds in subdirectories beside its own files (``write_export``'s
# ``parts``): an ELECTRA run exports its generator in generator/ with the discriminator.
RUN_EXPORT_PARTS = {"electra": ("generator",)}


def is_complete(directory: str | Path) -> bool:
    """A Hugging Face directory with its config and weights (an export cut short has neither or only one)."""
    directory = Path(directory)
    return (directory / "config.json").is_file() and any((directory / name).is_file() for name in WEIGHT_FILES)


def is_complete_run_export(directory: str | Path) -> bool:
    """``is_complete``, and for a family whose run exports more than one network (``RUN_EXPORT_PARTS``) each of its
    subdirectories too: an ELECTRA run's export without generator/ was cut short by an older, two-step export."""
    directory = Path(directory)
    if not is_complete(directory):
        return False
    try:
        model_type = read_json_object(directory / "config.json").get("model_type", "bert")
    except CheckpointError:  # not a JSON object: not an export this pipeline wrote whole
        return False
    return all(is_complete(directory / part) for part in RUN_EXPORT_PARTS.get(str(model_type), ()))


def export_directory(run_directory: str | Path) -> Path:
    """Where a pretraining run directory holds its Hugging Face export (written when the run finishes)."""
    return Path(run_directory) / "hf"


def finished_export(run_directory: str | Path) -> Path | None:
    """The Hugging Face export of a pretraining run directory when it is there whole (``is_complete_run_export``),
    else None."""
    directory = export_directory(run_directory)
    return directory if is_complete_run_export(directory) else None


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


def to_pretraining_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys of our ``BertForPreTraining`` from an HF ``BertForPreTraining``/``BertModel``/``BertForMaskedLM``."""
    out = {}
    for key, value in state.items():
        if not key.startswith(("bert.", "cls.")):
            key = "bert." + key  # an encoder-only BertModel checkpoint
        if key.endswith(("LayerNorm.gamma", "LayerNorm.beta")):  # the original TF-converted names
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key not in _TIED_OR_BUFFERS:
            out[key] = value
    return out


def load_pretrained(directory: str | Path) -> tuple[BertForPreTraining, list[str]]:
    """Our model with the directory's weights; returns it and the names of freshly initialised parameters.

    Encoder weights must all be present; the pretraining heads may be missing (an encoder-only
    checkpoint), in which case they keep their initialisation and are listed.
    """
    cfg = load_config(directory)
    model = BertForPreTraining(cfg)
    state = to_pretraining_state_dict(load_weights(directory))
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k != "cls.predictions.decoder.weight"]
    if result.unexpected_keys or any(k.startswith("bert.") for k in missing):
        raise CheckpointError(f"{directory}: weights do not match a BERT of this config: unexpected "
                              f"{result.unexpected_keys[:5]}, missing {[k for k in missing if k.startswith('bert.')][:5]}")
    return model, missing


def export(model: BertForPreTraining, directory: str | Path, tokenizer_dir: str | Path | None = None) -> None:
    """Write ``config.json`` and ``model.safetensors`` (NSP head kept) that ``transformers`` loads (``write_export``).

    With ``tokenizer_dir`` (a tokenizer saved by the preprocessing stage) the tokenizer goes along:
    as ``tokenizer/`` in our format, and, for a WordPiece vocabulary, also as the ``vocab.txt`` and
    ``tokenizer_config.json`` that ``transformers``' ``BertTokenizer`` reads.
    """
    config = {**dataclasses.asdict(model.config), "model_type": "bert", "architectures": ["BertForPreTraining"],
              "position_embedding_type": "absolute", "tie_word_embeddings": True}
    state = {k: v for k, v in model.state_dict().items()
             if k != "cls.predictions.decoder.weight"}  # tied to the word embeddings; stored once
    write_export(directory, config, state, tokenizer_dir, max_length=model.config.max_position_embeddings,
                 note="the checkpoint is untouched: export it again with `python -m pretrain.export`")


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
    model.safetensors, and the tokenizer (``export``); each of ``parts`` likewise (tokenizer included) in the
    subdirectory its key names.

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
        tokenizer_dir = Path(tokenizer_dir)
        shutil.copytree(tokenizer_dir, directory / "tokenizer", dirs_exist_ok=True)
        meta = json.loads((tokenizer_dir / "tokenizer.json").read_text())
        if (tokenizer_dir / "vocab.txt").is_file():
            shutil.copyfile(tokenizer_dir / "vocab.txt", directory / "vocab.txt")
            lower = bool(meta.get("lowercase", True))
            (directory / "tokenizer_config.json").write_text(json.dumps(
                {"tokenizer_class": tokenizer_class, "do_lower_case": lower, "strip_accents": None if lower else False,
                 "model_max_length": max_length}, indent=2) + "\n")
