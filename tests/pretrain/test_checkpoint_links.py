"""A checkpoint marked COMPLETE holds its own files: a symbolic link anywhere in it (a file, a subdirectory, the
marker, or the checkpoint directory itself) is refused naming the link, and resume falls back past it."""
import os

import pytest

from pretrain import checkpoints


def _checkpoint(directory, step, content: bytes):
    path = directory / checkpoints.tag_for(step)
    (path / "zero").mkdir(parents=True)
    (path / "model.pt").write_bytes(content)
    (path / "zero" / "optim.pt").write_bytes(content * 2)
    checkpoints.publish(directory, path.name, {"step": step, "world_size": 1, "zero_stage": 0})
    return path


def _link_file(path, outside):
    (path / "model.pt").unlink()
    (path / "model.pt").symlink_to(outside)  # the same bytes: size and sha256 still match the marker
    return path / "model.pt"


def _link_directory(path, outside):
    os.rename(path / "zero", outside.parent / "zero-elsewhere")
    (path / "zero").symlink_to(outside.parent / "zero-elsewhere")
    return path / "zero"


def _link_marker(path, outside):
    marker = path / checkpoints.MARKER
    moved = outside.parent / "COMPLETE-elsewhere"
    os.rename(marker, moved)
    marker.symlink_to(moved)
    return marker


@pytest.mark.parametrize("plant", [_link_file, _link_directory, _link_marker])
def test_a_link_inside_a_complete_checkpoint_is_refused_naming_it_and_resume_falls_back(tmp_path, plant):
    runs, elsewhere = tmp_path / "checkpoints", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _checkpoint(runs, 2, b"old")
    newest = _checkpoint(runs, 4, b"new")
    outside = elsewhere / "model.pt"
    outside.write_bytes(b"new")
    link = plant(newest, outside)
    found = next(c for c in checkpoints.complete(runs) if c.step == 4)
    with pytest.raises(checkpoints.CorruptCheckpoint) as refused:
        checkpoints.verify(found)
    message = str(refused.value)
    assert message.startswith(f"{link}: a symbolic link (to ") and "marked COMPLETE" in message
    assert "cp -L" in message and "\n" not in message
    warnings = []
    assert checkpoints.newest_intact(runs, "fallback", warn=warnings.append).step == 2
    assert len(warnings) == 1 and warnings[0].endswith("falling back to step_00000002")


def test_a_checkpoint_directory_that_is_itself_a_link_is_refused(tmp_path):
    runs, elsewhere = tmp_path / "checkpoints", tmp_path / "elsewhere"
    real = _checkpoint(elsewhere, 6, b"x")
    runs.mkdir()
    (runs / real.name).symlink_to(real)
    found = checkpoints.complete(runs)
    assert [c.step for c in found] == [6] and found[0].info == {}  # its marker was not even read
    with pytest.raises(checkpoints.CorruptCheckpoint, match=f"^{runs / real.name}: a symbolic link"):
        checkpoints.newest_intact(runs, "fallback")  # nothing older to fall back to: refused, not started over
