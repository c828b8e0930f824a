"""The same job on a real distributed engine: Beam's DaskRunner against a Dask scheduler and two workers."""
from __future__ import annotations

import pytest

from common import preprocess_config as config
from preprocess.executors import pipeline
from tests.preprocess.conftest import REPO_ROOT, SAMPLES, read_manifest, run_cli, shard_hashes
from tests.preprocess.servers import dask_cluster, env_with_repo

CONFIG = "configs/preprocess/tiny.yaml"
DASK = ["--runner", "apache_beam.runners.dask.dask_runner.DaskRunner"]


@pytest.fixture(scope="module")
def dask_address():
    """A scheduler and two workers, shared by this module's runs (starting them costs more than a small run)."""
    with dask_cluster(2, str(REPO_ROOT), env_with_repo(str(REPO_ROOT))) as address:
        yield address


def test_dask_runner_output_is_byte_identical_to_direct_runner(tmp_path, real_wiki, real_books, bert_vocab,
                                                               dask_address):
    books = tmp_path / "books"
    books.mkdir()
    for name in ("austen-persuasion.txt", "chesterton-brown.txt", "shakespeare-macbeth.txt"):
        (books / name).write_bytes((real_books / name).read_bytes())
    common = ["run", "--config", CONFIG, "--wikipedia", real_wiki, "--books", books, "--tokenizer", bert_vocab]
    direct = tmp_path / "direct"
    run_cli(*common, "--output", direct)
    on_dask = tmp_path / "dask"
    run_cli(*common, "--output", on_dask, *DASK, "--dask_client_address", dask_address)
    assert shard_hashes(on_dask) == shard_hashes(direct)


def test_dask_runner_holds_out_the_same_documents(tmp_path, bert_vocab, dask_address):
    """A held-out split (a count and a share) on Dask: the same training and evaluation shards as in memory."""
    split = ["heldout.books.documents=3", "heldout.wikipedia.share=0.25"]
    pipeline.run(config.load(CONFIG, split), wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(tmp_path / "direct"), progress=False)
    run_cli("run", "--config", CONFIG, "--wikipedia", SAMPLES / "wikipedia", "--books", SAMPLES / "books",
            "--tokenizer", bert_vocab, *[a for o in split for a in ("--set", o)], "--output", tmp_path / "dask",
            *DASK, "--dask_client_address", dask_address)
    direct, on_dask = read_manifest(tmp_path / "direct"), read_manifest(tmp_path / "dask")
    assert shard_hashes(tmp_path / "dask") == shard_hashes(tmp_path / "direct")
    assert [e["sha256"] for e in on_dask["evaluation"]["shards"]] == \
        [e["sha256"] for e in direct["evaluation"]["shards"]] and direct["evaluation"]["rows"] > 0
