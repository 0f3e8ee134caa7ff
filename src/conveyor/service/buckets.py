"""Items from an S3 prefix (``--input s3://bucket/prefix/``): each object below it, as a folder's files are.

The listing streams (boto3's ``list_objects_v2`` paginator, a page of keys at a time, never the whole listing),
in S3's order (by key, UTF-8 bytes). An item's key is its object key relative to the prefix, made printable and
unambiguous as folder keys are (``printable_name``); an object whose key ends in ``/`` is a folder marker, not an
item. Objects are read when the submission stores them, a few at a time; one that cannot be read then (gone,
refused) ends ``failed`` with ``bad_input`` (``strict``: the submission is refused), and one larger than every
root stage accepts (``max_input_bytes``) is not read at all (service/submit.py ``source_ref``). The endpoint,
region and credentials are the S3 blob store's (blobs/s3client.py: ``CONVEYOR_S3_ENDPOINT``, the AWS variables).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from conveyor.blobs.s3client import S3Settings, error_code, make_client, s3_errors, valid_bucket
from conveyor.errors import InputError
from conveyor.service.inputs import S3_INPUT, SourceItem, _fit, printable_name

CHUNK = 1 << 20
_GONE = {"NoSuchKey", "404", "NotFound", "AccessDenied", "403", "Forbidden", "InvalidObjectState"}


@dataclass(frozen=True)
class S3Prefix:
    """A bucket and a key prefix ("" or ending in "/") to list, with the client that reads them."""

    bucket: str
    prefix: str
    settings: S3Settings
    client: Any

    @property
    def url(self) -> str:
        return f"{S3_INPUT}{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class S3Object:
    """One object of a listed prefix: an item's remote source (inputs.RemoteSource)."""

    where: S3Prefix
    key: str
    size: int
    version: str  # its ETag: changes with its bytes

    @property
    def url(self) -> str:
        return f"{S3_INPUT}{self.where.bucket}/{self.key}"

    def chunks(self) -> Iterator[bytes]:
        """The object's bytes, streamed; OSError when it is gone or refused (the item ends bad_input)."""
        from botocore.exceptions import ClientError

        with s3_errors("read", self.url, self.where.settings):
            try:
                body = self.where.client.get_object(Bucket=self.where.bucket, Key=self.key)["Body"]
            except ClientError as exc:
                if error_code(exc) in _GONE:
                    raise OSError(f"S3 answered {error_code(exc)}") from None
                raise
            try:
                yield from body.iter_chunks(CHUNK)
            finally:
                body.close()


def open_prefix(url: str) -> S3Prefix:
    """The prefix ``s3://bucket/prefix/`` names (a prefix without its final ``/`` is taken as a folder), with a
    client; a one-line InputError for a URL that names no bucket or when boto3 is not installed."""
    bucket, _, prefix = url.removeprefix(S3_INPUT).partition("/")
    if not valid_bucket(bucket):
        raise InputError(f"--input {url!r} names no valid S3 bucket (3-63 lowercase letters, digits, dots and "
                         "hyphens); use s3://BUCKET/PREFIX/")
    if importlib.util.find_spec("boto3") is None:
        raise InputError(f"--input {url} needs boto3: pip install 'conveyor[s3]'")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    settings = S3Settings.from_env()
    return S3Prefix(bucket, prefix, settings, make_client(settings))


def check_prefix(url: str) -> None:
    """Refuse, before anything is created, a prefix whose bucket cannot be listed (one line that says why)."""
    from botocore.exceptions import ClientError

    where = open_prefix(url)
    with s3_errors("list", where.url, where.settings):
        try:
            where.client.list_objects_v2(Bucket=where.bucket, Prefix=where.prefix, MaxKeys=1)
        except ClientError as exc:
            if error_code(exc) == "NoSuchBucket":
                raise InputError(f"--input {url}: the bucket {where.bucket!r} does not exist at "
                                 f"{where.settings.where}; check its name (and CONVEYOR_S3_ENDPOINT)") from None
            raise


def prefix_items(url: str, strict: bool = False) -> Iterator[SourceItem]:
    """Each object below the prefix as an item, streamed a page of the listing at a time. ``strict`` is for the
    reads (service/submit.py): listing errors always stop the submission."""
    where = open_prefix(url)
    pages = where.client.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.prefix)
    with s3_errors("list", where.url, where.settings):
        for page in pages:
            for entry in page.get("Contents", ()):
                key: str = entry["Key"]
                relative = key[len(where.prefix):]
                if not relative or key.endswith("/"):  # a folder marker: a console's "Create folder"
                    continue
                remote = S3Object(where, key, int(entry["Size"]), str(entry.get("ETag", "")))
                yield SourceItem(_fit(printable_name(relative.encode("utf-8", "surrogateescape"))), remote=remote)
