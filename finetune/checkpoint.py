"""Where the encoder and its tokenizer come from: any of our checkpoints or any Hugging Face BERT directory.

* a Hugging Face directory (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``, with a
  ``vocab.txt`` or our ``tokenizer/``): used as it is;
* one of our pretraining runs: its ``hf/`` export when the run finished (and the export did), otherwise its
  newest intact checkpoint, exported once into the finetuning output (any ZeRO stage, any number of ranks);
* a single checkpoint ``runs/X/checkpoints/step_NNNNNNNN``: exported the same way.

A weights file that is truncated, or a DeepSpeed checkpoint whose files fail their checksums or hold pickled
code, is refused here with one line naming the file; so is a file this user may not read, and an export that
finds no space.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from common.errors import StorageError, storage_failure
from pretrain.hf_compat import (
    CheckpointError,
    check_weights_file,
    export_directory,
    finished_export,
    is_complete,
    load_config,
)

log = logging.getLogger("finetune")


def resolve(path: str | Path, scratch: Path) -> Path:
    """A Hugging Face directory for ``path``, exporting a DeepSpeed checkpoint into ``scratch`` if needed."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; pass a Hugging Face BERT directory, a "
                              "pretraining run directory or one of its checkpoints/step_* directories")
    if (path / "config.json").is_file():
        check_weights_file(path)
        return path
    export = finished_export(path)
    if export is not None:
        check_weights_file(export)
        return export
    if export_directory(path).exists():
        log.warning(f"{export_directory(path)} is incomplete (an export that did not finish): using the run's "
                    "newest complete checkpoint instead")
    from pretrain.export import export_checkpoint, find_checkpoint

    found = find_checkpoint(path)  # raises a CheckpointError that says what was expected
    target = scratch / f"exported-{found.directory.parent.name}-{found.tag}"
    if not is_complete(target):  # the export renames its directory into place when it is whole
        try:
            export_checkpoint(found, target)
        except StorageError as error:  # said for the export command; here the remedy is another --output
            raise storage_failure(error.__cause__ or error, path=target, doing="exporting the checkpoint to finetune",
                                  fix="pass another --output", note=f"{found.path} is untouched") from error
    return target


def load_tokenizer_for(directory: Path):
    """The tokenizer that came with the checkpoint, checked against the model's vocabulary."""
    from common.tokenizer import load_tokenizer

    config = load_config(directory)
    if (directory / "tokenizer" / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(str(directory / "tokenizer"))
    elif (directory / "vocab.txt").is_file():
        lowercase = True
        settings = directory / "tokenizer_config.json"
        if settings.is_file():
            lowercase = bool(json.loads(settings.read_text()).get("do_lower_case", True))
        tokenizer = load_tokenizer(str(directory / "vocab.txt"), lowercase=lowercase)
    else:
        raise CheckpointError(f"{directory}: no tokenizer (neither vocab.txt nor tokenizer/); copy the "
                              "vocabulary the model was pretrained with into the directory")
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids but the model's embedding "
                              f"only {config.vocab_size}: they do not belong together")
    if tokenizer.pad_id != config.pad_token_id:
        raise CheckpointError(f"{directory}: the tokenizer's [PAD] is id {tokenizer.pad_id} but the model was "
                              f"pretrained with pad_token_id {config.pad_token_id}")
    return tokenizer
