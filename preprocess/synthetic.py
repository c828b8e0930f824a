"""Synthetic datasets in the real shard format, of any number of rows, for tests and benchmarks at scale.

    python -m preprocess.synthetic --rows 100000000 --tokenizer vocab.txt --output data/synthetic-100m

The rows are random but shaped like the pipeline's instances of each kind (``common.objectives``):

* ``pairs`` (the default, phase-1/phase-2 instances): ``[CLS] A [SEP] B [SEP]``; most rows fill the sequence to
  within a few tokens (as the reference packing does), one in ten is short (uniform length, ``short_seq_prob``);
  the sentence label (NSP or SOP) is a coin flip.
* ``full_sentences``: ``[CLS] d1 [SEP] d2 [SEP] …``, a stream of documents cut into rows that end within a few
  tokens of the maximum, a document continuing in the next row; ``doc_sentences``: the same, one document per
  row (its last row short). Document lengths are log-normal around ``document_tokens`` (median), as real
  articles' are; ``doc_starts`` says where each document's block starts; the sentence label is 0.
* Static masks: 15% of the non-special tokens (at most ``max_predictions``, 80/10/10) at ascending positions —
  pairs of token masking by stratified draws, every other combination by ``common.masking`` with the
  tokenizer's word pieces; dynamic datasets store no masks.

Shards, ``manifest.json`` (with every shard's rows and sha256 and the ``objective``), ``config.yaml`` and
``tokenizer/`` are written the way the pipeline writes them, so the pretraining stage reads the result like any
dataset. Rows are a pure function of (seed, shard), so the output is the same for any number of worker
processes. The directory is built beside its final name and renamed into place; the free disk space is
checked first.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from common import schema
from common.hashing import stable_hash64
from common.masking import MaskingRecipe, MaskingVocab, mask_rows
from common.objectives import ObjectiveEntry, check_combination
from preprocess.shards import shard_name

BATCH_ROWS = 4096  # rows per record batch, as the pipeline writes shards
SHORT_SEQ_PROB = 0.1
MASKED_LM_PROB = 0.15


@dataclass(frozen=True)
class SyntheticSpec:
    rows: int
    max_seq_length: int = 128
    max_predictions: int = 20
    rows_per_shard: int = 131072
    seed: int = 0
    kind: str = "pairs"                    # pairs | full_sentences | doc_sentences
    sentence_objective: str | None = None  # nsp | sop | none; default: nsp for pairs, none for packed kinds
    masking: str = "static"                # static (masks stored) | dynamic (rows stored unmasked)
    mask_unit: str = "token"               # token | whole_word | span | ngram (static masks; recorded for dynamic)
    masked_lm_prob: float = MASKED_LM_PROB
    document_tokens: int = 300             # packed kinds: the median document length in tokens

    def __post_init__(self):
        check_combination(self.kind, self.objective.sentence_objective)
        if self.document_tokens < 1 or self.max_seq_length < 8:
            raise ValueError("document_tokens must be >= 1 and max_seq_length >= 8")

    @property
    def objective(self) -> ObjectiveEntry:
        """The manifest's ``objective`` entry."""
        sentence = self.sentence_objective or ("nsp" if self.kind == "pairs" else "none")
        return ObjectiveEntry(kind=self.kind, sentence_objective=sentence, masking=self.masking,
                              mask_unit=self.mask_unit, masked_lm_prob=self.masked_lm_prob,
                              max_predictions_per_seq=self.max_predictions)

    @property
    def num_shards(self) -> int:
        return max(1, -(-self.rows // self.rows_per_shard))

    def shard_rows(self, shard: int) -> int:
        return (shard + 1) * self.rows // self.num_shards - shard * self.rows // self.num_shards

    def estimated_bytes(self, token_bytes: int) -> int:
        """An upper bound on the shards' size: full-length rows and the largest number of predictions."""
        per_row = (self.max_seq_length * token_bytes + self.max_predictions * (2 + token_bytes)
                   + 3 * 4 + 4 + 1)  # three list offsets, segment_a_len, next_sentence_label
        if self.kind != "pairs":  # doc_starts: its offset and at most one start per two tokens
            per_row += 4 + self.max_seq_length
        return self.rows * per_row + self.num_shards * (1 << 16)


def synthetic_rows(spec: SyntheticSpec, key: tuple, rows: int, *, vocab_size: int, special_ids: dict,
                   vocab: MaskingVocab | None = None) -> pa.Table:
    """``rows`` random instances drawn for ``key`` as a table of the shard schema (without provenance).

    ``vocab`` (the tokenizer's word pieces) is needed for static masks other than pairs' token masking."""
    rng = np.random.Generator(np.random.PCG64(stable_hash64(spec.seed, "synthetic", *key)))
    objective = spec.objective
    first_word = max(special_ids.values()) + 1
    dtype = np.dtype(schema.token_numpy_dtype(vocab_size))
    if objective.packed:
        lengths, doc_starts, doc_counts = _packed_layout(rng, spec, rows)
        segment_a_len = lengths
    else:
        longest = spec.max_seq_length
        short = rng.random(rows) < SHORT_SEQ_PROB
        lengths = np.where(short, rng.integers(8, longest + 1, rows),
                           longest - np.minimum(rng.geometric(1 / 6, rows) - 1, longest // 2)).astype(np.int64)
        # [CLS] A [SEP] B [SEP] with at least one token in each segment.
        segment_a_len = (2 + (rng.random(rows) * (lengths - 3)).astype(np.int64)).clip(3, lengths - 2)
    starts = np.cumsum(lengths) - lengths
    tokens = rng.integers(first_word, vocab_size, int(lengths.sum())).astype(dtype)
    tokens[starts] = special_ids["[CLS]"]
    if objective.packed:
        block_ends = np.repeat(starts, doc_counts) + np.append(doc_starts[1:], 0)  # the next block's start...
        block_ends[np.cumsum(doc_counts) - 1] = starts + lengths  # ...or the row's end
        tokens[block_ends - 1] = special_ids["[SEP]"]
    else:
        tokens[starts + segment_a_len - 1] = special_ids["[SEP]"]
        tokens[starts + lengths - 1] = special_ids["[SEP]"]
    if objective.masking == "dynamic":
        positions, counts, labels = np.zeros(0, np.int64), np.zeros(rows, np.int64), tokens[:0]
    elif objective.packed or objective.mask_unit != "token":
        if vocab is None:
            raise ValueError(f"static {objective.mask_unit} masks of {objective.kind} rows need the tokenizer's "
                             "MaskingVocab")
        positions, counts, labels = _mask_with_recipe(rng, tokens, lengths, spec, vocab)
    else:  # pairs with token masks: stratified draws (the bytes every earlier synthetic dataset had)
        positions, counts = _masked_positions(rng, lengths, segment_a_len, spec.max_predictions,
                                             spec.masked_lm_prob)
        flat = np.repeat(starts, counts) + positions
        labels = tokens[flat].copy()
        action = rng.random(len(flat))
        tokens[flat[action < 0.8]] = special_ids["[MASK]"]
        randomised = flat[(action >= 0.8) & (action < 0.9)]
        tokens[randomised] = rng.integers(first_word, vocab_size, len(randomised)).astype(dtype)
    sentence_labels = (rng.integers(0, 2, rows) if objective.sentence_objective != "none"
                       else np.zeros(rows)).astype(np.int8)
    token_type = schema.token_type(vocab_size)
    columns = [
        _lists(tokens, lengths, token_type),
        pa.array(segment_a_len.astype(np.int32), pa.int32()),
        _lists(positions.astype(np.uint16), counts, pa.uint16()),
        _lists(labels, counts, token_type),
        pa.array(sentence_labels, pa.int8()),
    ]
    if objective.packed:
        columns.append(_lists(doc_starts.astype(np.uint16), doc_counts, pa.uint16()))
    return pa.Table.from_arrays(columns, schema=schema.instance_schema(vocab_size, provenance=False,
                                                                       packed=objective.packed))


def _packed_layout(rng: np.random.Generator, spec: SyntheticSpec, rows: int) -> tuple[np.ndarray, ...]:
    """(row lengths, flat document block starts, blocks per row) of packed rows cut from a stream of documents.

    A row is ``[CLS]`` then blocks ``piece [SEP]``; it ends a few tokens short of the maximum (whole sentences do
    not fill it exactly). ``full_sentences`` starts the next document in the same row while a block fits (a
    token and its [SEP]); ``doc_sentences`` ends the row with its document.
    """
    longest = spec.max_seq_length
    slack = np.minimum(rng.geometric(1 / 3, rows) - 1, longest // 4)
    # Log-normal document lengths (real articles: many stubs, a long tail), at least one token.
    expected = rows * (longest // spec.document_tokens + 1) + 64  # more documents than the rows can hold
    documents = np.maximum(1, rng.lognormal(np.log(spec.document_tokens), 1.0, expected).astype(np.int64))
    lengths, starts, counts = np.zeros(rows, np.int64), [], np.zeros(rows, np.int64)
    doc, left = 0, int(documents[0])
    for row in range(rows):
        used, room = 1, longest - int(slack[row])  # the [CLS]
        while room - used >= 2:
            starts.append(0 if counts[row] == 0 else used)
            counts[row] += 1
            take = min(left, room - used - 1)
            used, left = used + take + 1, left - take
            if left == 0:
                doc += 1
                left = int(documents[doc % len(documents)])
                if spec.kind == "doc_sentences":
                    break
            else:
                break  # the document goes on in the next row
        lengths[row] = used
    return lengths, np.asarray(starts, np.int64), counts


def _mask_with_recipe(rng: np.random.Generator, tokens: np.ndarray, lengths: np.ndarray, spec: SyntheticSpec,
                      vocab: MaskingVocab) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Static masks drawn by ``common.masking`` (tokens changed in place): (flat positions, counts, labels)."""
    width = int(lengths.max())
    valid = np.arange(width)[None, :] < lengths[:, None]
    dense = np.zeros((len(lengths), width), tokens.dtype)
    dense[valid] = tokens
    never = np.zeros(len(vocab.is_continuation), bool)
    never[list(vocab.never_mask_ids)] = True
    recipe = MaskingRecipe(mode=spec.mask_unit, rate=spec.masked_lm_prob, max_predictions=spec.max_predictions)
    keys = rng.integers(0, np.iinfo(np.uint64).max, len(lengths), dtype=np.uint64, endpoint=True)
    masked = mask_rows(dense, valid & ~never[dense], lengths, keys, recipe, vocab)
    tokens[:] = dense[valid]
    return masked.cols, np.bincount(masked.rows, minlength=len(lengths)), masked.labels


def _masked_positions(rng: np.random.Generator, lengths: np.ndarray, segment_a_len: np.ndarray,
                      max_predictions: int, rate: float = MASKED_LM_PROB) -> tuple[np.ndarray, np.ndarray]:
    """Ascending, distinct, non-special positions per row (stratified draws), flat, and their counts."""
    candidates = lengths - 3  # every position but [CLS] and the two [SEP]s
    counts = np.minimum(max_predictions, np.maximum(1, np.rint(lengths * rate))).astype(np.int64)
    counts = np.minimum(counts, candidates)
    slot = np.arange(max_predictions)[None, :]
    # One draw in each of ``count`` equal strata of the candidates: distinct and ascending by construction.
    low = slot * candidates[:, None] // counts[:, None]
    high = (slot + 1) * candidates[:, None] // counts[:, None]
    drawn = low + (rng.random((len(lengths), max_predictions)) * (high - low)).astype(np.int64)
    used = slot < counts[:, None]
    drawn = drawn[used]
    segment_a_words = np.repeat(segment_a_len - 2, counts)  # candidates before the middle [SEP]
    return np.where(drawn < segment_a_words, drawn + 1, drawn + 2), counts


def _lists(values: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))


def _write_shard(job: tuple) -> dict:
    spec, shard, directory, vocab_size, special_ids, vocab = job
    name = shard_name(shard, spec.num_shards)
    path = Path(directory) / name
    output_schema = schema.instance_schema(vocab_size, provenance=False, packed=spec.objective.packed)
    rows, tokens, written = spec.shard_rows(shard), 0, 0
    digest = hashlib.sha256()
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, output_schema) as writer:
        while written < rows:
            # Generated a batch at a time, so a worker's memory does not grow with the shard.
            count = min(BATCH_ROWS * 16, rows - written)
            table = synthetic_rows(spec, (shard, written), count, vocab_size=vocab_size, special_ids=special_ids,
                                   vocab=vocab)
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                writer.write_batch(batch)
            tokens += len(table.column("input_ids").chunk(0).values)
            written += count
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return {"name": name, "rows": rows, "sha256": digest.hexdigest(), "bytes": path.stat().st_size, "tokens": tokens}


def write_synthetic(spec: SyntheticSpec, tokenizer_path: str, output: str | Path, *, workers: int = 1,
                    lowercase: bool = True) -> dict:
    """Write a synthetic dataset to ``output`` (which must not exist); returns its manifest."""
    from common.tokenizer import load_tokenizer

    output = Path(output)
    if output.exists():
        raise FileExistsError(f"{output} exists; choose a new directory or remove it first")
    tok = load_tokenizer(tokenizer_path, lowercase=lowercase)
    identity = tok.identity()
    needed = spec.estimated_bytes(np.dtype(schema.token_numpy_dtype(tok.vocab_size)).itemsize)
    output.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(output.parent).free
    if needed > free:
        raise OSError(f"{output.parent}: {spec.rows:,} rows need up to {needed / 2**30:.1f} GiB but "
                      f"{free / 2**30:.1f} GiB are free; choose fewer rows or another disk")
    staging = output.with_name(output.name + ".incomplete")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    vocab = MaskingVocab.from_tokenizer(tok)
    jobs = [(spec, shard, str(staging), tok.vocab_size, identity["special_ids"], vocab)
            for shard in range(spec.num_shards)]
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            entries = pool.map(_write_shard, jobs, chunksize=1)
    else:
        entries = [_write_shard(job) for job in jobs]
    tok.save(str(staging / schema.TOKENIZER_DIR))
    manifest = {
        "format": schema.FORMAT_NAME,
        "format_version": schema.FORMAT_VERSION,
        "tokenizer": {**identity, "dir": schema.TOKENIZER_DIR},
        "token_dtype": schema.token_numpy_dtype(tok.vocab_size),
        "max_seq_length": spec.max_seq_length,
        "objective": asdict(spec.objective),
        "parameters": {"synthetic": asdict(spec)},
        "inputs": [],
        "rows": spec.rows,
        "tokens": sum(e["tokens"] for e in entries),
        "shards": entries,
        "summary": {"instances": spec.rows, "instance_tokens": sum(e["tokens"] for e in entries),
                    "shards": len(entries), "synthetic": True},
    }
    (staging / schema.CONFIG_NAME).write_text(json.dumps({"synthetic": asdict(spec)}, indent=2) + "\n")
    (staging / schema.MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(staging, output)
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--output", required=True, help="a new directory")
    parser.add_argument("--tokenizer", required=True, help="a WordPiece vocab.txt or a saved tokenizer directory")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--rows-per-shard", type=int, default=131072)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", default="pairs", help="pairs | full_sentences | doc_sentences")
    parser.add_argument("--sentence-objective", default=None, help="nsp | sop | none (default: the kind's)")
    parser.add_argument("--masking", default="static", help="static | dynamic (rows stored unmasked)")
    parser.add_argument("--mask-unit", default="token", help="token | whole_word | span | ngram (static masks)")
    parser.add_argument("--masked-lm-prob", type=float, default=MASKED_LM_PROB)
    parser.add_argument("--document-tokens", type=int, default=300, help="packed kinds: median document length")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        spec = SyntheticSpec(rows=args.rows, max_seq_length=args.max_seq_length,
                             max_predictions=args.max_predictions, rows_per_shard=args.rows_per_shard, seed=args.seed,
                             kind=args.kind, sentence_objective=args.sentence_objective, masking=args.masking,
                             mask_unit=args.mask_unit, masked_lm_prob=args.masked_lm_prob,
                             document_tokens=args.document_tokens)
        manifest = write_synthetic(spec, args.tokenizer, args.output, workers=args.workers)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    size = sum(entry["bytes"] for entry in manifest["shards"])
    print(f"{args.output}: {manifest['rows']:,} rows, {manifest['tokens']:,} tokens in {len(manifest['shards'])} "
          f"shards ({size / 2**30:.2f} GiB) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
