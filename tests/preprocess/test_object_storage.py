"""Inputs read from and shards written to s3:// through smart_open, against a local moto server."""
from __future__ import annotations

import os

import boto3
import pytest

from tests.preprocess.conftest import read_manifest, run_cli, shard_hashes
from tests.preprocess.servers import moto_s3_server

CONFIG = "configs/preprocess/tiny.yaml"
BOOKS = ("austen-persuasion.txt", "shakespeare-caesar.txt", "chesterton-brown.txt")


@pytest.fixture(scope="module")
def s3_env():
    with moto_s3_server() as env:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield env
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def test_s3_inputs_and_outputs_match_the_local_run(s3_env, tmp_path, real_wiki, real_books, bert_vocab):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="corpus")
    s3.create_bucket(Bucket="datasets")
    s3.upload_file(str(real_wiki), "corpus", f"wiki/{real_wiki.name}")
    for name in BOOKS:
        s3.upload_file(str(real_books / name), "corpus", f"books/{name}")
    local_books = tmp_path / "books"
    local_books.mkdir()
    for name in BOOKS:
        (local_books / name).write_bytes((real_books / name).read_bytes())

    local = tmp_path / "local"
    run_cli("run", "--config", CONFIG, "--wikipedia", real_wiki, "--books", local_books, "--tokenizer", bert_vocab,
            "--output", local, env=s3_env)
    remote = "s3://datasets/run1"
    run_cli("run", "--config", CONFIG, "--wikipedia", f"s3://corpus/wiki/{real_wiki.name}",
            "--books", "s3://corpus/books/", "--tokenizer", bert_vocab, "--output", remote,
            "--direct_num_workers", "2", "--direct_running_mode", "multi_processing", env=s3_env)

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="datasets", Prefix="run1/")["Contents"])
    assert "run1/manifest.json" in keys and not any("/_work/" in k for k in keys)
    manifest = read_manifest(local)
    remote_manifest = __import__("json").loads(s3.get_object(Bucket="datasets", Key="run1/manifest.json")["Body"].read())
    assert [s["sha256"] for s in remote_manifest["shards"]] == shard_hashes(local)
    for shard in manifest["shards"]:
        body = s3.get_object(Bucket="datasets", Key=f"run1/{shard['name']}")["Body"].read()
        assert body == (local / shard["name"]).read_bytes()
    assert remote_manifest["inputs"] == manifest["inputs"]


def test_unreadable_s3_uri_is_named(s3_env, tmp_path, bert_vocab):
    proc = run_cli("run", "--config", CONFIG, "--books", "s3://no-such-bucket/books/a.txt", "--tokenizer", bert_vocab,
                   "--output", tmp_path / "out", env=s3_env, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and "s3://no-such-bucket/books/a.txt" in last
    assert not (tmp_path / "out").exists()
