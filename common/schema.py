"""The on-disk dataset format: Arrow IPC file shards plus ``manifest.json``. Writer and reader rules live here.

Imports pyarrow only, so the pretraining stage can read datasets without Apache Beam.
"""
from __future__ import annotations

import json

import pyarrow as pa

FORMAT_NAME = "bert-instances"
FORMAT_VERSION = 2
# Version 1 had no ``doc_starts`` column and no ``objective`` in the manifest; it reads as pairs with NSP and
# static masking (``common.manifest.ObjectiveEntry``).
READABLE_FORMAT_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.json"
TOKENIZER_DIR = "tokenizer"
DEAD_LETTERS_NAME = "dead_letters.jsonl"
CONFIG_NAME = "config.yaml"


def token_type(vocab_size: int) -> pa.DataType:
    """uint16 while every id fits (vocab_size <= 65,536), else uint32."""
    return pa.uint16() if vocab_size <= 65536 else pa.uint32()


def token_numpy_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65536 else "uint32"


def instance_schema(vocab_size: int, provenance: bool, metadata: dict | None = None, *,
                    packed: bool = False) -> pa.Schema:
    """Schema of a shard: one unpadded instance per row.

    Rows of the ``pairs`` kind are ``[CLS] A [SEP] B [SEP]``. Packed rows (``full_sentences``,
    ``doc_sentences``) are ``[CLS] d1 [SEP] d2 [SEP] …``: pieces of one or more documents, each followed by
    [SEP], all of token type 0 (``segment_a_len`` is the row's length), and ``doc_starts`` lists where each
    document's block starts (the first at 0, its [CLS]; the next ones just after a [SEP]). Only packed datasets
    have the ``doc_starts`` column: a pair row is one block. Dynamically masked datasets store empty
    ``masked_positions`` and ``masked_labels`` (the pretraining loader draws the masks).
    """
    tok = token_type(vocab_size)
    fields = [
        pa.field("input_ids", pa.list_(tok), nullable=False),            # [CLS] A [SEP] B [SEP]
        pa.field("segment_a_len", pa.int32(), nullable=False),          # len([CLS] A [SEP])
        pa.field("masked_positions", pa.list_(pa.uint16()), nullable=False),  # ascending
        pa.field("masked_labels", pa.list_(tok), nullable=False),        # original ids
        pa.field("next_sentence_label", pa.int8(), nullable=False),     # nsp: 1 random B; sop: 1 swapped; none: 0
    ]
    if packed:
        fields.append(pa.field("doc_starts", pa.list_(pa.uint16()), nullable=False))  # ascending, first 0
    if provenance:
        fields += [pa.field("doc_a", pa.string(), nullable=False), pa.field("doc_b", pa.string(), nullable=False)]
    meta = {"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION)}
    meta.update({k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in (metadata or {}).items()})
    return pa.schema(fields, metadata=meta)
