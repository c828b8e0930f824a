"""The suite's sharing of the machine between xdist workers (tests/workers.py): an exclusive test runs alone and is
not starved, and files stay whole."""
import pathlib
import threading
import time

import pytest

from tests import workers


class FakeItem:
    def __init__(self, path="tests/x/test_a.py", marks=()):
        self.path = pathlib.Path(workers.__file__).parents[1] / path
        self.marks = {mark.name: mark for mark in marks}

    def get_closest_marker(self, name):
        return self.marks.get(name)

    def add_marker(self, mark):
        self.marks[mark.name] = mark


def test_an_exclusive_test_waits_for_the_running_one_and_keeps_later_ones_out(tmp_path, monkeypatch):
    monkeypatch.setenv(workers.LOCKS, str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    events, lock = [], threading.Lock()
    first_in, exclusive_waiting = threading.Event(), threading.Event()

    def test(name, item, before=None, hold=0.0):
        if before:
            before.wait()
        with workers.machine_share(item):
            with lock:
                events.append(f"{name} in")
            if name == "first":
                first_in.set()
                exclusive_waiting.wait()
                time.sleep(hold)  # the later shared test arrives while this one still runs
            time.sleep(0.05)
            with lock:
                events.append(f"{name} out")

    first = threading.Thread(target=test, args=("first", FakeItem()), kwargs={"hold": 0.5})
    alone = threading.Thread(target=test, args=("alone", FakeItem(marks=[pytest.mark.exclusive.mark]), first_in))
    later = threading.Thread(target=test, args=("later", FakeItem(), exclusive_waiting))
    first.start()
    first_in.wait()
    alone.start()
    time.sleep(0.2)  # the exclusive one is queued at the turnstile by now
    exclusive_waiting.set()
    later.start()
    for thread in (first, alone, later):
        thread.join(timeout=30)
    assert events == ["first in", "first out", "alone in", "alone out", "later in", "later out"]


def test_shared_tests_run_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setenv(workers.LOCKS, str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    entered = threading.Event()

    def second():
        with workers.machine_share(FakeItem()):
            entered.set()

    with workers.machine_share(FakeItem()):
        other = threading.Thread(target=second)
        other.start()
        assert entered.wait(timeout=10), "a second shared test waited for the first"
    other.join(timeout=10)


def test_outside_a_worker_nothing_is_locked(tmp_path, monkeypatch):
    monkeypatch.delenv(workers.LOCKS, raising=False)
    with workers.machine_share(FakeItem(marks=[pytest.mark.exclusive.mark])):
        pass
    assert not list(tmp_path.iterdir())


class FixtureDef:
    def __init__(self, scope):
        self.scope = scope


def test_tests_sharing_a_module_fixture_join_their_files_group_and_the_others_stay_free():
    root = pathlib.Path(workers.__file__).parents[1]
    shared, free, live, chosen = (FakeItem("tests/pretrain/test_a.py"), FakeItem("tests/pretrain/test_a.py"),
                                  FakeItem("tests/cluster/test_slurm_live.py"),
                                  FakeItem("tests/x/test_b.py", marks=[pytest.mark.xdist_group("mine").mark]))
    shared._fixtureinfo = type("Info", (), {"name2fixturedefs": {"setup": [FixtureDef("module")]}})()
    free._fixtureinfo = type("Info", (), {"name2fixturedefs": {"tmp_path": [FixtureDef("function")],
                                                                "data": [FixtureDef("session")]}})()
    workers.group_by_file([shared, free, live, chosen], root)
    assert [item.marks.get("xdist_group") and item.marks["xdist_group"].args[0]
            for item in (shared, free, live, chosen)] == ["tests/pretrain/test_a.py", None, "live-cluster", "mine"]


def test_each_worker_gets_its_share_of_the_cores():
    assert [workers.threads_per_worker(cpus, 2) for cpus in (1, 2, 3, 16)] == [1, 1, 1, 8]
    assert workers.threads_per_worker(2, 0) == 2


def test_the_long_waits_on_installs_go_first_and_the_rest_keeps_its_order():
    root = pathlib.Path(workers.__file__).parents[1]
    items = [FakeItem(p) for p in ("tests/a/test_x.py", "tests/test_extras.py", "tests/b/test_y.py",
                                   "tests/test_demo.py", "tests/a/test_z.py")]
    workers.front_load(items, root)
    assert [i.path.relative_to(root).as_posix() for i in items] == [
        "tests/test_demo.py", "tests/test_extras.py", "tests/a/test_x.py", "tests/b/test_y.py", "tests/a/test_z.py"]
