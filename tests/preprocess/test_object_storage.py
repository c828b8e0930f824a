"""Inputs read from and shards written to s3:// through smart_open, against a local moto server."""
from __future__ import annotations

import json
import math
import os

import boto3
import pytest

from tests.faulty_s3 import FaultyS3, Rule
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
    remote_manifest = json.loads(s3.get_object(Bucket="datasets", Key="run1/manifest.json")["Body"].read())
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


def _books_only_run(s3, bucket: str, real_books) -> None:
    s3.create_bucket(Bucket=bucket)
    for name in BOOKS:
        s3.upload_file(str(real_books / name), bucket, f"books/{name}")


def test_a_run_through_throttling_errors_and_resets_writes_the_same_shards(s3_env, tmp_path, real_books, bert_vocab):
    """Every kind of request meets transient faults (the first few of each): the run retries them and publishes
    the shards a local run writes, byte for byte."""
    s3 = boto3.client("s3")
    _books_only_run(s3, "flaky", real_books)
    local_books = tmp_path / "books"
    local_books.mkdir()
    for name in BOOKS:
        (local_books / name).write_bytes((real_books / name).read_bytes())
    local = tmp_path / "local"
    run_cli("run", "--config", CONFIG, "--books", local_books, "--tokenizer", bert_vocab, "--output", local)
    rules = [Rule("GET", r"^/flaky/books/", "503", times=2), Rule("GET", r"^/flaky/books/", "reset", times=1),
             Rule("GET", r"list-type=2", "500", times=1), Rule("PUT", r"^/flaky/out/.*\.arrow", "503", times=2),
             Rule("PUT", r"^/flaky/out/", "reset", times=2), Rule("POST", r"^/flaky/out/", "500", times=1),
             Rule("HEAD", r"^/flaky/", "503", times=1)]
    with FaultyS3(s3_env["AWS_ENDPOINT_URL"], rules) as proxy:
        run_cli("run", "--config", CONFIG, "--books", "s3://flaky/books/", "--tokenizer", bert_vocab,
                "--output", "s3://flaky/out", env={**s3_env, "AWS_ENDPOINT_URL": proxy.endpoint})
    assert sum(rule.hits for rule in rules) >= 8, proxy.faults  # the faults were met, not dodged
    manifest = read_manifest(local)
    remote = json.loads(s3.get_object(Bucket="flaky", Key="out/manifest.json")["Body"].read())
    assert [s["sha256"] for s in remote["shards"]] == shard_hashes(local)
    for shard in manifest["shards"]:
        assert s3.get_object(Bucket="flaky", Key=f"out/{shard['name']}")["Body"].read() == \
            (local / shard["name"]).read_bytes()


def test_a_store_that_keeps_failing_ends_the_run_in_one_line_and_publishes_nothing(s3_env, real_books, bert_vocab):
    s3 = boto3.client("s3")
    _books_only_run(s3, "down", real_books)
    rules = [Rule("PUT", r"^/down/out/.*\.arrow", "500", times=math.inf)]  # every shard upload, every attempt
    with FaultyS3(s3_env["AWS_ENDPOINT_URL"], rules) as proxy:
        proc = run_cli("run", "--config", CONFIG, "--books", "s3://down/books/", "--tokenizer", bert_vocab,
                       "--output", "s3://down/out", check=False,
                       env={**s3_env, "AWS_ENDPOINT_URL": proxy.endpoint, "AWS_MAX_ATTEMPTS": "2"})
    assert proc.returncode != 0 and rules[0].hits >= 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and "InternalError" in last and "s3://down/out" in last, last
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="down", Prefix="out/").get("Contents", [])]
    assert "out/manifest.json" not in keys and not any(k.endswith(".arrow") for k in keys), keys


def test_the_inputs_formats_read_from_s3_as_from_local_disk(s3_env, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from common.preprocess_config import InputSourceConfig, SourceConfig
    from preprocess.readers import FORMATS

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="mixture")
    crawl = tmp_path / "crawl.jsonl"
    crawl.write_text("".join(json.dumps({"text": f"Record {i}. " * (1 + i % 9)}) + "\n" for i in range(40_000)))
    pq.write_table(pa.table({"text": [f"Row {i}. It is a row." for i in range(500)]}), tmp_path / "rows.parquet",
                   row_group_size=100)
    saved = tmp_path / "saved"
    saved.mkdir()
    with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as sink:  # as datasets' save_to_disk writes it
        with pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as writer:
            writer.write_table(pa.table({"text": ["One. Two.", "Three. Four."]}))
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    for path in (crawl, tmp_path / "rows.parquet", saved / "data-00000-of-00001.arrow", saved / "state.json"):
        s3.upload_file(str(path), "mixture", str(path.relative_to(tmp_path)))
    for fmt, local, remote in (("jsonl", str(crawl), "s3://mixture/crawl.jsonl"),
                               ("parquet", str(tmp_path / "rows.parquet"), "s3://mixture/rows.parquet"),
                               ("datasets", str(saved), "s3://mixture/saved")):
        reader = FORMATS[fmt]
        spec = InputSourceConfig(name="s", format=fmt, paths=[local])
        (local_file,), (remote_file,) = reader.files([local]), reader.files([remote])
        size = os.path.getsize(local_file)
        pieces = reader.pieces(remote_file, size, 3, spec) or [(1.0, None)]
        assert (fmt == "datasets") == (len(pieces) == 1), fmt  # the jsonl file and the Parquet file are cut
        from_s3 = [r for _, piece in pieces for r in reader.read(remote_file, piece, spec, SourceConfig(), {})]
        assert from_s3 == list(reader.read(local_file, None, spec, SourceConfig(), {})) and from_s3, fmt
