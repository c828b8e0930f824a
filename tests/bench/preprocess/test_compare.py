"""bench.preprocess.compare: the reference tree a comparison runs (a directory as given, or a commit exported)."""
import re
import sys

from bench import processes, record
from bench.preprocess import compare as preprocess_compare
from common import processes as sessions


def test_a_commit_is_exported_with_the_pipeline_its_contracts_and_its_configs(tmp_path):
    tree, commit = preprocess_compare.reference_tree("HEAD", tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and tree == tmp_path / "trees" / commit[:12]
    assert (tree / "preprocess" / "cli.py").is_file() and (tree / "configs" / "preprocess").is_dir()
    assert sorted(p.name for p in tree.iterdir()) == ["common", "configs", "preprocess"]
    # The pipeline of the exported tree runs on its own modules, not this checkout's.
    code = "import common.preprocess_config as c, preprocess.cli as p; print(c.__file__, p.__file__)"
    where = sessions.run([sys.executable, "-c", code], cwd=tree, env=processes.child_env(tree), capture_output=True,
                         text=True, check=True, timeout=120).stdout
    assert where.split() == [str(tree / "common" / "preprocess_config.py"), str(tree / "preprocess" / "cli.py")]


def test_a_commit_before_common_existed_is_exported_without_it(tmp_path):
    added = sessions.run(["git", "log", "--format=%H", "--diff-filter=A", "--", "common/"], cwd=record.REPO,
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    before = f"{added[-1]}~1"   # the commit before the first that added files under common/
    tree, _ = preprocess_compare.reference_tree(before, tmp_path)
    assert sorted(p.name for p in tree.iterdir()) == ["configs", "preprocess"]


def test_a_directory_is_used_as_it_is(tmp_path):
    (tmp_path / "other").mkdir()
    assert preprocess_compare.reference_tree(str(tmp_path / "other"), tmp_path / "work") == (
        tmp_path / "other", str(tmp_path / "other"))


def test_pairs_alternate_which_tree_runs_first(tmp_path):
    orders = [[name for name, _ in preprocess_compare.pair_order(i, tmp_path)] for i in range(4)]
    assert orders == [["reference", "this_tree"], ["this_tree", "reference"]] * 2
    assert dict(preprocess_compare.pair_order(1, tmp_path)) == {"reference": tmp_path, "this_tree": record.REPO}
