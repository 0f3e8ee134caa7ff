"""Request bodies into the blob store, streamed: never held whole, never past the size limit.

A body is read chunk by chunk in a worker thread (``anyio.from_thread``), hashed as it is written to the
blob store's own temporary folder, and renamed to its digest; a document of at most 8 KiB stays in memory
and is stored inline. Past the limit, reading stops and the request is answered 413 (at once when its
Content-Length says so). A multipart upload's file part goes the same way; its file name is never used
as a path. The form's other fields are few and small: at most 16, of 64 KiB each, with 8 KiB of headers a part.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import anyio.from_thread
from fastapi import Request
from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header

from conveyor.blobs import Blobs
from conveyor.errors import TooLarge, UserError
from conveyor.runtime.values import INLINE_MAX

MAX_FIELD = 64 * 1024  # a multipart form field other than the document
MAX_FIELDS = 16  # form fields besides the document: the options are five
MAX_PART_HEADERS = 8 * 1024  # the header lines of one part
FILE_FIELDS = ("file", "document")


@dataclass
class Stored:
    """A stored body: its digest and size, and its bytes when they are small enough to keep inline."""

    digest: str
    size: int
    data: bytes | None


@dataclass
class Form:
    """A multipart upload: the document (stored) and the other fields, as text."""

    document: Stored | None = None
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None


def check_length(request: Request, limit: int) -> None:
    """413 at once when the declared length is over ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is {int(declared):,} bytes; this server takes at most {limit:,}")


def body_chunks(request: Request, limit: int) -> Iterator[bytes]:
    """The request's body, chunk by chunk, in a worker thread; TooLarge once more than ``limit`` bytes came."""
    stream: AsyncIterator[bytes] = request.stream().__aiter__()

    async def following() -> bytes:
        return await stream.__anext__()

    total = 0
    while True:
        try:
            chunk: bytes = anyio.from_thread.run(following)
        except StopAsyncIteration:
            return
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"the body is over {limit:,} bytes, the most this server takes")
        if chunk:
            yield chunk


def store_stream(blobs: Blobs, chunks: Iterator[bytes]) -> Stored:
    """Keep a stream of at most INLINE_MAX bytes in memory; store a longer one in the blob store."""
    head = bytearray()
    for chunk in chunks:
        head += chunk
        if len(head) > INLINE_MAX:
            digest, size = blobs.put_stream(itertools.chain([bytes(head)], chunks))
            return Stored(digest, size, None)
    return kept(bytes(head))


async def read_small(request: Request, limit: int) -> bytes:
    """A body that must be small (JSON), read on the event loop, whole, up to ``limit`` bytes."""
    out = bytearray()
    async for chunk in request.stream():
        out += chunk
        if len(out) > limit:
            raise TooLarge(f"the JSON body is over {limit:,} bytes; send a large document as multipart/form-data")
    return bytes(out)


def kept(data: bytes) -> Stored:
    """Bytes small enough to keep inline: hashed, not stored."""
    return Stored(hashlib.sha256(data).hexdigest(), len(data), data)


def read_form(request: Request, blobs: Blobs, limit: int) -> Form:
    """Parse a multipart body as it streams: the part named ``file`` (or ``document``) into the blob store,
    every other part as a small text field."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise UserError("a multipart body needs Content-Type: multipart/form-data; boundary=...")
    return _FormReader(boundary, blobs).read(body_chunks(request, limit))


class _FormReader:
    def __init__(self, boundary: bytes, blobs: Blobs) -> None:
        self.blobs, self.form = blobs, Form()
        self.pending: list[bytes] = []  # the document's bytes parsed from the last chunk
        self.header_name, self.header_value = b"", b""
        self.headers: dict[bytes, bytes] = {}
        self.header_bytes = 0
        self.fields = 0
        self.name: str | None = None
        self.buffer = bytearray()
        self.in_file = False
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._begin, "on_part_data": self._data, "on_part_end": self._end,
            "on_header_field": self._header_field, "on_header_value": self._header_value,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_done})

    def read(self, chunks: Iterator[bytes]) -> Form:
        document = self._document(chunks)
        stored = None
        for first in document:  # the document part began: store it while the rest streams
            stored = store_stream(self.blobs, itertools.chain([first], document))
        if stored is None and self.form.filename is not None:  # an empty file part
            stored = store_stream(self.blobs, iter([b""]))
        self.form.document = stored
        return self.form

    def _document(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """Feed the parser; yield the document part's bytes as they are parsed."""
        try:
            for chunk in chunks:
                self.parser.write(chunk)
                while self.pending:
                    yield self.pending.pop(0)
            self.parser.finalize()
        except MultipartParseError as exc:
            raise UserError(f"the body is not valid multipart/form-data ({exc}); send the document in a part "
                            "named 'file'") from None
        while self.pending:
            yield self.pending.pop(0)

    def _begin(self) -> None:
        self.headers, self.name, self.buffer, self.header_bytes = {}, None, bytearray(), 0

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self.header_name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self.header_value += data[start:end]

    def _count_header(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > MAX_PART_HEADERS:
            raise TooLarge(f"a multipart part's headers are over {MAX_PART_HEADERS:,} bytes")

    def _header_end(self) -> None:
        self.headers[self.header_name.lower()] = self.header_value
        self.header_name, self.header_value = b"", b""

    def _headers_done(self) -> None:
        _, params = parse_options_header(self.headers.get(b"content-disposition", b""))
        self.name = params.get(b"name", b"").decode("utf-8", "replace")
        if self.name in FILE_FIELDS:
            if self.form.filename is not None:
                raise UserError("send one document per job (two file parts came)")
            self.in_file = True
            self.form.filename = params.get(b"filename", b"").decode("utf-8", "replace")
            return
        self.fields += 1
        if self.fields > MAX_FIELDS:
            raise TooLarge(f"the form has more than {MAX_FIELDS} fields besides the document; send only the options "
                           "the endpoint takes")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self.in_file:
            self.pending.append(bytes(data[start:end]))
            return
        self.buffer += data[start:end]
        if len(self.buffer) > MAX_FIELD:
            raise TooLarge(f"form field {self.name!r} is over {MAX_FIELD:,} bytes")

    def _end(self) -> None:
        if self.in_file:
            self.in_file = False
            return
        if self.name:
            self.form.fields[self.name] = self.buffer.decode("utf-8", "replace")
