"""Content-addressed blob storage: pick a backend from a ``--blobs`` URL."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from urllib.parse import urlsplit

from conveyor.blobs.base import Blobs
from conveyor.blobs.digest import is_digest
from conveyor.blobs.filesystem import FilesystemBlobs
from conveyor.blobs.memory import MemoryBlobs
from conveyor.blobs.s3 import S3Blobs
from conveyor.blobs.s3client import S3Settings, parse_s3_url
from conveyor.errors import UrlError

__all__ = ["Blobs", "FilesystemBlobs", "MemoryBlobs", "S3Blobs", "S3Settings", "is_digest", "open_blobs"]

# Two or more letters, so a Windows drive ("C:\blobs") reads as a path, not a scheme.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")
_ACCEPTED = "use a folder path, file:///abs/path, file:relative/path, s3://BUCKET/PREFIX or memory://"


def open_blobs(url: str) -> Blobs:
    """Open the blob store named by ``url``: a folder path, ``file:`` URL, ``s3://BUCKET/PREFIX`` or ``memory://``.

    An S3 store takes its endpoint from ``CONVEYOR_S3_ENDPOINT`` and its region and credentials from
    the usual AWS variables (see ``S3Settings.from_env``); nothing is contacted until it is used.
    """
    if not url:
        raise UrlError(f"empty blob store URL; {_ACCEPTED}")
    match = _SCHEME.match(url)
    if match is None:
        return _folder(Path(url))
    scheme, rest = match.group(1).lower(), url[match.end() :]
    if scheme == "file":
        return _folder(_file_url_path(url, rest))
    if scheme == "memory" and rest == "//":
        return MemoryBlobs()
    if scheme == "s3":
        return _bucket(url)
    raise UrlError(f"unsupported blob store URL {url!r}; {_ACCEPTED}")


def _file_url_path(url: str, rest: str) -> Path:
    """The path in ``file:relative/path``, ``file:/abs/path`` or ``file:///abs/path``."""
    if not rest.startswith("//"):
        if not rest:
            raise UrlError(f"blob store URL {url!r} has no path; {_ACCEPTED}")
        return Path(rest)
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise UrlError(f"blob store URL {url!r} names a remote host; {_ACCEPTED}")
    if parts.query or parts.fragment or not parts.path:
        raise UrlError(f"blob store URL {url!r} is not a plain file URL; {_ACCEPTED}")
    from urllib.request import url2pathname  # here: urllib.request costs every command 13 ms to import

    return Path(url2pathname(parts.path))


def _folder(root: Path) -> FilesystemBlobs:
    if root.exists() and not root.is_dir():
        raise UrlError(f"blob store path {root} exists but is not a folder")
    return FilesystemBlobs(root)


def _bucket(url: str) -> S3Blobs:
    bucket, prefix = parse_s3_url(url)
    if importlib.util.find_spec("boto3") is None:
        raise UrlError(f"blob store URL {url!r} needs boto3: pip install 'conveyor[s3]'")
    return S3Blobs(bucket, prefix, S3Settings.from_env())
