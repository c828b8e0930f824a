"""Pretraining data: memory-mapped Arrow shards from the preprocessing stage, batched for the GPUs.

* The manifest is checked against what the model expects (format version, vocabulary size and hash,
  special ids, sequence length); a mismatch is refused with a message that says what differs.
* Each epoch's order is a permutation seeded from (seed, epoch). Rows are grouped by length within
  windows of that permutation, so a batch holds sequences of similar length and is padded only to
  its longest row (rounded up to a multiple of 8): little compute goes to padding.
* Every global batch is split into per-rank micro-batches: ranks read disjoint rows, and all of them
  see sequences of similar length, so no rank waits on a longer one.
* The position is (epoch, global batch index), independent of the number of ranks:
  ``state_dict``/``load_state_dict`` resume at the exact step, on the same or another world size.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from preprocess.schema import DatasetFormatError, check_manifest

PAD_MULTIPLE = 8


@dataclass(frozen=True)
class Expected:
    """What the model requires of a dataset."""

    vocab_size: int
    max_seq_length: int
    special_ids: dict | None = None
    vocab_sha256: str | None = None


class ShardedInstances:
    """All rows of a dataset directory, memory-mapped; columns as flat numpy arrays plus offsets."""

    def __init__(self, directory: str | Path, expected: Expected | None = None):
        directory = Path(directory)
        self.directory = directory
        manifest_path = directory / "manifest.json"
        if not manifest_path.is_file():
            raise DatasetFormatError(f"{directory}: no manifest.json; the preprocessing run did not finish "
                                     "(or this is not a dataset directory)")
        self.manifest = json.loads(manifest_path.read_text())
        check_manifest(self.manifest, str(directory))
        if expected is not None:
            check_compatible(self.manifest, expected, str(directory))
        self.pad_id = self.manifest["tokenizer"]["special_ids"]["[PAD]"]
        columns = {name: [] for name in ("input_ids", "masked_positions", "masked_labels")}
        segment_a, nsp = [], []
        for shard in self.manifest["shards"]:
            table = ipc.open_file(pa.memory_map(str(directory / shard["name"]))).read_all()
            for name in columns:
                columns[name].append(table.column(name).combine_chunks())
            segment_a.append(table.column("segment_a_len").to_numpy())
            nsp.append(table.column("next_sentence_label").to_numpy())
        self.input_ids = _Ragged(columns["input_ids"])
        self.masked_positions = _Ragged(columns["masked_positions"])
        self.masked_labels = _Ragged(columns["masked_labels"])
        self.segment_a_len = np.concatenate(segment_a) if segment_a else np.zeros(0, np.int32)
        self.next_sentence_label = np.concatenate(nsp) if nsp else np.zeros(0, np.int8)
        self.lengths = self.input_ids.lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def check(self, expected: Expected) -> None:
        """Refuse this dataset if it does not fit the model (see ``check_compatible``)."""
        check_compatible(self.manifest, expected, str(self.directory))


class _Ragged:
    """List arrays of several shards as one values array plus row offsets (zero-copy for one chunk)."""

    def __init__(self, arrays: list[pa.ListArray]):
        values, offsets, base = [], [np.zeros(1, np.int64)], 0
        for array in arrays:
            own = np.asarray(array.offsets, dtype=np.int64)
            values.append(array.flatten().to_numpy(zero_copy_only=False))
            offsets.append(own[1:] - own[0] + base)
            base += int(own[-1] - own[0])
        self.values = np.concatenate(values) if values else np.zeros(0, np.uint16)
        self.offsets = np.concatenate(offsets)
        self.lengths = np.diff(self.offsets)

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat values of ``rows`` in order, their lengths)."""
        lengths = self.lengths[rows]
        starts = self.offsets[rows]
        index = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())
        return self.values[index], lengths


def check_compatible(manifest: dict, expected: Expected, where: str) -> None:
    """Refuse a dataset whose tokenizer or sequence length does not match the model."""
    tok = manifest["tokenizer"]
    problems = []
    if tok["vocab_size"] > expected.vocab_size:
        problems.append(f"its vocabulary has {tok['vocab_size']} ids but the model's embedding has {expected.vocab_size}")
    if manifest["max_seq_length"] > expected.max_seq_length:
        problems.append(f"its sequences are up to {manifest['max_seq_length']} tokens but the model's position "
                        f"embeddings stop at {expected.max_seq_length}")
    if expected.special_ids is not None and tok["special_ids"] != expected.special_ids:
        problems.append(f"special token ids {tok['special_ids']} differ from the model's {expected.special_ids}")
    if expected.vocab_sha256 is not None and tok["vocab_sha256"] != expected.vocab_sha256:
        problems.append(f"vocabulary hash {tok['vocab_sha256'][:12]}… differs from the model's "
                        f"{expected.vocab_sha256[:12]}… (made with another tokenizer)")
    if problems:
        raise DatasetFormatError(f"{where} does not match the model: " + "; ".join(problems) +
                                 ". Preprocess with the model's tokenizer, or point data.path at a matching dataset")


def _seed(seed: int, *key) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, (seed, *key))).encode(), digest_size=8).digest(), "little")


