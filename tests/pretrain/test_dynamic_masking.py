"""Dynamic masking in the loader: new masks every epoch, the same masks for any world size or accumulation split
and after a resume, the recipe's rate, units (tokens, spans, ALBERT's n-grams) and 80/10/10 split, and the global
masked count behind the loss scale."""
import json
import threading

import numpy as np
import pytest

from common.errors import DatasetFormatError
from common.masking import MaskingRecipe
from pretrain.data import PretrainingLoader, ShardedInstances, read_rows
from pretrain.dynamic_masking import DynamicMasking

SEED = 11


def _masking(data, mode="token", rate=0.15, max_predictions=20):
    return DynamicMasking.for_dataset(MaskingRecipe(mode=mode, rate=rate, max_predictions=max_predictions),
                                      data.tokenizer_dir, SEED)


def _per_row(micro_batches) -> list[tuple]:
    """Each row of the micro-batches as (its tokens, its masked positions, their labels), whatever its padding."""
    out = []
    for m in micro_batches:
        width = m["input_ids"].shape[1]
        row_of = m["masked_positions"] // width
        for b in range(len(m["input_ids"])):
            n = int(m["attention_mask"][b].sum())
            mine = row_of == b
            out.append((tuple(m["input_ids"][b, :n]), tuple(m["masked_positions"][mine] % width),
                        tuple(m["masked_labels"][mine])))
    return out


class ThreadSum:
    """``global_sum`` for ranks that are threads of this process: every rank gets the sum of all ranks' counts."""

    def __init__(self, ranks: int):
        self.barrier, self.values, self.lock = threading.Barrier(ranks), [], threading.Lock()

    def __call__(self, value: int) -> int:
        with self.lock:
            self.values.append(value)
        self.barrier.wait()
        total = sum(self.values)
        if self.barrier.wait() == 0:
            self.values.clear()
        self.barrier.wait()
        return total


