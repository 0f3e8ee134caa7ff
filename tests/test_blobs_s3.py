"""What only the S3 store has: its keys in the bucket, conditional writes, multipart uploads, a digest check
on every read, one process's client never reused in another, and what a user sees when S3 is away or says no.
Run against a real SeaweedFS server (the `s3` fixture in conftest.py)."""

from __future__ import annotations

import hashlib
import os
import pickle
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.blobs import S3Blobs, S3Settings, open_blobs
from conveyor.errors import BlobCorrupt, BlobUnavailable, UserError
from tests.apiserver import free_port
from tests.s3server import S3Proxy, S3Server, s3_server

MiB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(s3_env: S3Server) -> S3Blobs:
    opened = open_blobs(s3_env.new_url())
    assert isinstance(opened, S3Blobs)
    return opened


def test_keys_are_prefix_and_digest(store: S3Blobs, s3_env: S3Server) -> None:
    one, two = store.put(b"one"), store.put_stream([b"tw", b"o"])[0]
    assert s3_env.keys(store.prefix + "/") == sorted(
        f"{store.prefix}/{d[:2]}/{d[2:4]}/{d}" for d in (one, two))


def test_second_put_writes_nothing(store: S3Blobs, s3_env: S3Server) -> None:
    digest = store.put(b"dup")
    key = store.key_for(digest)
    # Overwrite the object behind the store's back: a put that wrote again would put "dup" back.
    s3_env.client().put_object(Bucket=s3_env.bucket, Key=key, Body=b"marker")
    store.put(b"dup")
    store.put_stream([b"d", b"up"])
    body = s3_env.client().get_object(Bucket=s3_env.bucket, Key=key)["Body"].read()
    assert body == b"marker"
    assert s3_env.keys(store.prefix + "/") == [key]


@pytest.mark.parametrize("stored", [b"tampered", b"", b"precious bytes and then some"])
def test_altered_object_is_refused(store: S3Blobs, s3_env: S3Server, stored: bytes) -> None:
    digest = store.put(b"precious bytes")
    key = store.key_for(digest)
    s3_env.client().put_object(Bucket=s3_env.bucket, Key=key, Body=stored)
    with pytest.raises(BlobCorrupt) as caught:
        store.get(digest)
    assert f"s3://{s3_env.bucket}/{key}" in str(caught.value)
    assert sha(stored) in str(caught.value)


