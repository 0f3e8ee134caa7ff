"""Helpers shared by blob stores: digest validation and streamed hashing."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from conveyor.errors import BlobError, BlobTooLarge

CHUNK_SIZE = 1024 * 1024
"""Read and write blobs in 1 MiB pieces."""

_DIGEST = re.compile(r"[0-9a-f]{64}")


def is_digest(value: object) -> bool:
    """True if ``value`` is a lowercase hex sha256 digest (exactly 64 chars)."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def check_digest(digest: str) -> str:
    """Return ``digest`` unchanged, or raise BlobError if it is not a sha256 digest.

    Stores build paths and keys from digests, so this must run before any use.
    """
    if not is_digest(digest):
        raise BlobError(f"not a sha256 digest: {digest!r} (expected 64 lowercase hex characters)")
    return digest


def sha256_hex(data: bytes) -> str:
    """The lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def copy_hashed(chunks: Iterable[bytes], write: Callable[[bytes], object]) -> tuple[str, int]:
    """Feed each chunk to ``write`` while hashing it; return (digest, size)."""
    hasher = hashlib.sha256()
    size = 0
    for chunk in chunks:
        hasher.update(chunk)
        write(chunk)
        size += len(chunk)
    return hasher.hexdigest(), size


def read_chunks(stream: BinaryIO, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Yield ``stream``'s bytes in pieces of at most ``chunk_size``."""
    while chunk := stream.read(chunk_size):
        yield chunk


def check_size(digest: str, size: int, max_bytes: int | None) -> None:
    """Raise BlobTooLarge if a blob of ``size`` bytes is over ``max_bytes`` (None: no limit)."""
    if max_bytes is not None and size > max_bytes:
        raise BlobTooLarge(f"blob {digest} is over the read limit of {max_bytes:,} bytes")


def read_limited(stream: BinaryIO, digest: str, max_bytes: int | None) -> bytes:
    """Read ``stream`` to its end, or one byte past ``max_bytes`` and raise BlobTooLarge."""
    data = stream.read() if max_bytes is None else stream.read(max_bytes + 1)
    check_size(digest, len(data), max_bytes)
    return data
