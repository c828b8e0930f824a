"""Pretraining data: memory-mapped Arrow shards from the preprocessing stage, batched for the GPUs.

* The manifest is checked against what the model expects (format version, vocabulary size and hash,
  special ids, sequence length); a mismatch is refused with a message that says what differs.
* Shards are read in place through memory maps: opening a dataset of any size reads no rows, and a rank
  holds no per-row arrays (its private memory does not grow with the dataset).
* The order of an epoch (``pretrain.sampling``): a seeded permutation evaluated on the fly, grouped by
  length within windows, so a batch holds sequences of similar length and is padded only to its longest
  row (rounded up to a multiple of 8): little compute goes to padding.
* Every global batch is split into per-rank micro-batches: ranks read disjoint rows, and all of them
  see sequences of similar length, so no rank waits on a longer one.
* The position is (epoch, global batch index), independent of the number of ranks:
  ``state_dict``/``load_state_dict`` resume at the exact step, on the same or another world size.
* Rows of a dynamically masked dataset are masked as they are read (``pretrain.dynamic_masking``), by the
  rank that reads them, with masks that depend on (seed, epoch, row) only.
* Packed rows (``[CLS] d1 [SEP] d2 [SEP] …``) carry where each document's block starts (``doc_starts``); with
  document attention a micro-batch also holds each token's document and its position within it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from common.errors import DatasetFormatError
from common.manifest import Manifest, ModelRequirements
from common.verify import check_shard_files, verify_shards
from pretrain.dynamic_masking import DynamicMasking
from pretrain.mapped_shards import MappedShard, ranges
from pretrain.sampling import ORDER_VERSION, EpochOrder, epoch_batches

PAD_MULTIPLE = 8


class ShardedInstances:
    """The rows of a dataset directory, read in place from its memory-mapped shards.

    Opening a dataset checks that every shard exists with the size the manifest lists (with ``verify``, also
    its sha256, which reads every byte). A shard is mapped, and a record batch of it located (its header
    read, its row count checked), when a row of it is first read: no row is read at start-up, and a rank's
    own memory for the dataset is a few numbers per record batch (of 4,096 rows), whatever its rows. The rows'
    bytes stay in the page cache, which the ranks of a node share. Rows are numbered shard by shard in manifest
    order. With ``evaluation``, the rows are the dataset's held-out split (``open_evaluation``).
    """

    def __init__(self, directory: str | Path, expected: ModelRequirements | None = None, *, verify: bool = False,
                 evaluation: bool = False):
        self.directory = Path(directory)
        self.manifest = Manifest.read(self.directory)
        if evaluation:
            self.manifest = self.manifest.evaluation_split()
            if self.manifest is None:
                raise DatasetFormatError(f"{self.directory}: no evaluation split (manifest.json has no 'evaluation'); "
                                         "preprocess with a heldout section, or open it with open_evaluation")
        if expected is not None:
            self.manifest.check_fits(expected)
        self.pad_id = self.manifest.tokenizer.special_ids["[PAD]"]
        self.vocab_size = self.manifest.tokenizer.vocab_size
        self.packed = self.manifest.objective.packed
        check_shard_files(self.manifest)
        self._shards = [MappedShard(self.manifest.shard_path(entry), entry.rows, self.packed)
                        for entry in self.manifest.shards]
        self.tokenizer_dir = self.manifest.tokenizer_path()
        self.manifest.check_totals()
        if verify:
            verify_shards(self.manifest)
        self._shard_starts = np.zeros(len(self._shards) + 1, np.int64)
        np.cumsum([shard.num_rows for shard in self._shards], out=self._shard_starts[1:])

    def __len__(self) -> int:
        return int(self._shard_starts[-1])

    def check(self, expected: ModelRequirements) -> None:
        """Refuse this dataset if it does not fit the model (``Manifest.check_fits``)."""
        self.manifest.check_fits(expected)

    def locate(self, rows: np.ndarray) -> list[tuple[MappedShard, np.ndarray, np.ndarray, np.ndarray]]:
        """``rows`` grouped by shard: (shard, positions in ``rows``, record batch, row within the batch)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows outside the dataset's {len(self)}")
        shard_of = np.searchsorted(self._shard_starts, rows, side="right") - 1
        order = np.argsort(shard_of, kind="stable")
        bounds = np.searchsorted(shard_of[order], np.arange(len(self._shards) + 1))
        groups = []
        for index in np.flatnonzero(np.diff(bounds)):
            selection = order[bounds[index]:bounds[index + 1]]
            shard = self._shards[index]
            groups.append((shard, selection, *shard.locate(rows[selection] - self._shard_starts[index])))
        return groups

    def where(self, row: int) -> str:
        """``row`` as "SHARD PATH, row N" for messages."""
        index = int(np.searchsorted(self._shard_starts, row, side="right") - 1)
        return f"{self._shards[index].path}, row {row - int(self._shard_starts[index])}"

    def list_lengths(self, column: str, rows: np.ndarray) -> np.ndarray:
        """The number of values in ``column`` of each row (int64, in the order of ``rows``)."""
        lengths = np.zeros(len(rows), np.int64)
        for shard, selection, batch, row in self.locate(rows):
            lengths[selection] = shard.list_bounds(column, batch, row)[1]
        return lengths

    def lengths_of(self, rows: np.ndarray) -> np.ndarray:
        """Tokens in each row."""
        return self.list_lengths("input_ids", rows)

    def gather(self, column: str, located: list, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(the values of list column ``column`` of the ``count`` located rows, concatenated in row order;
        each row's number of values)."""
        starts = np.zeros(count, np.int64)
        lengths = np.zeros(count, np.int64)
        for shard, selection, batch, row in located:
            starts[selection], lengths[selection] = shard.list_bounds(column, batch, row)
        out_starts = np.cumsum(lengths) - lengths
        out = None
        for shard, selection, _, _ in located:
            values = shard.values(column)
            if out is None:
                out = np.empty(int(lengths.sum()), values.dtype)
            out[ranges(out_starts[selection], lengths[selection])] = values[ranges(starts[selection], lengths[selection])]
        return (out if out is not None else np.zeros(0, np.int64)), lengths

    def scalars(self, column: str, located: list, count: int) -> np.ndarray:
        """The values of scalar column ``column`` of the ``count`` located rows, in row order."""
        out = np.zeros(count, np.int64)
        for shard, selection, batch, row in located:
            out[selection] = shard.scalar(column, batch, row)
        return out


_SAID_NO_EVALUATION: set[str] = set()  # datasets already logged as having no evaluation split


def open_evaluation(directory: str | Path, expected: ModelRequirements | None = None, *,
                    verify: bool = False) -> ShardedInstances | None:
    """The held-out split of the dataset in ``directory``, whose rows read as the training rows do (``read_rows``,
    ``collate``; their masks are stored, also for a dynamically masked dataset: every run is scored on the same
    positions); None for a dataset without one (made before the split existed, or without ``heldout``), logged once
    per dataset: evaluation is then off."""
    if Manifest.read(directory).evaluation is None:
        if str(directory) not in _SAID_NO_EVALUATION:
            _SAID_NO_EVALUATION.add(str(directory))
            logging.getLogger("pretrain").info("no evaluation split in %s: evaluation off", directory)
        return None
    return ShardedInstances(directory, expected, verify=verify, evaluation=True)


def split_global_batch(rows: np.ndarray, *, accumulation: int, world_size: int, micro_batch: int) -> np.ndarray:
    """(accumulation, world_size, micro_batch): micro-step ``a`` of rank ``r`` reads ``[a, r]``.

    The global batch is sorted by length, so the ranks of one micro-step get sequences of similar length
    and none waits on a longer one; a single process with ``accumulation = world_size`` reads exactly the
    rows that the ranks of a data-parallel run read, in the same groups.
    """
    return rows.reshape(accumulation, world_size, micro_batch)


@dataclass(frozen=True)
class RowBlock:
    """Consecutive rows read from the shards: each list column flat, with per-row counts."""

    tokens: np.ndarray
    lengths: np.ndarray
    positions: np.ndarray
    counts: np.ndarray
    labels: np.ndarray
    segment_a_len: np.ndarray
    next_sentence_label: np.ndarray
    doc_starts: np.ndarray | None = None  # packed rows: each document block's first column, flat
    doc_counts: np.ndarray | None = None  # blocks per row

    def __len__(self) -> int:
        return len(self.lengths)


def read_rows(data: ShardedInstances, rows: np.ndarray) -> RowBlock:
    """``rows`` in order, read with one pass over the shards they fall in."""
    rows = np.asarray(rows, dtype=np.int64)
    located = data.locate(rows)
    tokens, lengths = data.gather("input_ids", located, len(rows))
    positions, counts = data.gather("masked_positions", located, len(rows))
    labels, _ = data.gather("masked_labels", located, len(rows))
    for values, per_row, column in ((tokens, lengths, "input_ids"), (labels, counts, "masked_labels")):
        if len(values) and values.max() >= data.vocab_size:
            first = int(np.flatnonzero(values >= data.vocab_size)[0])
            bad = int(np.searchsorted(np.cumsum(per_row), first, side="right"))
            raise DatasetFormatError(f"{data.where(rows[bad])}: {column} holds id {int(values[first])}, beyond the "
                                     f"vocabulary of {data.vocab_size}; the shard was altered or belongs to "
                                     "another dataset: copy the dataset again, or re-run preprocessing")
    doc_starts = doc_counts = None
    if data.packed:
        doc_starts, doc_counts = data.gather("doc_starts", located, len(rows))
        _check_doc_starts(data, rows, doc_starts, doc_counts, lengths)
    return RowBlock(tokens, lengths, positions, counts, labels, data.scalars("segment_a_len", located, len(rows)),
                    data.scalars("next_sentence_label", located, len(rows)), doc_starts, doc_counts)


def _check_doc_starts(data: ShardedInstances, rows: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                      lengths: np.ndarray) -> None:
    """Every packed row's blocks start at 0 and ascend inside the row (the positions built from them must be)."""
    first = np.cumsum(counts) - counts
    row_of = np.repeat(np.arange(len(rows)), counts)
    inside = np.ones(len(starts), bool)
    if len(starts):
        inside = (starts < lengths[row_of]) & np.append(True, np.diff(starts.astype(np.int64)) > 0)
        inside[first[counts > 0]] = starts[first[counts > 0]] == 0
    bad = np.flatnonzero(counts == 0).tolist() + np.unique(row_of[~inside]).tolist()
    if bad:
        raise DatasetFormatError(f"{data.where(int(rows[min(bad)]))}: its doc_starts do not start at 0 and ascend "
                                 "inside the row; the shard was altered: copy the dataset again, or re-run "
                                 "preprocessing")


def padded_width(longest: int, multiple: int = PAD_MULTIPLE, limit: int | None = None) -> int:
    """``longest`` rounded up to a multiple of ``multiple``, but not past ``limit`` (the dataset's sequence length,
    which no row exceeds): with ``multiple`` a divisor of ``limit``, the widths are ``limit / multiple`` buckets."""
    width = -(-int(longest) // multiple) * multiple
    return max(int(longest), min(width, limit)) if limit is not None else width


def pad(block: RowBlock, pad_id: int, first: int = 0, stop: int | None = None, *, documents: bool = False,
        multiple: int = PAD_MULTIPLE, limit: int | None = None, padding_free: bool = False) -> dict[str, np.ndarray]:
    """Rows ``[first, stop)`` of ``block`` as a padded micro-batch (its width: ``padded_width``): ids, token types,
    attention mask, flat masked positions (into the flattened batch) and labels, sentence-pair labels; with
    ``documents`` (packed rows) also ``document_ids`` (each token's block, from 0) and ``position_ids`` (restarting
    at each block); with ``padding_free`` also what the padding-free encoder needs (``host_unpadding``)."""
    stop = len(block) if stop is None else stop
    token_ends, mask_ends = np.cumsum(block.lengths), np.cumsum(block.counts)
    lengths, counts = block.lengths[first:stop], block.counts[first:stop]
    tokens = block.tokens[token_ends[first] - block.lengths[first]:token_ends[stop - 1]]
    masked = slice(mask_ends[first] - block.counts[first], mask_ends[stop - 1])
    batch = stop - first
    width = padded_width(lengths.max(), multiple, limit)
    row_of = np.repeat(np.arange(batch), lengths)
    col_of = np.arange(len(tokens)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    input_ids = np.full((batch, width), pad_id, dtype=np.int64)
    input_ids[row_of, col_of] = tokens
    attention_mask = np.zeros((batch, width), dtype=np.int64)
    attention_mask[row_of, col_of] = 1
    segment_a_len = block.segment_a_len[first:stop]
    token_type_ids = ((np.arange(width)[None, :] >= segment_a_len[:, None]) & (attention_mask == 1))
    flat_positions = block.positions[masked].astype(np.int64) + np.repeat(np.arange(batch) * width, counts)
    out = {"input_ids": input_ids, "token_type_ids": token_type_ids.astype(np.int64),
           "attention_mask": attention_mask, "masked_positions": flat_positions,
           "masked_labels": block.labels[masked].astype(np.int64),
           "next_sentence_labels": block.next_sentence_label[first:stop]}
    if documents:
        out.update(_documents(block, first, stop, width))
    if padding_free:
        out.update(host_unpadding(row_of * width + col_of, lengths, flat_positions, out.get("document_ids")))
    return out


def host_unpadding(real_index: np.ndarray, lengths: np.ndarray, masked_positions: np.ndarray,
                   document_ids: np.ndarray | None = None) -> dict:
    """The sizes of a right-padded micro-batch's unpadded layout (``models.attention.Unpadding.from_loader``),
    computed here on the host, where the rows are known, so that the padding-free step reads nothing back from the
    device: ``unpadded_index`` (the real tokens' flat positions, row by row), ``cu_seqlens`` and ``max_seqlen`` (the
    rows), ``unpadded_masked_positions`` (each masked position's row in the unpadded layout) and, with ``document_ids``
    (batch, width), ``segment_starts`` and ``longest_segment`` (the documents within rows, where attention stays)."""
    cu_seqlens = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    unpadded_masked = np.searchsorted(real_index, masked_positions)
    if len(masked_positions) and (unpadded_masked.max() >= len(real_index)
                                    or (real_index[unpadded_masked] != masked_positions).any()):
        raise ValueError("a masked position falls on padding, which the padding-free path drops")
    out = {"unpadded_index": real_index.astype(np.int64), "cu_seqlens": cu_seqlens, "max_seqlen": int(lengths.max()),
           "unpadded_masked_positions": unpadded_masked.astype(np.int64)}
    if document_ids is not None:
        real_documents = document_ids.reshape(-1)[real_index]
        starts = np.zeros(len(real_index), dtype=bool)
        starts[cu_seqlens[:-1]] = True
        starts[1:] |= real_documents[1:] != real_documents[:-1]
        bounds = np.append(np.flatnonzero(starts), len(real_index)).astype(np.int32)
        out.update(segment_starts=bounds, longest_segment=int(np.diff(bounds).max()))
    return out


def _documents(block: RowBlock, first: int, stop: int, width: int) -> dict[str, np.ndarray]:
    """``document_ids`` and ``position_ids`` (batch, width) of rows ``[first, stop)``; padding continues the last
    block (the model lets padded queries attend to their row's real tokens; their outputs are never read)."""
    if block.doc_starts is None:
        raise ValueError("document attention needs packed rows (doc_starts)")
    block_ends = np.cumsum(block.doc_counts)
    starts = block.doc_starts[block_ends[first] - block.doc_counts[first]:block_ends[stop - 1]].astype(np.int64)
    counts = block.doc_counts[first:stop]
    begins = np.zeros((stop - first, width), bool)
    begins[np.repeat(np.arange(stop - first), counts), starts] = True
    columns = np.arange(width)[None, :]
    block_first = np.maximum.accumulate(np.where(begins, columns, 0), axis=1)
    return {"document_ids": np.cumsum(begins, axis=1) - 1, "position_ids": columns - block_first}


def collate(data: ShardedInstances, rows: np.ndarray) -> dict[str, np.ndarray]:
    """``rows`` as one padded micro-batch (see ``pad``)."""
    return pad(read_rows(data, rows), data.pad_id)


def mask_dynamically(data: ShardedInstances, block: RowBlock, rows: np.ndarray, epoch: int,
                     masking: DynamicMasking) -> RowBlock:
    """``block`` (the dataset's ``rows``, stored unmasked) with the masks of ``epoch``."""
    if block.counts.any():
        first = int(np.flatnonzero(block.counts)[0])
        raise DatasetFormatError(f"{data.where(int(rows[first]))}: masked positions stored in a dataset whose "
                                 f"manifest ({data.manifest.path}) says its masking is dynamic; the manifest was "
                                 "altered: re-run preprocessing")
    tokens, positions, counts, labels = masking.mask(block.tokens, block.lengths, masking.row_keys(epoch, rows))
    return replace(block, tokens=tokens, positions=positions, counts=counts, labels=labels)


class PretrainingLoader:
    """This rank's micro-batches, one optimizer step at a time, resumable at the exact step.

    Each micro-batch carries ``mlm_loss_scale``: (micro-batches in the global batch) / (masked tokens in
    the global batch). Summed token losses times this scale, averaged over micro-steps and ranks the way
    DeepSpeed averages gradients, give the mean over every masked token of the global batch, so the loss
    does not depend on how the batch is split across ranks and accumulation steps. ``token_loss_scale`` is the
    same over every real token of the global batch (the row lengths, known to every rank without communicating),
    for losses on all tokens: ELECTRA's discriminator, distillation's hidden-state alignment.

    With ``masking`` (a dynamically masked dataset) each rank masks only the rows it reads, and the global
    batch's masked count is their sum over ranks (``global_sum``, an all-reduce of one integer; required on
    more than one rank). The alternative, every rank masking every row of the global step to count them without
    communicating, costs each rank the masking CPU (and the reads) of the whole global batch: world-size times
    its own share, per step, which whole-word and span masking (a Python loop per row) cannot afford at large
    global batches, while the all-reduce is one small collective at a step boundary the ranks share anyway.
    """

    def __init__(self, data: ShardedInstances, *, micro_batch: int, accumulation: int, world_size: int,
                 rank: int, seed: int, window_batches: int = 64, masking: DynamicMasking | None = None,
                 global_sum: Callable[[int], int] | None = None, document_attention: bool = False,
                 pad_multiple: int = PAD_MULTIPLE, padding_free: bool = False):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if document_attention and not data.packed:
            raise ValueError(f"document attention needs packed rows (doc_starts), but {data.manifest.path} says its "
                             f"rows are {data.manifest.objective.kind}")
        if masking is not None and world_size > 1 and global_sum is None:
            raise ValueError("dynamic masking on more than one rank needs global_sum (the all-reduce of the masked "
                             "count)")
        self.global_batch = micro_batch * accumulation * world_size
        if len(data) < self.global_batch:
            raise DatasetFormatError(f"the dataset has {len(data)} rows, fewer than one global batch "
                                     f"({micro_batch} x {accumulation} accumulation x {world_size} ranks)")
        self.data, self.seed, self.window_batches = data, seed, window_batches
        self.micro_batch, self.accumulation, self.world_size, self.rank = micro_batch, accumulation, world_size, rank
        self.masking, self.global_sum, self.document_attention = masking, global_sum, document_attention
        self.pad_multiple, self.width_limit = pad_multiple, data.manifest.max_seq_length
        self.padding_free = padding_free  # send the unpadded layout's sizes (``host_unpadding``) with each micro-batch
        self.epoch, self.batch_index = 0, 0
        self._order: EpochOrder | None = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.data) // self.global_batch

    def state_dict(self) -> dict:
        """The position; valid on any world size with the same global batch size."""
        return {"epoch": self.epoch, "batch_index": self.batch_index, "global_batch": self.global_batch,
                "seed": self.seed, "order_version": ORDER_VERSION}

    def load_state_dict(self, state: dict) -> None:
        version = int(state.get("order_version", 1))
        if version != ORDER_VERSION:
            raise ValueError(f"the checkpoint's data position is in sample order version {version}, but this code "
                             f"visits rows in order version {ORDER_VERSION}, where that position names other "
                             "samples; finish that run with the release that started it, or start a new run from "
                             "its weights (model.init_from)")
        if int(state.get("global_batch", self.global_batch)) != self.global_batch:
            raise ValueError(f"the checkpoint's global batch is {state['global_batch']} rows but this run's is "
                             f"{self.global_batch}; keep train.global_batch_size to resume at the same sample")
        self.epoch, self.batch_index, self._order = int(state["epoch"]), int(state["batch_index"]), None

    def next_step(self) -> list[dict[str, np.ndarray]]:
        """The ``accumulation`` micro-batches of this rank for the next optimizer step."""
        if self._order is None:
            self._order = EpochOrder(len(self.data), epoch=self.epoch, seed=self.seed, global_batch=self.global_batch,
                                     window_batches=self.window_batches, lengths_of=self.data.lengths_of)
        if self.batch_index >= len(self._order):
            self.epoch, self.batch_index, self._order = self.epoch + 1, 0, None
            return self.next_step()
        rows = self._order.batch(self.batch_index)
        self.batch_index += 1
        parts = split_global_batch(rows, accumulation=self.accumulation, world_size=self.world_size,
                                   micro_batch=self.micro_batch)
        mine = parts[:, self.rank].reshape(-1)
        block = read_rows(self.data, mine)  # this rank's rows of the step, in one pass
        if self.masking is None:
            masked_total = int(self.data.list_lengths("masked_positions", rows).sum())
        else:
            block = mask_dynamically(self.data, block, mine, self.epoch, self.masking)
            masked_total = int(block.counts.sum())
            if self.world_size > 1:
                masked_total = int(self.global_sum(masked_total))
        shares = self.accumulation * self.world_size
        scale = shares / max(1, masked_total)
        token_scale = shares / max(1, int(self.data.lengths_of(rows).sum()))
        micro = self.micro_batch
        return [{**pad(block, self.data.pad_id, a * micro, (a + 1) * micro, documents=self.document_attention,
                       multiple=self.pad_multiple, limit=self.width_limit, padding_free=self.padding_free),
                 "mlm_loss_scale": np.float32(scale), "token_loss_scale": np.float32(token_scale)}
                for a in range(self.accumulation)]


__all__ = ["PretrainingLoader", "RowBlock", "ShardedInstances", "collate", "epoch_batches",
           "host_unpadding", "mask_dynamically", "pad", "padded_width", "read_rows", "split_global_batch"]
