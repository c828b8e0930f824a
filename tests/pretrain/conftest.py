"""A small real dataset from the preprocessing stage (bundled samples, bert-base-uncased vocabulary)."""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports DeepSpeed
import pathlib

import pytest

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples"


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory, bert_vocab) -> pathlib.Path:
    from common import preprocess_config as config
    from preprocess.executors import pipeline

    out = tmp_path_factory.mktemp("pretrain-data") / "dataset"
    cfg = config.load("configs/preprocess/tiny.yaml", ["output.num_shards=3", "instances.dupe_factor=3"])
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    return out


@pytest.fixture(scope="session")
def split_dataset(tmp_path_factory, bert_vocab) -> pathlib.Path:
    """The sample dataset with a held-out split (one book, eight Wikipedia articles): evaluation's."""
    from common import preprocess_config as config
    from preprocess.executors import pipeline

    out = tmp_path_factory.mktemp("pretrain-split") / "dataset"
    cfg = config.load("configs/preprocess/tiny.yaml", ["output.num_shards=3", "instances.dupe_factor=3",
                                                       "heldout.books.documents=1", "heldout.wikipedia.documents=8"])
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    return out


@pytest.fixture(scope="session")
def real_dataset(tmp_path_factory, shared_data, bert_vocab) -> pathlib.Path:
    """Phase-1 instances (seq 128) from the real Wikipedia dump slice, with bert-base-uncased's vocabulary."""
    from common import preprocess_config as config
    from preprocess.executors import pipeline
    from tests.conftest import require

    dump = require(shared_data / "wikipedia" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
                   "the Wikipedia dump slice")
    out = tmp_path_factory.mktemp("pretrain-real") / "dataset"
    cfg = config.load("configs/preprocess/phase1_seq128.yaml", ["instances.dupe_factor=1", "output.num_shards=2"])
    pipeline.run(cfg, wikipedia=[str(dump)], books=[], tokenizer=str(bert_vocab), output=str(out), progress=False)
    return out


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory, bert_vocab):
    """Make synthetic datasets in the real format: ``synthetic_dataset(rows, **spec)`` (cached per arguments)."""
    from preprocess.synthetic import SyntheticSpec, write_synthetic

    made = {}

    def make(rows: int, **spec) -> pathlib.Path:
        key = (rows, *sorted(spec.items()))
        if key not in made:
            out = tmp_path_factory.mktemp("synthetic") / "dataset"
            write_synthetic(SyntheticSpec(rows=rows, **spec), str(bert_vocab), out)
            made[key] = out
        return made[key]

    return make


@pytest.fixture(scope="session")
def one_rank():
    """This process as a world of one rank (gloo), for running the training loop in-process."""
    import torch.distributed as dist

    from pretrain import engine
    from pretrain.launch import Rendezvous
    from tests.pretrain.launching import free_port

    if not dist.is_initialized():
        os.environ["DS_ACCELERATOR"] = "cpu"
        engine.init_distributed(Rendezvous(0, 1, 0, "127.0.0.1", free_port(), "single"), timeout_minutes=5)
    return Rendezvous(0, 1, 0, "127.0.0.1", 0, "single")
