"""A small real dataset from the preprocessing stage (bundled samples, bert-base-uncased vocabulary)."""
import pathlib

import pytest


SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples"


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory, bert_vocab) -> pathlib.Path:
    from preprocess import config, pipeline

    out = tmp_path_factory.mktemp("pretrain-data") / "dataset"
    cfg = config.load("configs/preprocess/tiny.yaml", ["output.num_shards=3", "instances.dupe_factor=3"])
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    return out