def epoch_batches(lengths: np.ndarray, *, epoch: int, seed: int, global_batch: int,
                  window_batches: int = 64) -> np.ndarray:
    """Row ids of every global batch of an epoch, shape (num_batches, global_batch), each sorted by length.

    A seeded permutation is cut into windows of ``window_batches`` global batches; each window is sorted
    by length and cut into global batches, whose order is then shuffled. The tail that does not fill a
    global batch is left for the next epoch's permutation. Nothing here depends on the number of ranks,
    so a run resumed on another world size (same global batch) continues with the same samples.
    """
    rng = np.random.Generator(np.random.PCG64(_seed(seed, "epoch", epoch)))
    order = rng.permutation(len(lengths))
    num_batches = len(order) // global_batch
    order = order[:num_batches * global_batch]
    window = global_batch * window_batches
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        order[start:start + window] = chunk[np.argsort(lengths[chunk], kind="stable")]
    batches = order.reshape(num_batches, global_batch)
    return batches[rng.permutation(num_batches)]


def split_global_batch(rows: np.ndarray, *, accumulation: int, world_size: int, micro_batch: int) -> np.ndarray:
    """(accumulation, world_size, micro_batch): micro-step ``a`` of rank ``r`` reads ``[a, r]``.

    The global batch is sorted by length, so the ranks of one micro-step get sequences of similar length
    and none waits on a longer one; a single process with ``accumulation = world_size`` reads exactly the
    rows that the ranks of a data-parallel run read, in the same groups.
    """
    return rows.reshape(accumulation, world_size, micro_batch)


def collate(data: ShardedInstances, rows: np.ndarray) -> dict[str, np.ndarray]:
    """A padded micro-batch: ids, token types, attention mask, flat masked positions/labels, NSP labels."""
    tokens, lengths = data.input_ids.gather(rows)
    width = int(-(-lengths.max() // PAD_MULTIPLE) * PAD_MULTIPLE)
    batch = len(rows)
    row_of = np.repeat(np.arange(batch), lengths)
    col_of = np.arange(len(tokens)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    input_ids = np.full((batch, width), data.pad_id, dtype=np.int64)
    input_ids[row_of, col_of] = tokens
    attention_mask = np.zeros((batch, width), dtype=np.int64)
    attention_mask[row_of, col_of] = 1
    token_type_ids = ((np.arange(width)[None, :] >= data.segment_a_len[rows][:, None]) & (attention_mask == 1))
    positions, counts = data.masked_positions.gather(rows)
    labels, _ = data.masked_labels.gather(rows)
    flat_positions = positions.astype(np.int64) + np.repeat(np.arange(batch) * width, counts)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids.astype(np.int64),
            "attention_mask": attention_mask, "masked_positions": flat_positions,
            "masked_labels": labels.astype(np.int64), "next_sentence_labels": data.next_sentence_label[rows].astype(np.int64)}


class PretrainingLoader:
    """This rank's micro-batches, one optimizer step at a time, resumable at the exact step.

    Each micro-batch carries ``mlm_loss_scale``: (micro-batches in the global batch) / (masked tokens in
    the global batch). Summed token losses times this scale, averaged over micro-steps and ranks the way
    DeepSpeed averages gradients, give the mean over every masked token of the global batch, so the loss
    does not depend on how the batch is split across ranks and accumulation steps.
    """

    def __init__(self, data: ShardedInstances, *, micro_batch: int, accumulation: int, world_size: int,
                 rank: int, seed: int, window_batches: int = 64):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.global_batch = micro_batch * accumulation * world_size
        if len(data) < self.global_batch:
            raise DatasetFormatError(f"the dataset has {len(data)} rows, fewer than one global batch "
                                     f"({micro_batch} x {accumulation} accumulation x {world_size} ranks)")
        self.data, self.seed, self.window_batches = data, seed, window_batches
        self.micro_batch, self.accumulation, self.world_size, self.rank = micro_batch, accumulation, world_size, rank
        self.epoch, self.batch_index = 0, 0
        self._batches = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.data) // self.global_batch

    def state_dict(self) -> dict:
        """The position; valid on any world size with the same global batch size."""
        return {"epoch": self.epoch, "batch_index": self.batch_index, "global_batch": self.global_batch,
                "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if int(state.get("global_batch", self.global_batch)) != self.global_batch:
            raise ValueError(f"the checkpoint's global batch is {state['global_batch']} rows but this run's is "
                             f"{self.global_batch}; keep train.global_batch_size to resume at the same sample")
        self.epoch, self.batch_index, self._batches = int(state["epoch"]), int(state["batch_index"]), None

    def next_step(self) -> list[dict[str, np.ndarray]]:
        """The ``accumulation`` micro-batches of this rank for the next optimizer step."""
        if self._batches is None:
            self._batches = epoch_batches(self.data.lengths, epoch=self.epoch, seed=self.seed,
                                          global_batch=self.global_batch, window_batches=self.window_batches)
        if self.batch_index >= len(self._batches):
            self.epoch, self.batch_index, self._batches = self.epoch + 1, 0, None
            return self.next_step()
        rows = self._batches[self.batch_index]
        self.batch_index += 1
        masked_total = int(self.data.masked_positions.lengths[rows].sum())
        scale = self.accumulation * self.world_size / max(1, masked_total)
        parts = split_global_batch(rows, accumulation=self.accumulation, world_size=self.world_size,
                                   micro_batch=self.micro_batch)
        return [{**collate(self.data, parts[a, self.rank]), "mlm_loss_scale": np.float32(scale)}
                for a in range(self.accumulation)]
