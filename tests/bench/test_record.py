"""bench.record: what every results file records (versions, the command that made it) and how it is written."""
import importlib.metadata
import json
import re
import sys
import types

from bench import record
from common import processes


def test_versions_name_each_distribution_and_the_commit():
    found = record.versions(("numpy", "no-such-distribution"), ("bench",))
    assert found["numpy"] == importlib.metadata.version("numpy")
    assert found["no-such-distribution"] is None
    assert found["python"] and found["implementation"]
    assert re.fullmatch(r"[0-9a-f]{40}", found["repo_commit"])
    assert isinstance(found["repo_dirty"], list)


def test_dirty_paths_are_limited_to_the_measured_code(tmp_path, monkeypatch):
    (tmp_path / "measured").mkdir()
    (tmp_path / "elsewhere").mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        processes.run(["git", *args], cwd=tmp_path, check=True, timeout=120)
    (tmp_path / "measured" / "a.py").write_text("1\n")
    (tmp_path / "elsewhere" / "b.py").write_text("1\n")
    processes.run(["git", "add", "."], cwd=tmp_path, check=True, timeout=120)
    processes.run(["git", "commit", "-qm", "x"], cwd=tmp_path, check=True, timeout=120)
    (tmp_path / "measured" / "a.py").write_text("2\n")
    (tmp_path / "elsewhere" / "b.py").write_text("2\n")
    monkeypatch.setattr(record, "REPO", tmp_path)
    assert record.git_state(("measured",))["repo_dirty"] == ["measured/a.py"]


def test_git_state_without_a_repository_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "REPO", tmp_path)
    monkeypatch.delenv("BENCH_REPO_COMMIT", raising=False)
    assert record.git_state(("bench",)) == {"repo_commit": None, "repo_dirty": None}


def test_git_state_without_a_repository_takes_the_commit_it_is_told(tmp_path, monkeypatch):
    """A tree copied without .git (to a GPU machine) names the commit it was copied from; dirty is unknown."""
    monkeypatch.setattr(record, "REPO", tmp_path)
    monkeypatch.setenv("BENCH_REPO_COMMIT", "a" * 40)
    assert record.git_state(("bench",)) == {"repo_commit": "a" * 40, "repo_dirty": None}


def test_command_line_is_the_module_form(monkeypatch):
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="bench.pretrain.steps")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["/anywhere/bench/pretrain/steps.py", "--quick"])
    assert record.command_line() == "python -m bench.pretrain.steps --quick"


def test_results_are_written_whole_with_paths_as_text(tmp_path):
    target = tmp_path / "results" / record.results_file(tmp_path, "loader", {"slug": "cpu2-x86_64"}, "-quick").name
    record.write_json(target, {"path": tmp_path, "n": 1})
    assert target.name == "loader-cpu2-x86_64-quick.json"
    assert json.loads(target.read_text()) == {"path": str(tmp_path), "n": 1}
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_the_package_imports_nothing():
    """``bench.stage_imports``, ``bench.preprocess.irreducible`` and ``bench.preprocess.floor`` are measured as whole processes
    (``python -m``): ``import bench`` must add nothing to them."""
    code = "import sys; before = set(sys.modules); import bench; print(sorted(set(sys.modules) - before))"
    out = processes.run([sys.executable, "-c", code], cwd=record.REPO, capture_output=True, text=True,
                        check=True, timeout=120).stdout
    assert out.strip() == "['bench']"


def test_the_source_digest_follows_the_measured_files_only(tmp_path, monkeypatch):
    (tmp_path / "code" / "deep").mkdir(parents=True)
    (tmp_path / "code" / "deep" / "a.py").write_text("1\n")
    (tmp_path / "notes.txt").write_text("1\n")
    monkeypatch.setattr(record, "REPO", tmp_path)
    patterns = ("code/**/*.py",)
    first = record.source_digest(patterns)
    (tmp_path / "notes.txt").write_text("2\n")
    assert record.source_digest(patterns) == first
    (tmp_path / "code" / "deep" / "a.py").write_text("2\n")
    changed = record.source_digest(patterns)
    assert changed != first
    (tmp_path / "code" / "deep" / "a.py").rename(tmp_path / "code" / "deep" / "b.py")  # same bytes, another file
    assert record.source_digest(patterns) not in (first, changed)
    # A file two patterns match counts once.
    assert record.source_digest((*patterns, "code/deep/*.py")) == record.source_digest(patterns)


def test_a_comparison_is_added_to_the_results_file_keeping_the_rest(tmp_path):
    path = record.add_comparison(tmp_path, "demo", "first", {"cpu_s_change": -0.1})
    record.write_json(path, {**json.loads(path.read_text()), "end_to_end": {"cpu_s": 3}})
    assert record.add_comparison(tmp_path, "demo", "second", {"cpu_s_change": 0.2}) == path
    assert json.loads(path.read_text()) == {"comparisons": {"first": {"cpu_s_change": -0.1},
                                                            "second": {"cpu_s_change": 0.2}},
                                            "end_to_end": {"cpu_s": 3}}
    assert path.name == f"demo-{record.machine_info()['slug']}.json"
