"""Blobs in a local folder, laid out as ``root/ab/cd/<digest>``."""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from conveyor.blobs.digest import check_digest, copy_hashed, read_chunks, read_limited, sha256_hex
from conveyor.errors import BlobCorrupt, BlobNotFound, BlobUnwritable

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
STALE_TEMP_S = 24 * 3600
"""A put's temp file untouched this long was left by a process killed mid-put (a put writes to it at least once
per MiB read); ``check_writable`` removes such files."""


class FilesystemBlobs:
    """Content-addressed blobs under ``root``; writes are atomic and fsynced.

    Each put goes to a temp file in ``root/tmp/``, is hashed while written,
    fsynced, then renamed to ``root/<d[0:2]>/<d[2:4]>/<d>``. Folders are made lazily.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()

    def check_writable(self) -> None:
        """Make the folder now (not at the first large input) and say plainly when it cannot be written; remove
        the temp files that killed processes left (``sweep_temp``)."""
        try:
            _make_dirs(self.root / "tmp")
            probe = self._new_temp_path()
            probe.write_bytes(b"")
            written = probe.stat().st_mtime  # the clock the folder's files are stamped by, not this process's
            probe.unlink()
        except OSError as exc:
            raise BlobUnwritable(f"cannot write to the blob store {self.root}: {exc.strerror}; "
                                 "choose a writable folder with --blobs") from None
        self.sweep_temp(written)

    def sweep_temp(self, now: float | None = None) -> int:
        """Remove the puts' temp files untouched for STALE_TEMP_S before ``now`` (a live put's is never that old;
        default: this process's clock); return how many. A file another process removes first, or cannot be
        removed, is passed over."""
        cutoff = (time.time() if now is None else now) - STALE_TEMP_S
        removed = 0
        try:
            entries = list(os.scandir(self.root / "tmp"))
        except OSError:
            return 0
        for entry in entries:
            if not (entry.name.startswith("put-") and entry.name.endswith(".tmp")):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue
        return removed

    def put(self, data: bytes) -> str:
        """Store ``data``; return its digest."""
        digest, _ = self.put_stream([data])
        return digest

    def put_stream(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Store a stream chunk by chunk; return (digest, size)."""
        try:
            tmp = self._new_temp_path()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except OSError as exc:
            raise BlobUnwritable(f"cannot write to the blob store {self.root}: {exc.strerror}; "
                                 "choose a writable folder with --blobs") from None
        try:
            with os.fdopen(fd, "wb") as out:
                digest, size = copy_hashed(chunks, out.write)
                out.flush()
                os.fsync(out.fileno())
            self._commit(tmp, digest)
        except OSError as exc:
            if exc.errno in _FULL:  # the store's disk, not the source, refused
                raise BlobUnwritable(f"cannot write to the blob store {self.root}: {exc.strerror}; free space or "
                                     "choose another folder with --blobs") from None
            raise
        finally:
            # After a successful commit the temp name is gone; otherwise drop it.
            tmp.unlink(missing_ok=True)
        return digest, size

    def put_file(self, path: Path) -> tuple[str, int]:
        """Store a file's bytes, read in 1 MiB chunks; return (digest, size)."""
        with Path(path).open("rb") as src:
            return self.put_stream(read_chunks(src))

    def get(self, digest: str, max_bytes: int | None = None) -> bytes:
        """Return the blob's bytes after checking they still hash to ``digest``."""
        path = self.path_for(digest)
        try:
            with path.open("rb") as src:
                data = read_limited(src, digest, max_bytes)
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {digest} in {self.url}") from None
        actual = sha256_hex(data)
        if actual != digest:
            raise BlobCorrupt(f"blob {digest} is corrupt: {path} now hashes to {actual}")
        return data

    def exists(self, digest: str) -> bool:
        """True if a blob is stored under ``digest``."""
        return self.path_for(digest).is_file()

    def size(self, digest: str) -> int:
        """Size in bytes, from a stat call."""
        try:
            return self.path_for(digest).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {digest} in {self.url}") from None

    def path_for(self, digest: str) -> Path:
        """Where the blob ``digest`` lives; raise BlobError for a non-digest."""
        check_digest(digest)
        return self.root / digest[0:2] / digest[2:4] / digest

    def _new_temp_path(self) -> Path:
        tmp_dir = self.root / "tmp"
        _make_dirs(tmp_dir)
        return tmp_dir / f"put-{secrets.token_hex(8)}.tmp"

    def _commit(self, tmp: Path, digest: str) -> None:
        """Move a fully written temp file into place, unless the blob is already there."""
        final = self.path_for(digest)
        if final.exists():
            return
        _make_dirs(final.parent)
        os.replace(tmp, final)
        _fsync_dir(final.parent)


def _make_dirs(path: Path) -> None:
    """Create ``path`` and missing parents, fsyncing each parent that gained an entry."""
    if path.is_dir():
        return
    _make_dirs(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        if path.is_dir():
            return  # another writer made it first
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Make a folder's entries durable; a no-op where folders cannot be fsynced."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
