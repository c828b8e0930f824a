"""bench.preprocess.docstore_load: a synthetic store in the real format, loaded by this tree and by a reference commit."""
import json

from bench import record
from bench.preprocess import docstore_load
from bench.preprocess.compare import reference_tree
from preprocess import docstore


def test_the_synthetic_store_loads_every_document_once_whatever_the_parts(tmp_path):
    counts = {}
    for parts in (1, 3):
        work = str(tmp_path / f"store{parts}")
        written = docstore_load.write_store(work, buckets=8, parts=parts)
        loaded = [docstore.load_bucket(work, b) for b in range(8)]
        counts[parts] = sorted(doc_id for bucket in loaded for doc_id in bucket.doc_ids)
        assert len(counts[parts]) == written == 96
    assert counts[1] == counts[3]


def test_a_comparison_against_a_commit_is_recorded(tmp_path, capsys):
    assert docstore_load.main(["--against", "HEAD", "--buckets", "4", "--parts", "2", "--rounds", "1",
                               "--results", str(tmp_path)]) == 0
    results = json.loads(record.results_file(tmp_path, "preprocess", record.machine_info()).read_text())
    entry = results["comparisons"]["docstore_load"]
    assert entry["reference"] == "HEAD" and entry["parts_2"]["documents"] == 48
    assert entry["parts_2"]["reference"]["cpu_s"] > 0 and entry["parts_2"]["this_tree"]["cpu_s"] > 0
    assert "2 part(s), 48 documents in 4 buckets" in capsys.readouterr().out


def test_a_pass_runs_on_the_docstore_of_its_own_tree(tmp_path):
    work = str(tmp_path / "store")
    docstore_load.write_store(work, buckets=4, parts=1)
    tree, _ = reference_tree("HEAD", tmp_path)
    assert docstore_load.pass_in(tree, work, 4)["module"] == str(tree / "preprocess" / "docstore.py")
    assert docstore_load.pass_in(record.REPO, work, 4)["module"] == str(record.REPO / "preprocess" / "docstore.py")
