"""The epoch order: a keyed permutation evaluated on the fly, length-grouped windows, no per-row arrays."""
import tracemalloc

import numpy as np
import pytest

from pretrain.sampling import BLOCK_ROWS, EpochOrder, Permutation, epoch_batches


@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 17, 64, 1000, 4097, 250_001])
def test_the_permutation_is_a_bijection_of_its_range(size):
    rows = Permutation(size, seed=7)(np.arange(size))
    assert rows.dtype == np.int64 and len(rows) == size
    assert (np.sort(rows) == np.arange(size)).all()


def test_the_permutation_depends_only_on_its_seed():
    positions = np.arange(10_000)
    a, b = Permutation(10_000, seed=1), Permutation(10_000, seed=2)
    assert (a(positions) == Permutation(10_000, seed=1)(positions)).all()
    assert (a(positions) != b(positions)).mean() > 0.99
    # Any slice of positions maps to the same rows as the whole range does.
    assert (a(positions[1234:5678]) == a(positions)[1234:5678]).all()
    # Not close to the identity: the mean displacement is that of a random permutation (n/3).
    assert abs(np.abs(a(positions) - positions).mean() / 10_000 - 1 / 3) < 0.02
    with pytest.raises(IndexError):
        a(np.asarray([10_000]))


def test_batches_are_disjoint_sorted_by_length_and_shuffled_within_windows():
    lengths = np.random.default_rng(0).integers(10, 129, size=50_000)
    order = EpochOrder(len(lengths), epoch=3, seed=9, global_batch=64, window_batches=16,
                       lengths_of=lambda rows: lengths[rows])
    batches = np.stack([order.batch(b) for b in range(len(order))])
    assert batches.shape == (50_000 // 64, 64)
    assert len(np.unique(batches)) == batches.size
    assert (np.diff(lengths[batches], axis=1) >= 0).all()
    # A window's batches are visited in random order, not from shortest to longest.
    first_window = lengths[batches[:16]].mean(axis=1)
    assert not (np.diff(first_window) >= 0).all()
    # Window w holds positions [w * 16 * 64, (w + 1) * 16 * 64) of the epoch's row sequence.
    for window in (0, 1, 48):
        positions = (window * 1024, min((window + 1) * 1024, len(batches) * 64))
        assert (np.sort(batches[window * 16:(window + 1) * 16].ravel()) == np.sort(order.rows(*positions))).all()
    assert (epoch_batches(lengths, epoch=3, seed=9, global_batch=64, window_batches=16) == batches).all()


@pytest.mark.parametrize("rows", [100, BLOCK_ROWS * 7, BLOCK_ROWS * 7 + 5, 50_000])
def test_an_epoch_visits_every_row_once_in_permuted_blocks(rows):
    order = EpochOrder(rows, epoch=1, seed=2, global_batch=8, window_batches=4, lengths_of=lambda ids: ids % 7)
    sequence = order.rows(0, rows)
    assert (np.sort(sequence) == np.arange(rows)).all()
    tail = rows % BLOCK_ROWS
    assert (sequence[:tail] == np.arange(rows - tail, rows)).all()  # the partial block opens the epoch
    blocks = sequence[tail:].reshape(-1, BLOCK_ROWS)
    assert (np.diff(blocks, axis=1) == 1).all() and (blocks[:, 0] % BLOCK_ROWS == 0).all()
    if len(blocks) > 3:
        assert not (np.diff(blocks[:, 0]) > 0).all()  # the blocks are permuted
        other = EpochOrder(rows, epoch=2, seed=2, global_batch=8, window_batches=4, lengths_of=lambda ids: ids % 7)
        assert (other.rows(0, rows) != sequence).any()
    assert (order.rows(37, min(rows, 1000)) == sequence[37:1000]).all()


def test_the_first_batch_of_a_100m_row_epoch_costs_no_per_row_memory():
    rows = 100_000_000
    tracemalloc.start()
    try:
        order = EpochOrder(rows, epoch=0, seed=1, global_batch=256, window_batches=64,
                           lengths_of=lambda ids: ids % 120 + 8)
        batch = order.batch(len(order) - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(order) == rows // 256 and len(np.unique(batch)) == 256 and batch.max() < rows
    assert peak < 16 * 256 * 64 * 8  # a few arrays of one window (16,384 rows), nothing of 100M rows
