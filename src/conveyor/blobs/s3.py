"""Blobs in an S3-compatible bucket, keyed ``prefix/ab/cd/<digest>``."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

from conveyor.blobs.digest import check_digest, check_size, copy_hashed, read_chunks, read_limited, sha256_hex
from conveyor.blobs.s3client import S3Settings, error_code, make_client, s3_errors
from conveyor.errors import BlobCorrupt, BlobNotFound

MiB = 1024 * 1024
PART_SIZE = 8 * MiB
"""Blobs this size and over go up in parts of this size (multipart upload); smaller ones in one PUT."""

_MISSING = {"NoSuchKey", "404", "NotFound"}
_READ_TRIES = 3  # a body cut off mid-read (a server restart) is fetched again; botocore retries only the request


class S3Blobs:
    """Content-addressed blobs in ``bucket`` under ``prefix``; a put of stored bytes writes nothing.

    Small puts are one ``PUT`` with ``If-None-Match: *``; streams are spooled to a temp file while
    hashed, then, from ``part_size`` up, sent in parts (multipart upload) under their digest's key
    unless that key already exists. Every read is checked against the digest before it is returned.
    The client is made lazily in each process, so the store pickles and survives a fork.
    """

    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None,
                 part_size: int = PART_SIZE) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.settings = settings or S3Settings()
        self.part_size = part_size
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client: Any = None
        self._pid = 0
        self._conditional = True  # If-None-Match: * on PUT, until the server says it has no such thing
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_pid": 0, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def check_writable(self) -> None:
        """Store the empty blob with few retries, so a wrong endpoint, bucket or key fails now, in one line."""
        probe = make_client(self.settings, max_attempts=2)
        with s3_errors("write", self.url, self.settings):
            self._put_if_absent(probe, self.key_for(sha256_hex(b"")), b"")

    def put(self, data: bytes) -> str:
        """Store ``data``; return its digest."""
        digest = sha256_hex(data)
        if len(data) < self.part_size:
            with s3_errors("write", self.url, self.settings):
                self._put_if_absent(self._s3(), self.key_for(digest), data)
            return digest
        digest, _ = self.put_stream([data])
        return digest

    def put_stream(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Spool the stream to a temp file while hashing it, then upload it under its digest."""
        with tempfile.NamedTemporaryFile(prefix="conveyor-put-") as spool:
            digest, size = copy_hashed(chunks, spool.write)
            spool.flush()
            with s3_errors("write", self.url, self.settings):
                self._upload(digest, size, Path(spool.name))
        return digest, size

    def put_file(self, path: Path) -> tuple[str, int]:
        """Store a file's bytes, streamed through a spool so what is sent is what was hashed."""
        with Path(path).open("rb") as src:
            return self.put_stream(read_chunks(src))

    def get(self, digest: str, max_bytes: int | None = None) -> bytes:
        """Return the blob's bytes after checking they hash to ``digest``."""
        key = self.key_for(digest)
        with s3_errors("read", self.url, self.settings):
            data = self._read(digest, key, max_bytes)
        actual = sha256_hex(data)
        if actual != digest:
            raise BlobCorrupt(f"blob {digest} is corrupt: s3://{self.bucket}/{key} now hashes to {actual}")
        return data

    def exists(self, digest: str) -> bool:
        """True if a blob is stored under ``digest``."""
        key = self.key_for(digest)
        with s3_errors("look up", self.url, self.settings):
            return self._head(key) is not None

    def size(self, digest: str) -> int:
        """Size in bytes, from a HEAD request."""
        key = self.key_for(digest)
        with s3_errors("look up", self.url, self.settings):
            head = self._head(key)
        if head is None:
            raise BlobNotFound(f"no blob {digest} in {self.url}")
        return int(head["ContentLength"])

    def key_for(self, digest: str) -> str:
        """The object key of ``digest``; raise BlobError for a non-digest."""
        check_digest(digest)
        name = f"{digest[0:2]}/{digest[2:4]}/{digest}"
        return f"{self.prefix}/{name}" if self.prefix else name

    def _s3(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            with self._lock:
                if self._client is None or self._pid != os.getpid():
                    self._client, self._pid = make_client(self.settings), os.getpid()
        return self._client

    def _upload(self, digest: str, size: int, spool: Path) -> None:
        key = self.key_for(digest)
        if size < self.part_size:
            self._put_if_absent(self._s3(), key, spool.read_bytes())
        elif self._head(key) is None:
            # Same bytes under the same key: a concurrent upload of this blob is harmless, so HEAD is enough.
            # Sent from the file by name, each part is read as it goes out, never held whole.
            self._s3().upload_file(str(spool), self.bucket, key, Config=self._transfer())

    def _put_if_absent(self, client: Any, key: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        if not self._conditional:
            self._head_then_put(client, key, data)
            return
        try:
            client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            code = error_code(exc)
            if code in ("PreconditionFailed", "412"):
                return  # stored already
            if code in ("NotImplemented", "501"):  # a server without conditional writes: HEAD first from now on
                self._conditional = False
                self._head_then_put(client, key, data)
            elif code == "ConditionalRequestConflict":
                # Another writer's PUT of these very bytes is in flight: an unconditional PUT is as good.
                client.put_object(Bucket=self.bucket, Key=key, Body=data)
            else:
                raise

    def _head_then_put(self, client: Any, key: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            client.head_object(Bucket=self.bucket, Key=key)
            return
        except ClientError as exc:
            if error_code(exc) not in _MISSING:
                raise
        client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            head: dict[str, Any] = self._s3().head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in _MISSING:
                return None
            raise
        return head

    def _read(self, digest: str, key: str, max_bytes: int | None) -> bytes:
        from botocore.exceptions import IncompleteReadError, ResponseStreamingError

        for attempt in range(_READ_TRIES - 1):
            try:
                return self._read_once(digest, key, max_bytes)
            except (IncompleteReadError, ResponseStreamingError):
                time.sleep(0.2 * (attempt + 1))
        return self._read_once(digest, key, max_bytes)

    def _read_once(self, digest: str, key: str, max_bytes: int | None) -> bytes:
        from botocore.exceptions import ClientError, IncompleteReadError

        try:
            response = self._s3().get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in _MISSING:
                raise BlobNotFound(f"no blob {digest} in {self.url}") from None
            raise
        expected = int(response["ContentLength"])
        with closing(response["Body"]) as body:
            check_size(digest, expected, max_bytes)
            data = read_limited(body, digest, max_bytes)
        if len(data) != expected:  # cut off on the way (botocore checks this only for a read to the end)
            raise IncompleteReadError(actual_bytes=len(data), expected_bytes=expected)
        return data

    def _transfer(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
                              max_concurrency=4)
