"""Checkpoint bookkeeping (``pretrain.checkpoints``): only marked checkpoints count, old ones are pruned."""
from pretrain import checkpoints


def test_only_marked_checkpoints_count_and_old_ones_are_pruned(tmp_path):
    for step in (10, 20, 30, 40):
        (tmp_path / checkpoints.tag_for(step)).mkdir()
        if step != 40:  # step 40's save never finished
            checkpoints.publish(tmp_path, checkpoints.tag_for(step), {"step": step, "world_size": 2})
    assert checkpoints.newest(tmp_path).step == 30
    (tmp_path / checkpoints.tag_for(5)).mkdir()  # an unfinished one from long ago
    removed = checkpoints.prune(tmp_path, keep_last=2)
    assert sorted(removed) == ["step_00000005", "step_00000010"]
    assert [c.step for c in checkpoints.complete(tmp_path)] == [20, 30]
    assert (tmp_path / "step_00000040").is_dir()  # newer than the newest complete: may still be in progress
