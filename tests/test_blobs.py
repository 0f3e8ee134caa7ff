"""Contract tests for conveyor.blobs, run against every backend: a folder, memory, and a real S3 server
(SeaweedFS, started by the `s3` fixture in conftest.py)."""

from __future__ import annotations

import hashlib
import os
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.blobs import Blobs, FilesystemBlobs, MemoryBlobs, S3Blobs, is_digest, open_blobs
from conveyor.blobs.filesystem import STALE_TEMP_S
from conveyor.errors import BlobCorrupt, BlobError, BlobNotFound, BlobTooLarge, UrlError

MiB = 1024 * 1024
MISSING = hashlib.sha256(b"never stored").hexdigest()
INVALID_DIGESTS = [
    "../../etc/passwd",
    "/etc/passwd",
    "ABC",
    "a" * 63,
    "A" * 64,
    hashlib.sha256(b"x").hexdigest().upper(),
    "a" * 64 + "\n",
    "a" * 65,
    "../" + "a" * 61,
    "",
]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def temp_files(root: Path) -> list[Path]:
    tmp = root / "tmp"
    return sorted(tmp.iterdir()) if tmp.exists() else []


@pytest.fixture(params=["filesystem", "memory", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Blobs:
    if request.param == "filesystem":
        return FilesystemBlobs(tmp_path / "store")
    if request.param == "s3":
        return open_blobs(request.getfixturevalue("s3_env").new_url())
    return MemoryBlobs()


@pytest.fixture
def fs(tmp_path: Path) -> FilesystemBlobs:
    return FilesystemBlobs(tmp_path / "store")


@pytest.fixture
def big_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(5 * MiB + 12345)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    return path, data


# -- the contract, for every backend ------------------------------------------------


def test_put_get_round_trip(blobs: Blobs) -> None:
    data = b"hello, conveyor"
    digest = blobs.put(data)
    assert digest == sha(data)
    assert blobs.get(digest) == data


def test_empty_blob(blobs: Blobs) -> None:
    digest = blobs.put(b"")
    assert digest == sha(b"")
    assert blobs.get(digest) == b""
    assert blobs.size(digest) == 0


def test_put_twice_same_digest(blobs: Blobs) -> None:
    assert blobs.put(b"same") == blobs.put(b"same") == sha(b"same")
    assert blobs.get(sha(b"same")) == b"same"


def test_put_stream_big(blobs: Blobs, big_file: tuple[Path, bytes]) -> None:
    _, data = big_file
    chunks = (data[i : i + 300_000] for i in range(0, len(data), 300_000))
    digest, size = blobs.put_stream(chunks)
    assert (digest, size) == (sha(data), len(data))
    assert blobs.size(digest) == len(data)
    assert blobs.get(digest) == data


def test_put_file_big(blobs: Blobs, big_file: tuple[Path, bytes]) -> None:
    path, data = big_file
    digest, size = blobs.put_file(path)
    assert (digest, size) == (sha(data), len(data))
    assert blobs.size(digest) == len(data)
    assert blobs.get(digest) == data


def test_put_stream_and_put_agree(blobs: Blobs) -> None:
    digest, size = blobs.put_stream([b"ab", b"", b"cd"])
    assert (digest, size) == (blobs.put(b"abcd"), 4)


def test_exists_and_size(blobs: Blobs) -> None:
    assert not blobs.exists(MISSING)
    digest = blobs.put(b"12345")
    assert blobs.exists(digest)
    assert blobs.size(digest) == 5


def test_read_limit(blobs: Blobs) -> None:
    digest = blobs.put(b"0123456789")
    assert blobs.get(digest, max_bytes=10) == b"0123456789"
    with pytest.raises(BlobTooLarge, match=digest):
        blobs.get(digest, max_bytes=9)
    with pytest.raises(BlobNotFound):
        blobs.get(MISSING, max_bytes=9)


def test_missing_digest_raises_not_found(blobs: Blobs) -> None:
    with pytest.raises(BlobNotFound, match=MISSING):
        blobs.get(MISSING)
    with pytest.raises(BlobNotFound):
        blobs.size(MISSING)


@pytest.mark.parametrize("bad", INVALID_DIGESTS)
def test_invalid_digest_rejected(blobs: Blobs, tmp_path: Path, bad: str) -> None:
    before = tree(tmp_path)
    for call in (blobs.get, blobs.exists, blobs.size):
        with pytest.raises(BlobError, match="not a sha256 digest") as caught:
            call(bad)
        # BlobNotFound is a BlobError too: it would mean the digest was used as a key.
        assert type(caught.value) is BlobError
    assert tree(tmp_path) == before


def test_stream_failure_stores_nothing(blobs: Blobs) -> None:
    def broken() -> Iterator[bytes]:
        yield b"partial"
        raise OSError("source went away")

    with pytest.raises(OSError, match="source went away"):
        blobs.put_stream(broken())
    assert not blobs.exists(sha(b"partial"))


# -- filesystem specifics ------------------------------------------------------------


def test_fs_layout_and_url(fs: FilesystemBlobs, tmp_path: Path) -> None:
    digest = fs.put(b"layout")
    path = tmp_path / "store" / digest[:2] / digest[2:4] / digest
    assert path.read_bytes() == b"layout"
    assert fs.url == (tmp_path / "store").as_uri()
    assert fs.url.startswith("file:///")


def test_fs_put_twice_one_file(fs: FilesystemBlobs, tmp_path: Path) -> None:
    digest = fs.put(b"dup")
    inode = fs.path_for(digest).stat().st_ino
    fs.put(b"dup")
    assert fs.path_for(digest).stat().st_ino == inode, "a second put must not replace the stored file"
    fs.put_stream([b"d", b"up"])
    stored = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert [p.name for p in stored] == [sha(b"dup")]


def test_fs_no_temp_files_left(fs: FilesystemBlobs, tmp_path: Path) -> None:
    fs.put(b"one")
    fs.put(b"one")
    fs.put_stream([b"two"])
    (tmp_path / "src.bin").write_bytes(b"three")
    fs.put_file(tmp_path / "src.bin")
    with pytest.raises(RuntimeError):
        fs.put_stream(_fail_after(b"four"))
    assert temp_files(tmp_path / "store") == []


def test_fs_check_writable_removes_the_temp_files_of_puts_killed_long_ago(fs: FilesystemBlobs) -> None:
    fs.check_writable()
    tmp = fs.root / "tmp"
    old, fresh, other = tmp / "put-0123456789abcdef.tmp", tmp / "put-fedcba9876543210.tmp", tmp / "notes.txt"
    for path in (old, fresh, other):
        path.write_bytes(b"partial")
    day_ago = time.time() - STALE_TEMP_S - 60
    os.utime(old, (day_ago, day_ago))
    os.utime(other, (day_ago, day_ago))
    fs.check_writable()
    assert sorted(p.name for p in tmp.iterdir()) == sorted([fresh.name, other.name])  # a live put's is recent
    assert fs.sweep_temp(now=time.time() + STALE_TEMP_S + 60) == 1 and not fresh.exists()


def test_fs_check_writable_keeps_a_live_put_under_a_clock_a_week_ahead(
    fs: FilesystemBlobs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fs.check_writable()
    live = fs.root / "tmp" / "put-0123456789abcdef.tmp"
    live.write_bytes(b"partial")
    ahead = time.time() + 7 * 86400
    monkeypatch.setattr(time, "time", lambda: ahead)  # this process's clock is skewed; the folder's is not
    fs.check_writable()
    assert live.exists()


def _fail_after(chunk: bytes) -> Iterator[bytes]:
    yield chunk
    raise RuntimeError("boom")


def test_fs_corrupt_blob_raises(fs: FilesystemBlobs) -> None:
    digest = fs.put(b"precious")
    path = fs.path_for(digest)
    path.write_bytes(b"tampered")
    with pytest.raises(BlobCorrupt) as caught:
        fs.get(digest)
    assert digest in str(caught.value)
    assert str(path) in str(caught.value)


def test_fs_truncated_blob_raises(fs: FilesystemBlobs) -> None:
    digest = fs.put(b"precious bytes")
    fs.path_for(digest).write_bytes(b"")
    with pytest.raises(BlobCorrupt):
        fs.get(digest)


def test_fs_put_file_streams(fs: FilesystemBlobs, big_file: tuple[Path, bytes]) -> None:
    path, data = big_file
    tracemalloc.start()
    try:
        fs.put_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MiB, f"put_file peaked at {peak} bytes for a {len(data)} byte file"


def test_fs_creates_root_lazily(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    store = FilesystemBlobs(root)
    assert not store.exists(MISSING)
    assert not root.exists()
    store.put(b"x")
    assert root.is_dir()


# -- helpers and URLs ----------------------------------------------------------------


def test_is_digest() -> None:
    assert is_digest(sha(b"x"))
    assert not any(is_digest(bad) for bad in INVALID_DIGESTS)
    assert not is_digest(sha(b"x").encode())
    assert not is_digest(None)


def test_open_blobs_memory() -> None:
    store = open_blobs("memory://")
    assert isinstance(store, MemoryBlobs)
    assert store.url == "memory://"


def test_open_blobs_file_url(tmp_path: Path) -> None:
    root = tmp_path / "with space"
    store = open_blobs(root.as_uri())
    assert isinstance(store, FilesystemBlobs)
    assert store.root == root
    assert store.url == root.as_uri()


def test_open_blobs_plain_absolute_path(tmp_path: Path) -> None:
    store = open_blobs(str(tmp_path / "abs"))
    assert isinstance(store, FilesystemBlobs)
    assert store.root == tmp_path / "abs"


def test_open_blobs_relative_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("file:rel/path", "rel/path", "./rel/path"):
        store = open_blobs(url)
        assert isinstance(store, FilesystemBlobs), url
        assert store.root == tmp_path / "rel" / "path", url


def test_open_blobs_url_round_trip(fs: FilesystemBlobs) -> None:
    reopened = open_blobs(fs.url)
    assert isinstance(reopened, FilesystemBlobs)
    assert reopened.root == fs.root
    digest = fs.put(b"shared")
    assert reopened.get(digest) == b"shared"


def test_open_blobs_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_S3_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    store = open_blobs("s3://my-bucket/runs/2026/")
    assert isinstance(store, S3Blobs)
    assert (store.bucket, store.prefix, store.url) == ("my-bucket", "runs/2026", "s3://my-bucket/runs/2026")
    assert (store.settings.endpoint, store.settings.region) == ("http://127.0.0.1:9", "eu-west-3")
    assert store.settings.max_attempts == 3
    assert store.key_for(sha(b"x")) == f"runs/2026/{sha(b'x')[:2]}/{sha(b'x')[2:4]}/{sha(b'x')}"
    bare = open_blobs("s3://my-bucket")
    assert isinstance(bare, S3Blobs)
    assert bare.url == "s3://my-bucket" and bare.key_for(sha(b"x")).startswith(sha(b"x")[:2] + "/")


@pytest.mark.parametrize("attempts", ["0", "many", "-1", "2.5"])
def test_open_blobs_s3_bad_max_attempts(monkeypatch: pytest.MonkeyPatch, attempts: str) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", attempts)
    with pytest.raises(UrlError, match="AWS_MAX_ATTEMPTS"):
        open_blobs("s3://my-bucket/x")


@pytest.mark.parametrize("url", ["s3://", "s3://ab", "s3://My_Bucket/x", "s3:bucket", "s3://bucket/../up",
                                 "s3://bucket/a b", "s3://bucket/x?versionId=1", "s3://bucket/x#y"])
def test_open_blobs_bad_s3_url(url: str) -> None:
    with pytest.raises(UrlError, match=r"s3://BUCKET/PREFIX|unusable key prefix") as caught:
        open_blobs(url)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["ftp://host/x", "gs://bucket", "http://example.com/blobs", "memory://name", "file://host/x", ""]
)
def test_open_blobs_bad_url(url: str) -> None:
    with pytest.raises(UrlError) as caught:
        open_blobs(url)
    message = str(caught.value)
    assert "\n" not in message
    assert "file:///abs/path" in message
    assert "memory://" in message


def test_open_blobs_path_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(UrlError, match="not a folder"):
        open_blobs(str(tmp_path / "f"))
