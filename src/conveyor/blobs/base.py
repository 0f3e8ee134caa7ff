"""The blob store seam: content-addressed bytes, named by their sha256."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class Blobs(Protocol):
    """Content-addressed storage. Digests are lowercase hex sha256 of the bytes."""

    url: str

    def put(self, data: bytes) -> str:
        """Store ``data``; return its digest. Storing the same bytes twice is a no-op."""
        ...

    def put_stream(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Store a stream without holding it in memory; return (digest, size)."""
        ...

    def put_file(self, path: Path) -> tuple[str, int]:
        """Store a file's bytes, streamed; return (digest, size)."""
        ...

    def get(self, digest: str, max_bytes: int | None = None) -> bytes:
        """Return the bytes; raise BlobNotFound, BlobCorrupt if they no longer match, or
        BlobTooLarge if the blob is over ``max_bytes`` (checked before it is read in full)."""
        ...

    def exists(self, digest: str) -> bool: ...

    def size(self, digest: str) -> int:
        """Size in bytes without reading the blob; raise BlobNotFound."""
        ...