def _ranks_step(loaders, steps: int) -> list[list]:
    """``steps`` steps of every loader, each in its own thread (as ranks in lock-step)."""
    results = [[] for _ in loaders]

    def run(index):
        for _ in range(steps):
            results[index].append(loaders[index].next_step())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(loaders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.fixture(scope="module")
def dynamic(synthetic_dataset):
    return ShardedInstances(synthetic_dataset(1_024, masking="dynamic", kind="full_sentences", max_seq_length=128,
                                              document_tokens=60))


def test_each_epoch_shows_every_row_new_masks_over_its_stored_tokens(dynamic):
    loader = PretrainingLoader(dynamic, micro_batch=16, accumulation=2, world_size=1, rank=0, seed=SEED,
                               masking=_masking(dynamic))
    per_epoch = loader.batches_per_epoch
    seen = [{}, {}]
    for epoch in range(2):
        for _ in range(per_epoch):
            step = loader.next_step()
            rows = loader._order.batch(loader.batch_index - 1)  # the global batch just read
            for row, got in zip(rows, _per_row(step)):
                seen[epoch][int(row)] = got
    assert len(seen[0]) == len(seen[1]) == per_epoch * 32
    stored = read_rows(dynamic, np.arange(len(dynamic)))
    ends = np.cumsum(stored.lengths)
    differ = 0
    for row, (ids, positions, labels) in seen[0].items():
        original = stored.tokens[ends[row] - stored.lengths[row]:ends[row]]
        restored = np.asarray(ids)
        restored[list(positions)] = labels
        assert (restored == original).all()  # masking changes the shown tokens only at its positions
        differ += seen[1][row][1] != positions
    assert differ > 0.95 * len(seen[0])


def test_the_masks_do_not_depend_on_the_world_size_or_the_accumulation_split(dynamic):
    masking = _masking(dynamic, mode="span", rate=0.3, max_predictions=40)
    one = PretrainingLoader(dynamic, micro_batch=8, accumulation=4, world_size=1, rank=0, seed=3, masking=masking)
    wide = PretrainingLoader(dynamic, micro_batch=32, accumulation=1, world_size=1, rank=0, seed=3, masking=masking)
    total = ThreadSum(2)
    ranks = [PretrainingLoader(dynamic, micro_batch=8, accumulation=2, world_size=2, rank=r, seed=3, masking=masking,
                               global_sum=total) for r in (0, 1)]
    two = _ranks_step(ranks, 3)
    for step in range(3):
        single, whole = one.next_step(), wide.next_step()
        assert _per_row(single) == _per_row(whole)
        # Rank r's micro-step a holds the rows of the single process's micro-batch 2a + r (split_global_batch).
        assert _per_row(single) == _per_row([two[r][step][a] for a in range(2) for r in range(2)])
        scales = {float(m["mlm_loss_scale"]) for m in (*single, *two[0][step], *two[1][step])}
        assert len(scales) == 1
        assert scales.pop() * sum(len(m["masked_labels"]) for m in single) == pytest.approx(4)
        assert whole[0]["mlm_loss_scale"] * len(whole[0]["masked_labels"]) == pytest.approx(1)
    with pytest.raises(ValueError, match="needs global_sum"):
        PretrainingLoader(dynamic, micro_batch=8, accumulation=2, world_size=2, rank=0, seed=3, masking=masking)


def test_resume_shows_the_same_masks(dynamic):
    masking = _masking(dynamic, mode="whole_word")
    first = PretrainingLoader(dynamic, micro_batch=8, accumulation=2, world_size=1, rank=0, seed=3, masking=masking)
    for _ in range(first.batches_per_epoch - 4):
        first.next_step()
    state = json.loads(json.dumps(first.state_dict()))
    expected = [first.next_step() for _ in range(8)]  # crosses into the next epoch
    assert first.epoch == 1
    resumed = PretrainingLoader(dynamic, micro_batch=8, accumulation=2, world_size=1, rank=0, seed=3,
                                masking=_masking(dynamic, mode="whole_word"))
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_step()
        assert all((g[k] == w[k]).all() for g, w in zip(got, want) for k in w)


@pytest.mark.parametrize("rate, cap", [(0.15, 20), (0.4, 60), (0.4, 30)])
def test_token_masks_follow_the_recipe(dynamic, rate, cap):
    masking = _masking(dynamic, rate=rate, max_predictions=cap)
    rows = np.arange(len(dynamic))
    block = read_rows(dynamic, rows)
    tokens, positions, counts, labels = masking.mask(block.tokens, block.lengths, masking.row_keys(0, rows))
    special = masking.never[block.tokens]
    candidates = np.add.reduceat(~special, np.cumsum(block.lengths) - block.lengths)
    want = np.minimum(np.minimum(cap, np.maximum(1, np.rint(block.lengths * rate))), candidates)
    assert (counts == want).all()
    flat = np.repeat(np.cumsum(block.lengths) - block.lengths, counts) + positions
    assert not special[flat].any() and (labels == block.tokens[flat]).all()
    shown = tokens[flat]
    mask_share = (shown == masking.vocab.mask_id).mean()
    unchanged = (shown == labels).mean()
    assert abs(mask_share - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.02
    untouched = np.ones(len(tokens), bool)
    untouched[flat] = False
    assert (tokens[untouched] == block.tokens[untouched]).all()


def test_span_masks_are_runs_of_whole_words(dynamic):
    masking = _masking(dynamic, mode="span", rate=0.15, max_predictions=20)
    rows = np.arange(len(dynamic))
    block = read_rows(dynamic, rows)
    _, positions, counts, _ = masking.mask(block.tokens, block.lengths, masking.row_keys(4, rows))
    starts = np.cumsum(counts) - counts
    runs = []
    for start, count in zip(starts, counts):
        p = positions[start:start + count].astype(np.int64)
        runs += np.diff(np.flatnonzero(np.diff(p, prepend=-9, append=10**6) != 1)).tolist()
    assert np.mean(runs) > 2  # contiguous spans (SpanBERT's mean is 3.8 words), where token masks give ~1


def test_ngram_masks_are_whole_words_in_runs_longer_than_whole_word_masks(dynamic):
    """ALBERT's n-grams (1 to 3 words, p(n) ~ 1/n: 1.6 words on average) against single whole words."""
    rows = np.arange(len(dynamic))
    block = read_rows(dynamic, rows)
    offsets = np.cumsum(block.lengths) - block.lengths
    words_per_run = {}
    for mode in ("whole_word", "ngram"):
        masking = _masking(dynamic, mode=mode, rate=0.15, max_predictions=20)
        _, positions, counts, labels = masking.mask(block.tokens, block.lengths, masking.row_keys(4, rows))
        continuation = masking.vocab.is_continuation
        runs = []
        for offset, start, count in zip(offsets, np.cumsum(counts) - counts, counts):
            masked = dict(zip(positions[start:start + count].astype(np.int64).tolist(),
                              labels[start:start + count].tolist()))
            run_words = 0
            for pos in sorted(masked):
                joins = continuation[masked[pos]] and not masking.never[block.tokens[offset + pos - 1]]
                assert pos - 1 in masked or not joins, "a word is masked entirely or not at all"
                if pos - 1 not in masked and run_words:
                    runs.append(run_words)
                    run_words = 0
                run_words += not joins
            runs.append(run_words)
        words_per_run[mode] = np.mean(runs)
    assert words_per_run["whole_word"] < 1.3 and words_per_run["ngram"] > words_per_run["whole_word"] + 0.3, \
        words_per_run


def test_stored_masks_in_a_dataset_said_to_be_dynamic_are_refused(synthetic_dataset):
    static = ShardedInstances(synthetic_dataset(2_000))
    loader = PretrainingLoader(static, micro_batch=8, accumulation=1, world_size=1, rank=0, seed=3,
                               masking=_masking(static))
    with pytest.raises(DatasetFormatError, match="masked positions stored in a dataset whose manifest .* says its "
                                                 "masking is dynamic"):
        loader.next_step()
