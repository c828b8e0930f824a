"""bench.pretrain.domain: the held-out files are chosen by their paths alone, and the preprocessing config holds them
out as a source of their own."""
from common import preprocess_config

from bench.pretrain import domain


def test_the_split_depends_on_the_paths_alone_and_loses_no_file(tmp_path):
    docs = tmp_path / "docs"
    for i in range(200):
        (docs / f"part{i % 3}").mkdir(parents=True, exist_ok=True)
        (docs / f"part{i % 3}" / f"page{i}.rst.txt").write_text(f"Page {i}. " * 50)
    train, held, count = domain.split_files(docs, tmp_path / "a")
    again = domain.split_files(docs, tmp_path / "b")
    assert sorted(p.name for p in held.iterdir()) == sorted(p.name for p in again[1].iterdir())
    assert len(list(train.iterdir())) + count == 200 and 3 <= count <= 25  # about 6 %
    cfg = preprocess_config.load(domain.preprocess_config(tmp_path, train, held, count))
    assert [spec.name for spec in cfg.inputs] == ["pydocs", "pydocs_heldout"]
    assert cfg.heldout.inputs["pydocs_heldout"].documents == count - 1
