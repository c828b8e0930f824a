"""common.storage against an S3 emulator that throttles, fails and cuts connections (tests/faulty_s3.py).

What is retryable (503 SlowDown, 500, a reset connection) is retried with bounded backoff and the call completes
with the same bytes; a fault that outlasts the retries fails the call with the store's error, and what was being
written never appears: a single PUT is not stored, a multipart upload is aborted (no object, no upload left open).
"""
from __future__ import annotations

import math
import os

import boto3
import botocore.exceptions
import pytest

from common import storage
from tests.faulty_s3 import FaultyS3, Rule
from tests.preprocess.servers import moto_s3_server

ATTEMPTS = 3  # production's default is common.storage.S3_MAX_ATTEMPTS; the bound is what is tested
MULTIPART_BYTES = 52428800 + (1 << 20)  # one byte over smart_open's part size makes two parts; a MiB more, margin


@pytest.fixture(scope="module")
def moto():
    with moto_s3_server() as env:
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], **_credentials(env)).create_bucket(Bucket="bucket")
        yield env


def _credentials(env: dict) -> dict:
    return {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            "region_name": env["AWS_DEFAULT_REGION"]}


@pytest.fixture
def faulty(moto, monkeypatch):
    """``faulty(rules)``: a proxy injecting ``rules`` in front of moto, with storage's clients pointed at it."""
    started = []

    def make(rules: list[Rule]) -> FaultyS3:
        proxy = FaultyS3(moto["AWS_ENDPOINT_URL"], rules).__enter__()
        started.append(proxy)
        for key, value in moto.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(ATTEMPTS))  # the backoff doubles per attempt: keep tests short
        monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
        return proxy

    yield make
    for proxy in started:
        proxy.__exit__(None, None, None)


def _direct(moto):
    return boto3.client("s3", endpoint_url=moto["AWS_ENDPOINT_URL"], **_credentials(moto))


def test_throttling_errors_and_resets_are_retried_and_the_bytes_arrive_whole(faulty, moto, tmp_path):
    # each call meets at most two faults in a row, within the three attempts
    proxy = faulty([Rule("PUT", r"^/bucket/t/a", "503", times=1), Rule("PUT", r"^/bucket/t/a", "reset", times=1),
                    Rule("PUT", r"^/bucket/t/blob", "500", times=1), Rule("GET", r"^/bucket/t/a", "503", times=2),
                    Rule("GET", r"^/bucket/t/blob", "reset", times=1), Rule("GET", r"list-type=2", "500", times=1),
                    Rule("HEAD", r"^/bucket/t/", "503", times=1)])
    storage.write_json("s3://bucket/t/a.json", {"rows": 3})
    local = tmp_path / "blob"
    local.write_bytes(os.urandom(3 << 20))
    storage.upload_file(str(local), "s3://bucket/t/blob")
    assert storage.read_json("s3://bucket/t/a.json") == {"rows": 3}
    with storage.open_read("s3://bucket/t/blob") as handle:
        assert handle.read() == local.read_bytes()
    assert storage.list_files("s3://bucket/t") == ["s3://bucket/t/a.json", "s3://bucket/t/blob"]
    assert storage.size_of("s3://bucket/t/blob") == 3 << 20
    injected = [fault for _, _, fault in proxy.faults]
    assert injected.count("503") == 4 and injected.count("500") == 2 and injected.count("reset") == 2


def test_a_put_that_keeps_failing_fails_the_write_and_stores_nothing(faulty, moto):
    proxy = faulty([Rule("PUT", r"^/bucket/gone/", "500", times=math.inf)])
    with pytest.raises(botocore.exceptions.ClientError, match="InternalError"):
        storage.write_json("s3://bucket/gone/manifest.json", {"complete": True})
    assert len(proxy.faults) == ATTEMPTS  # bounded: every attempt, then the error
    assert "Contents" not in _direct(moto).list_objects_v2(Bucket="bucket", Prefix="gone/")


def test_a_multipart_upload_cut_off_is_aborted_and_leaves_no_object(faulty, moto, tmp_path):
    local = tmp_path / "shard.arrow"
    local.write_bytes(os.urandom(MULTIPART_BYTES))
    proxy = faulty([Rule("PUT", r"partNumber=2", "reset", times=math.inf)])
    with pytest.raises(botocore.exceptions.ConnectionClosedError):  # the reset, once the retries are spent
        storage.upload_file(str(local), "s3://bucket/cut/shard.arrow")
    assert len(proxy.faults) == ATTEMPTS and proxy.forwarded >= 2  # part 1 went through
    direct = _direct(moto)
    assert "Contents" not in direct.list_objects_v2(Bucket="bucket", Prefix="cut/")
    assert not direct.list_multipart_uploads(Bucket="bucket").get("Uploads")  # aborted, not left to bill


def test_the_retry_budget_follows_botocores_variables(monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "4")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    assert storage.s3_retries() == {"mode": "adaptive", "total_max_attempts": 4}
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")
    monkeypatch.delenv("AWS_RETRY_MODE")
    assert storage.s3_retries() == {"mode": "standard", "total_max_attempts": storage.S3_MAX_ATTEMPTS}
