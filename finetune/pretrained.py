"""Where the encoder and its tokenizer come from: any of our checkpoints or any Hugging Face BERT, ALBERT or
ELECTRA directory.

* a Hugging Face directory (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``, with a
  ``vocab.txt``, a ``tokenizer.json`` (all that transformers 5 saves), a SentencePiece ``spiece.model`` or our
  ``tokenizer/``): used as it is. Its config.json's
  ``model_type`` picks the family (``FAMILIES``); any other type is refused in one line naming the file;
* one of our pretraining runs: its ``hf/`` export when the run finished (and the export did), otherwise its
  newest intact checkpoint, exported once into the finetuning output (any ZeRO stage, any number of ranks);
* a single checkpoint ``runs/X/checkpoints/step_NNNNNNNN``: exported the same way.

A weights file that is truncated, or a DeepSpeed checkpoint whose files fail their checksums or hold pickled
code, is refused here with one line naming the file; so is a file this user may not read, and an export that
finds no space.

Every family comes out the same way: ``load_encoder`` gives the encoder (``BertModel``, ``AlbertModel`` or
``ElectraModel``: the same padded/padding-free forward, ``config.hidden_size`` its output width) and
``load_tokenizer_for`` its tokenizer, checked against ``load_model_config``.
"""
from __future__ import annotations

import logging
from pathlib import Path

from torch import nn

from common.errors import CheckpointError, StorageError, storage_failure
from models import registry
from models.hf_io import check_weights_file, find_tokenizer, read_json_object
from pretrain.checkpoints import export_directory, finished_export, is_complete_run_export

log = logging.getLogger("finetune")

FAMILIES = registry.MODEL_TYPES  # config.json model_type values finetuning reads

Encoder = nn.Module  # a family's encoder (``models.registry.ModelFamily.encoder_class``)


def model_type(directory: str | Path) -> str:
    """The family of a Hugging Face directory, from its config.json's ``model_type`` (absent: BERT, as older BERT
    files have none); a type we cannot finetune is refused here, before anything is loaded."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json; pass a Hugging Face {', '.join(FAMILIES)} directory")
    family = read_json_object(path).get("model_type", "bert")
    if family not in FAMILIES:
        raise CheckpointError(f"{path}: model_type {family!r} cannot be finetuned here; pass a directory of one of "
                              f"{', '.join(FAMILIES)} (config.json model_type)")
    return family


def load_model_config(directory: str | Path):
    """The directory's config, as its family's dataclass (each has vocab_size, hidden_size, pad_token_id)."""
    return registry.family(model_type(directory)).load_config(directory)


def load_encoder(directory: str | Path, dropout: float | None = None) -> Encoder:
    """The encoder of a Hugging Face directory of any family in ``FAMILIES``, pretraining heads dropped (BERT and
    ALBERT keep their pooler, which their sequence heads read; ELECTRA has none). ``dropout`` replaces every
    dropout rate of the encoder (hidden and attention), for every family alike."""
    encoder = registry.family(model_type(directory)).load_encoder(directory)
    if dropout is not None:
        set_dropout(encoder, dropout)
    return encoder


def encoder_parameters(directory: str | Path) -> int:
    """How many parameters the directory's encoder has (pretraining heads left out), counted on the meta device:
    nothing is allocated or read but config.json."""
    import torch

    with torch.device("meta"):
        encoder = registry.family(model_type(directory)).encoder_class(load_model_config(directory))
    return sum(parameter.numel() for parameter in encoder.parameters())


def set_dropout(encoder: nn.Module, p: float) -> None:
    """Every ``nn.Dropout`` and every attention's probability dropout (SDPA takes it as a number) to ``p``."""
    for module in encoder.modules():
        if isinstance(module, nn.Dropout):
            module.p = p
        if isinstance(getattr(module, "dropout_p", None), float):  # an attention's, which SDPA takes as a number
            module.dropout_p = p


def resolve(path: str | Path, scratch: Path) -> Path:
    """A Hugging Face directory for ``path``, exporting a DeepSpeed checkpoint into ``scratch`` if needed."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; pass a Hugging Face BERT, ALBERT or ELECTRA "
                              "directory, a pretraining run directory or one of its checkpoints/step_* directories")
    if (path / "config.json").is_file():
        model_type(path)  # an unsupported family is refused before anything trains
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
    if not is_complete_run_export(target):  # the export renames its directory into place when it is whole
        try:
            export_checkpoint(found, target)
        except StorageError as error:  # said for the export command; here the remedy is another --output
            raise storage_failure(error.__cause__ or error, path=target, doing="exporting the checkpoint to finetune",
                                  fix="pass another --output", note=f"{found.path} is untouched") from error
    return target


def load_tokenizer_for(directory: Path):
    """The tokenizer that came with the checkpoint (``models.hf_io.find_tokenizer``), checked against the
    model's vocabulary."""
    config = load_model_config(directory)
    tokenizer = find_tokenizer(directory)
    if tokenizer is None:
        raise CheckpointError(f"{directory}: no tokenizer (none of vocab.txt, tokenizer.json, spiece.model, "
                              "tokenizer/); copy the vocabulary the model was pretrained with into the directory")
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids but the model's embedding "
                              f"only {config.vocab_size}: they do not belong together")
    if tokenizer.pad_id != config.pad_token_id:
        raise CheckpointError(f"{directory}: the tokenizer's [PAD] is id {tokenizer.pad_id} but the model was "
                              f"pretrained with pad_token_id {config.pad_token_id}")
    return tokenizer
