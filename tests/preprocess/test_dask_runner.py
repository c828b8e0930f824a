"""The same job on a real distributed engine: Beam's DaskRunner against a Dask scheduler and two workers."""
from __future__ import annotations

from tests.preprocess.conftest import REPO_ROOT, run_cli, shard_hashes
from tests.preprocess.servers import dask_cluster, env_with_repo

CONFIG = "configs/preprocess/tiny.yaml"


def test_dask_runner_output_is_byte_identical_to_direct_runner(tmp_path, real_wiki, real_books, bert_vocab):
    books = tmp_path / "books"
    books.mkdir()
    for name in ("austen-persuasion.txt", "chesterton-brown.txt", "shakespeare-macbeth.txt"):
        (books / name).write_bytes((real_books / name).read_bytes())
    common = ["run", "--config", CONFIG, "--wikipedia", real_wiki, "--books", books, "--tokenizer", bert_vocab]
    direct = tmp_path / "direct"
    run_cli(*common, "--output", direct)
    with dask_cluster(2, str(REPO_ROOT), env_with_repo(str(REPO_ROOT))) as address:
        on_dask = tmp_path / "dask"
        run_cli(*common, "--output", on_dask, "--runner", "apache_beam.runners.dask.dask_runner.DaskRunner",
                "--dask_client_address", address)
    assert shard_hashes(on_dask) == shard_hashes(direct)