def test_large_stream_goes_up_in_parts_in_bounded_memory(s3_env: S3Server) -> None:
    opened = open_blobs(s3_env.new_url())
    assert isinstance(opened, S3Blobs)
    store = S3Blobs(opened.bucket, opened.prefix, opened.settings, part_size=5 * MiB)
    hasher, total = hashlib.sha256(), 64 * MiB

    def chunks() -> Iterator[bytes]:
        for _ in range(total // MiB):
            chunk = os.urandom(MiB)
            hasher.update(chunk)
            yield chunk

    tracemalloc.start()
    try:
        digest, size = store.put_stream(chunks())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (digest, size) == (hasher.hexdigest(), total)
    assert peak < total // 2, f"put_stream peaked at {peak} bytes for a {total} byte stream"
    head = s3_env.client().head_object(Bucket=s3_env.bucket, Key=store.key_for(digest))
    assert head["ETag"].strip('"').endswith("-13"), "64 MiB in 5 MiB parts is a 13-part upload"
    assert sha(store.get(digest)) == digest
    store.put_stream([b"x" * 6 * MiB])
    assert store.put_stream([b"x" * 6 * MiB])[0] == sha(b"x" * 6 * MiB)


def test_store_pickles_without_its_client(store: S3Blobs) -> None:
    digest = store.put(b"carried to a worker")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.url == store.url
    assert copy._client is None
    assert copy.get(digest) == b"carried to a worker"


def test_a_forked_process_makes_its_own_client(store: S3Blobs) -> None:
    digest = store.put(b"before the fork")
    parent_client = store._s3()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh client, and the blob read through it
        ok = store.get(digest) == b"before the fork" and store._s3() is not parent_client
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert store._s3() is parent_client


# -- S3 away or saying no: one line that says what to check ----------------------------


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    assert isinstance(exc.value, UserError), "the CLI prints a UserError as one line and exits 2"
    return message


def test_missing_bucket(s3_env: S3Server) -> None:
    store = open_blobs("s3://no-such-bucket-here/p")
    with pytest.raises(BlobUnavailable) as caught:
        store.check_writable()  # type: ignore[attr-defined]
    assert "does not exist" in _one_line(caught) and "s3://no-such-bucket-here/p" in str(caught.value)
    with pytest.raises(BlobUnavailable, match="does not exist"):
        store.put(b"x")
    with pytest.raises(BlobUnavailable, match="does not exist"):
        store.get(sha(b"x"))


def test_unreachable_endpoint(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("CONVEYOR_S3_ENDPOINT", f"http://127.0.0.1:{port}")
    store = open_blobs(s3_env.new_url())
    started = time.monotonic()
    with pytest.raises(BlobUnavailable) as caught:
        store.check_writable()  # type: ignore[attr-defined]
    assert time.monotonic() - started < 15, "the start-up check gives up after a couple of tries"
    message = _one_line(caught)
    assert f"cannot reach the S3 endpoint http://127.0.0.1:{port}" in message
    assert "CONVEYOR_S3_ENDPOINT" in message


def test_wrong_secret(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = open_blobs(s3_env.new_url())
    with pytest.raises(BlobUnavailable) as caught:
        store.check_writable()  # type: ignore[attr-defined]
    assert "AWS_SECRET_ACCESS_KEY" in _one_line(caught)


# -- throttling: S3's SlowDown is retried by the client, then reported ------------------------------


@pytest.fixture
def throttle(s3_env: S3Server) -> Iterator[S3Proxy]:
    proxy = S3Proxy(s3_env.endpoint)
    yield proxy
    proxy.close()


def _through(proxy: S3Proxy, s3_env: S3Server, max_attempts: int) -> S3Blobs:
    bucket, prefix = s3_env.new_url().removeprefix("s3://").split("/", 1)
    return S3Blobs(bucket, prefix, S3Settings(proxy.endpoint, "us-east-1", max_attempts=max_attempts))


def test_slow_down_is_retried(throttle: S3Proxy, s3_env: S3Server) -> None:
    store = _through(throttle, s3_env, max_attempts=5)
    throttle.refuse = 3
    digest = store.put(b"under load")
    assert throttle.seen == 4, "three SlowDowns, then the write that went through"
    throttle.refuse, throttle.seen = 2, 0
    assert store.get(digest) == b"under load"
    assert store.exists(digest)
    assert throttle.seen == 4


def test_slow_down_past_the_attempts_is_reported(throttle: S3Proxy, s3_env: S3Server) -> None:
    store = _through(throttle, s3_env, max_attempts=3)
    throttle.refuse = 100
    with pytest.raises(BlobUnavailable) as caught:
        store.put(b"never stored")
    assert "SlowDown" in _one_line(caught)
    assert throttle.seen == 3, "max_attempts requests, then the error"


def test_a_body_cut_off_is_fetched_again(throttle: S3Proxy, s3_env: S3Server) -> None:
    store = _through(throttle, s3_env, max_attempts=3)
    data = os.urandom(200_000)
    digest = store.put(data)
    throttle.cut, throttle.seen = 2, 0
    assert store.get(digest) == data
    assert throttle.seen == 3, "two answers cut off half way, then the whole blob"
    throttle.cut, throttle.seen = 1, 0
    assert store.get(digest, max_bytes=len(data)) == data, "a read under a limit notices the cut too"
    assert throttle.seen == 2


def test_a_server_without_conditional_puts(throttle: S3Proxy, s3_env: S3Server) -> None:
    store = _through(throttle, s3_env, max_attempts=3)
    throttle.conditional = False
    digest = store.put(b"no If-None-Match here")
    assert store.get(digest) == b"no If-None-Match here"
    s3_env.client().put_object(Bucket=s3_env.bucket, Key=store.key_for(digest), Body=b"marker")
    throttle.seen = 0
    store.put(b"no If-None-Match here")
    assert throttle.seen == 1, "one HEAD finds it; the conditional PUT is not tried again"
    with pytest.raises(BlobCorrupt):
        store.get(digest)


def test_blobs_outlive_a_killed_server(s3_env: S3Server, tmp_path: Path) -> None:
    """A server of its own, killed and started again: reads while it is down are BlobUnavailable, and the same
    store object reads the same, checked bytes once it is back."""
    with s3_server(tmp_path / "own") as server:
        bucket, prefix = server.new_url().removeprefix("s3://").split("/", 1)
        store = S3Blobs(bucket, prefix, S3Settings(server.endpoint, "us-east-1", max_attempts=2))
        small, large = b"kept through a crash", os.urandom(9 * MiB)
        digests = [store.put(small), store.put(large)]
        server.kill()
        with pytest.raises(BlobUnavailable, match="cannot reach the S3 endpoint"):
            store.get(digests[0])
        server.start_again()
        assert [store.get(d) for d in digests] == [small, large]


def test_check_writable_probe_is_harmless(store: S3Blobs, s3_env: S3Server, tmp_path: Path) -> None:
    store.check_writable()
    store.check_writable()
    empty = sha(b"")
    assert s3_env.keys(store.prefix + "/") == [store.key_for(empty)]
    assert store.get(empty) == b""


def test_unavailable_is_a_retried_task_failure_and_a_503() -> None:
    from conveyor.api.problems import status_of
    from conveyor.runtime.classify import classify

    failure = classify(BlobUnavailable("cannot reach the S3 endpoint"))
    assert (failure.error_class, failure.retryable) == ("blob_unavailable", True)
    assert status_of(BlobUnavailable("cannot reach the S3 endpoint")) == 503
