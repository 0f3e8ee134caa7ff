"""The boto3 side of the S3 blob store: where it connects, how it retries, what its errors mean.

boto3 is imported here only when a client is made, so opening a folder store never pays for it.
Endpoint, region and credentials come from the environment (see ``S3Settings.from_env``);
credentials are resolved by boto3's own chain and never kept on the store object.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from conveyor.errors import BlobUnavailable, ConveyorError, UrlError

ENDPOINT_VAR = "CONVEYOR_S3_ENDPOINT"
"""The S3 endpoint URL (for SeaweedFS, MinIO and other S3-compatible servers); AWS when unset."""

MAX_ATTEMPTS = 8
"""Tries per request under botocore's ``standard`` retry mode (throttling, 5xx, dropped connections)."""

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"}
_CREDENTIALS = "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


@dataclass(frozen=True)
class S3Settings:
    """Where the store connects; plain data, so a store pickles into a worker process."""

    endpoint: str | None = None
    region: str | None = None
    max_attempts: int = MAX_ATTEMPTS
    connect_timeout: float = 5.0

    @classmethod
    def from_env(cls) -> S3Settings:
        """``CONVEYOR_S3_ENDPOINT`` (else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL), AWS_REGION or
        AWS_DEFAULT_REGION, and AWS_MAX_ATTEMPTS (tries per request, 8 when unset)."""
        endpoint = next((os.environ[v] for v in (ENDPOINT_VAR, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
                         if os.environ.get(v)), None)
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
        return cls(endpoint, region, _attempts(os.environ.get("AWS_MAX_ATTEMPTS")))

    @property
    def where(self) -> str:
        return self.endpoint or "AWS S3"


def _attempts(raw: str | None) -> int:
    if not raw:
        return MAX_ATTEMPTS
    if not raw.strip().isdigit() or int(raw) < 1:
        raise UrlError(f"AWS_MAX_ATTEMPTS={raw!r} is not a whole number of tries (1 or more); set it so or unset it")
    return int(raw)


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket`` or ``s3://bucket/some/prefix``; UrlError otherwise."""
    rest = url[len("s3:"):]
    if not rest.startswith("//") or "?" in rest or "#" in rest:
        raise UrlError(f"blob store URL {url!r} is not s3://BUCKET/PREFIX")
    bucket, _, prefix = rest[2:].partition("/")
    prefix = prefix.strip("/")
    if not valid_bucket(bucket):
        raise UrlError(f"blob store URL {url!r} names no valid S3 bucket (3-63 lowercase letters, digits, "
                       "dots and hyphens); use s3://BUCKET/PREFIX")
    if prefix and (not _PREFIX.fullmatch(prefix) or ".." in prefix.split("/")):
        raise UrlError(f"blob store URL {url!r} has an unusable key prefix; use letters, digits, '.', '_', '-' "
                       "and '/' between parts")
    return bucket, prefix


def valid_bucket(name: str) -> bool:
    """Whether ``name`` can name an S3 bucket (3-63 lowercase letters, digits, dots and hyphens)."""
    return _BUCKET.fullmatch(name) is not None


def make_client(settings: S3Settings, max_attempts: int | None = None) -> Any:
    """A new S3 client; each process (and each store) makes its own, since clients do not survive a fork."""
    import boto3.session
    from botocore.config import Config

    session = boto3.session.Session()  # the default session is shared state; a client of its own is thread-safe
    config = Config(retries={"mode": "standard", "total_max_attempts": max_attempts or settings.max_attempts},
                    connect_timeout=settings.connect_timeout, read_timeout=60, max_pool_connections=32,
                    s3={"addressing_style": "path"} if settings.endpoint else {})
    return session.client("s3", endpoint_url=settings.endpoint, config=config,
                          region_name=settings.region or session.region_name or "us-east-1")


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError ("NoSuchKey", "404", ...), else ""."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


@contextmanager
def s3_errors(what: str, url: str, settings: S3Settings) -> Iterator[None]:
    """Turn what boto3 raises into BlobUnavailable, one line that says what to check."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    try:
        yield
    except ConveyorError:
        raise
    except NoCredentialsError:
        raise BlobUnavailable(f"no AWS credentials to {what} in {url}; {_CREDENTIALS}") from None
    except (ConnectionError, ReadTimeoutError) as exc:
        raise BlobUnavailable(f"cannot reach the S3 endpoint {settings.where} to {what} in {url} ({_line(exc)}); "
                              f"check {ENDPOINT_VAR} and that the server is up") from None
    except (ClientError, BotoCoreError, Boto3Error) as exc:
        raise BlobUnavailable(_refusal(what, url, settings, exc)) from None


def _refusal(what: str, url: str, settings: S3Settings, exc: BaseException) -> str:
    code = error_code(exc) or _wrapped_code(exc)
    if code == "NoSuchBucket":
        return (f"the S3 bucket of {url} does not exist at {settings.where}; create it, or name another "
                "with --blobs s3://BUCKET/PREFIX")
    if code in _DENIED:
        return f"S3 at {settings.where} refused to {what} in {url} ({code}); {_CREDENTIALS}"
    return f"S3 at {settings.where} could not {what} in {url}: {_line(exc)}"


def _wrapped_code(exc: BaseException) -> str:
    """boto3's upload errors carry the S3 code only in their text: "... (NoSuchBucket) ..."."""
    found = re.search(r"\(([A-Za-z0-9]+)\)", str(exc))
    return found.group(1) if found else ""


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
