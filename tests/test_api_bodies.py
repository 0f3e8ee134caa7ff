"""Refuse before reading: a body is taken only from a caller its route accepts, and only up to its route's limit,
counted as it streams. The app is driven through httpx's ASGI transport, which hands the app a request body only
when the app asks for it, so each test can count how much of a body the server ever pulled."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi import FastAPI

from conveyor.api import ApiSettings, create_app
from conveyor.api.settings import MAX_JSON
from conveyor.service.dashboard import MAX_PAGE
from tests.apiserver import SMALL_PIPELINE, make_token
from tests.helpers import write_pipeline

MiB = 1 << 20


class Body:
    """A request body of ``size`` bytes made a chunk at a time, counting how much of it was pulled."""

    def __init__(self, size: int, head: bytes = b"", chunk: int = MiB) -> None:
        self.size, self.head, self.chunk = size, head, chunk
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.head:
            self.pulled += len(self.head)
            yield self.head
        sent = len(self.head)
        block = b"x" * self.chunk
        while sent < self.size:
            part = block[: self.size - sent]
            sent += len(part)
            self.pulled += len(part)
            yield part


def fields(count: int, size: int = 10) -> Iterator[bytes]:
    for i in range(count):
        yield (f'--b\r\nContent-Disposition: form-data; name="f{i}"\r\n\r\n'.encode() + b"v" * size + b"\r\n")


class Many:
    """A multipart body of ``count`` small fields, made as it is pulled."""

    def __init__(self, count: int, size: int = 10) -> None:
        self.count, self.size, self.pulled = count, size, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in fields(self.count, self.size):
            self.pulled += len(part)
            yield part
        yield b"--b--\r\n"


@pytest.fixture
def app(tmp_path: Path, store_url: str) -> Iterator[FastAPI]:
    settings = ApiSettings(db=store_url, blobs=str(tmp_path / "blobs"),
                           pipelines=(write_pipeline(tmp_path, SMALL_PIPELINE),), relay=False)
    made = create_app(settings)
    yield made
    made.state.services.close()


def run(app: FastAPI, test: Callable[[httpx.AsyncClient], Awaitable[None]], token: str | None = None) -> None:
    async def main() -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                     headers=headers, timeout=60) as client:
            await test(client)

    anyio.run(main)


def token_of(store_url: str, tenant: str = "acme", operator: bool = False) -> str:
    made: str = make_token(store_url, tenant, operator)["token"]
    return made


def test_a_large_body_without_a_token_is_refused_before_a_byte_is_read(app: FastAPI) -> None:
    async def test(c: httpx.AsyncClient) -> None:
        streamed = Body(200 * MiB)  # chunked: no Content-Length to go by
        answer = await c.post("/v1/replays", content=streamed, headers={"Content-Type": "application/json"})
        assert answer.status_code == 401 and answer.json()["code"] == "unauthorized"
        assert answer.headers["content-type"] == "application/problem+json"
        assert streamed.pulled == 0
        wrong = Body(200 * MiB)
        answer = await c.post("/v1/jobs", content=wrong, headers={"Authorization": "Bearer cvy_nope",
                                                                  "Content-Type": "multipart/form-data; boundary=b"})
        assert answer.status_code == 401 and wrong.pulled == 0
        page = Body(50 * MiB)  # a dashboard form without a session: to the login page, unread
        answer = await c.post("/reviews/1/reject", content=page,
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
        assert page.pulled == 0
        # What carries no body is served as before: public pages, and the route's own 401.
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/openapi.json")).status_code == 200
        assert (await c.post("/v1/replays")).status_code == 401

    run(app, test)


def test_a_revoked_token_is_refused_before_its_body_is_read(app: FastAPI, store_url: str) -> None:
    from conveyor.service.tokens import revoke_token
    from conveyor.store import open_store

    token = token_of(store_url)
    store = open_store(store_url)
    try:
        revoke_token(store, token)
    finally:
        store.close()

    async def test(c: httpx.AsyncClient) -> None:
        body = Body(20 * MiB)
        answer = await c.post("/v1/replays", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 403 and answer.json()["code"] == "forbidden" and body.pulled == 0

    run(app, test, token)


def test_a_json_body_over_16_mib_is_413_without_being_read_whole(app: FastAPI, store_url: str) -> None:
    async def test(c: httpx.AsyncClient) -> None:
        declared = Body(200 * MiB)
        answer = await c.post("/v1/replays", content=declared, headers={
            "Content-Type": "application/json", "Content-Length": str(200 * MiB)})
        problem = answer.json()
        assert answer.status_code == 413 and problem["code"] == "too_large" and declared.pulled == 0
        assert "\n" not in problem["detail"] and f"{MAX_JSON:,}" in problem["detail"]
        streamed = Body(200 * MiB)  # chunked: refused as soon as the count passes 16 MiB
        answer = await c.post("/v1/replays", content=streamed, headers={"Content-Type": "application/json"})
        assert answer.status_code == 413 and answer.json()["code"] == "too_large"
        assert streamed.pulled <= MAX_JSON + MiB
        job = Body(40 * MiB, head=b'{"text": "')  # a JSON job: 16 MiB too, whatever --max-upload-bytes says
        answer = await c.post("/v1/jobs", content=job, headers={"Content-Type": "application/json"})
        assert answer.status_code == 413 and "multipart" in answer.json()["detail"]
        assert job.pulled <= MAX_JSON + MiB
        small = await c.post("/v1/replays", json={"reason": "retry", "runs": ["r-none"], "dry_run": True})
        assert small.status_code in (200, 404), small.text  # a body under the limit is read and answered

    run(app, test, token_of(store_url, operator=True))


def test_a_multipart_upload_with_too_many_or_too_large_fields_is_refused(app: FastAPI, store_url: str) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("form parsing does not depend on the backend")
    kind = {"Content-Type": "multipart/form-data; boundary=b"}

    async def test(c: httpx.AsyncClient) -> None:
        many = Many(300_000)  # ~20 MB of ten-byte fields
        answer = await c.post("/v1/jobs", content=many, headers=kind)
        assert answer.status_code == 413 and "more than 16 fields" in answer.json()["detail"]
        assert many.pulled < MiB
        big = Body(5 * MiB, head=b'--b\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n')
        answer = await c.post("/v1/jobs", content=big, headers=kind)
        assert answer.status_code == 413 and "form field 'metadata' is over 65,536 bytes" in answer.json()["detail"]
        assert big.pulled < 2 * MiB
        padded = b"".join(b"X-Pad-%d: " % i + b"p" * 3000 + b"\r\n" for i in range(4))  # lines under 4 KiB each
        header = Body(5 * MiB, head=b'--b\r\nContent-Disposition: form-data; name="x"\r\n' + padded)
        answer = await c.post("/v1/batches", content=header, headers=kind)
        assert answer.status_code == 413 and "headers are over 8,192 bytes" in answer.json()["detail"]
        assert header.pulled < 2 * MiB
        fine = await c.post("/v1/jobs", files={"file": ("a.txt", b"hello")}, data={"lane": "bulk", "key": "k"})
        assert fine.status_code == 202, fine.text  # a form with its few fields is taken as before

    run(app, test, token_of(store_url))


def test_a_dashboard_form_is_bounded_in_fields_files_and_size(app: FastAPI, store_url: str) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("form parsing does not depend on the backend")

    async def test(c: httpx.AsyncClient) -> None:
        # A form holds a handful of fields and one per review entry of a page (a selection): no more.
        many = await c.post("/reviews/1/reject", data={f"f{i}": "v" for i in range(16 + MAX_PAGE + 1)})
        assert many.status_code == 400 and "Too many fields" in many.text
        filed = await c.post("/reviews/1/reject", files={"f": ("a.txt", b"x")}, data={"why": "no"})
        assert filed.status_code == 400 and "Too many files" in filed.text
        large = Body(100 * MiB, head=b"why=")
        answer = await c.post("/reviews/1/reject", content=large,
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert answer.status_code == 413 and "16,777,216" in answer.text and large.pulled <= MAX_JSON + MiB
        assert answer.headers["content-type"].startswith("text/html")  # a page, as the dashboard answers

    run(app, test, token_of(store_url, operator=True))


def test_the_login_form_needs_its_csrf_value_and_cookie(app: FastAPI, store_url: str) -> None:
    token = token_of(store_url)

    async def test(c: httpx.AsyncClient) -> None:
        bare = await c.post("/login", data={"token": token, "next": "/"})
        assert bare.status_code == 403 and "check failed" in bare.text and "conveyor_session" not in c.cookies
        form = await c.get("/login")
        value = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
        assert value and "conveyor_login" in c.cookies
        held = list(c.cookies.jar)
        c.cookies.clear()  # the value without its cookie: what a page of another site can send
        alone = await c.post("/login", data={"token": token, "csrf": value.group(1)})
        assert alone.status_code == 403 and "conveyor_session" not in c.cookies
        c.cookies.clear()
        for cookie in held:
            c.cookies.jar.set_cookie(cookie)
        paired = await c.post("/login", data={"token": token, "csrf": value.group(1), "next": "/reviews"})
        assert paired.status_code == 303 and paired.headers["location"] == "/reviews"
        assert "conveyor_session" in c.cookies
        huge = Body(10 * MiB, head=b"token=")  # the login form takes a body from anyone: a small one
        answer = await c.post("/login", content=huge, headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert answer.status_code == 413 and huge.pulled <= 64 * 1024 + MiB

    run(app, test)
