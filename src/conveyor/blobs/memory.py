"""Blobs in a dict: the same contract as on disk, for tests and dry runs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from conveyor.blobs.digest import check_digest, check_size, copy_hashed, read_chunks
from conveyor.errors import BlobNotFound


class MemoryBlobs:
    """Content-addressed blobs held in memory for the life of the object."""

    def __init__(self) -> None:
        self.url = "memory://"
        self._blobs: dict[str, bytes] = {}

    def put(self, data: bytes) -> str:
        """Store ``data``; return its digest."""
        digest, _ = self.put_stream([data])
        return digest

    def put_stream(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Store a stream; return (digest, size)."""
        buffer = bytearray()
        digest, size = copy_hashed(chunks, buffer.extend)
        self._blobs.setdefault(digest, bytes(buffer))
        return digest, size

    def put_file(self, path: Path) -> tuple[str, int]:
        """Store a file's bytes, read in 1 MiB chunks; return (digest, size)."""
        with Path(path).open("rb") as src:
            return self.put_stream(read_chunks(src))

    def get(self, digest: str, max_bytes: int | None = None) -> bytes:
        """Return the blob's bytes."""
        try:
            data = self._blobs[check_digest(digest)]
        except KeyError:
            raise BlobNotFound(f"no blob {digest} in {self.url}") from None
        check_size(digest, len(data), max_bytes)
        return data

    def exists(self, digest: str) -> bool:
        """True if a blob is stored under ``digest``."""
        return check_digest(digest) in self._blobs

    def size(self, digest: str) -> int:
        """Size in bytes."""
        return len(self.get(digest))
