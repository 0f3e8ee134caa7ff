"""The provider simulator's Batch API: ``/v1/files`` (upload, retrieve, content) and ``/v1/batches`` (create,
retrieve, list, cancel), shaped as OpenAI's so the ``openai`` SDK reads them.

A batch is answered ``batch_delay_s`` after it is created (progress is read lazily, on a retrieve or list):
each entry as ``/v1/chat/completions`` would answer it, except that a share ``batch_failure_rate`` of entries
fail (HTTP 500 in the error file) and a share ``batch_expired_rate`` are left unanswered, in which case the
batch ends ``expired`` and those entries are in the error file with code ``batch_expired``. The answer to a
creation can be held ``batch_create_delay_s`` (the batch exists and is listed meanwhile: a creator killed
then never learns its id). Draws come from
a generator of their own (seed + 1), so batches leave the direct requests' faults as they were.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from conveyor.providers.simrequests import Record, chat_payload, parse_chat

ENDPOINTS = ("/v1/chat/completions",)


@dataclass
class _Batch:
    body: dict[str, Any]
    done_at: float
    lines: list[dict[str, Any]]
    counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})


class SimBatches:
    """Files and batches of one simulator app."""

    def __init__(self, seed: int, delay_s: float, failure_rate: float, expired_rate: float, revision: str,
                 default_max_tokens: int, served: Any, create_delay_s: float = 0.0) -> None:
        self.rng = random.Random(seed + 1)
        self.create_delay_s = create_delay_s
        self.delay_s, self.failure_rate, self.expired_rate = delay_s, failure_rate, expired_rate
        self.revision, self.default_max_tokens, self.served = revision, default_max_tokens, served
        self.files: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.batches: dict[str, _Batch] = {}

    def add_file(self, name: str, purpose: str, data: bytes) -> dict[str, Any]:
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        meta = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": name, "purpose": purpose, "status": "processed", "status_details": None}
        self.files[file_id] = (meta, data)
        return meta

    def create(self, body: dict[str, Any]) -> dict[str, Any] | str:
        file = self.files.get(str(body.get("input_file_id")))
        if file is None:
            return "input_file_id does not name an uploaded file"
        if body.get("endpoint") not in ENDPOINTS:
            return f"endpoint must be one of {', '.join(ENDPOINTS)}"
        if body.get("completion_window") != "24h":
            return "completion_window must be 24h"
        try:
            lines = [json.loads(raw) for raw in file[1].decode().splitlines() if raw.strip()]
        except ValueError:
            return "the input file is not JSONL"
        now = time.time()
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        record = {"id": batch_id, "object": "batch", "endpoint": body["endpoint"], "errors": None,
                  "input_file_id": body["input_file_id"], "completion_window": "24h", "status": "in_progress",
                  "output_file_id": None, "error_file_id": None, "created_at": int(now), "in_progress_at": int(now),
                  "expires_at": int(now + 86400), "completed_at": None, "failed_at": None, "expired_at": None,
                  "cancelled_at": None, "metadata": body.get("metadata") or None,
                  "request_counts": {"total": len(lines), "completed": 0, "failed": 0}}
        self.batches[batch_id] = _Batch(record, now + self.delay_s, lines)
        return record

    def get(self, batch_id: str) -> dict[str, Any] | None:
        batch = self.batches.get(batch_id)
        if batch is None:
            return None
        if batch.body["status"] == "in_progress" and time.time() >= batch.done_at:
            self._finish(batch)
        return batch.body

    def cancel(self, batch_id: str) -> dict[str, Any] | None:
        batch = self.batches.get(batch_id)
        if batch is None:
            return None
        if batch.body["status"] == "in_progress":
            batch.body.update(status="cancelled", cancelled_at=int(time.time()))
        return batch.body

    def _finish(self, batch: _Batch) -> None:
        out: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        expired = 0
        for line in batch.lines:
            custom_id = line.get("custom_id")
            if self.rng.random() < self.expired_rate:
                errors.append({"id": f"batch_req_{uuid.uuid4().hex[:12]}", "custom_id": custom_id, "response": None,
                               "error": {"code": "batch_expired",
                                         "message": "This request could not be executed before the completion "
                                                    "window expired."}})
                expired += 1
                continue
            status, answer = self._answer(line.get("body") or {})
            if self.rng.random() < self.failure_rate:
                status, answer = 500, {"error": {"message": "The server had an error while processing your "
                                                            "request.", "type": "server_error", "param": None,
                                                 "code": None}}
            entry = {"id": f"batch_req_{uuid.uuid4().hex[:12]}", "custom_id": custom_id,
                     "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": answer},
                     "error": None}
            (out if status == 200 else errors).append(entry)
        now = int(time.time())
        body = batch.body
        if out:
            body["output_file_id"] = self._jsonl(out, body["id"], "output")
        if errors:
            body["error_file_id"] = self._jsonl(errors, body["id"], "error")
        body["request_counts"] = {"total": len(batch.lines), "completed": len(out), "failed": len(errors)}
        body["status"] = "expired" if expired else "completed"
        body["expired_at" if expired else "completed_at"] = now
        body["finalizing_at"] = now

    def _answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        parsed = parse_chat(request, self.default_max_tokens)
        if isinstance(parsed, str):
            return 400, {"error": {"message": parsed, "type": "invalid_request_error", "param": None,
                                   "code": "invalid_request"}}
        rec = Record(time=time.time(), endpoint="batch", request_id=f"req-batch-{uuid.uuid4().hex[:12]}",
                     model=parsed.model, prompt_tokens=parsed.prompt_tokens)
        return 200, chat_payload(parsed, rec, self.served(parsed.model), self.revision)

    def _jsonl(self, entries: list[dict[str, Any]], batch_id: str, kind: str) -> str:
        data = "".join(json.dumps(e) + "\n" for e in entries).encode()
        return str(self.add_file(f"{batch_id}_{kind}.jsonl", "batch_output", data)["id"])


def _invalid(message: str, status: int = 400) -> JSONResponse:
    code = "not_found" if status == 404 else "invalid_request"
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": code}}, status_code=status)


def add_batch_routes(app: FastAPI, batches: SimBatches, auth: Any) -> None:
    """The /v1/files and /v1/batches routes, behind the simulator's key check ``auth(request)``."""

    @app.post("/v1/files")
    async def upload(request: Request) -> Response:
        if (denied := auth(request)) is not None:
            return denied  # type: ignore[no-any-return]
        form = await request.form()
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or isinstance(upload, str) or not isinstance(purpose, str):
            return _invalid("a multipart form with 'file' and 'purpose' is required")
        return JSONResponse(batches.add_file(upload.filename or "upload.jsonl", purpose, await upload.read()))

    @app.get("/v1/files/{file_id}")
    async def file_meta(file_id: str, request: Request) -> Response:
        found = batches.files.get(file_id)
        return auth(request) or (JSONResponse(found[0]) if found else _invalid(f"no file {file_id}", 404))

    @app.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str, request: Request) -> Response:
        found = batches.files.get(file_id)
        if found is None:
            return auth(request) or _invalid(f"no file {file_id}", 404)
        return auth(request) or Response(found[1], media_type="application/octet-stream")

    @app.post("/v1/batches")
    async def create_batch(request: Request) -> Response:
        if (denied := auth(request)) is not None:
            return denied  # type: ignore[no-any-return]
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _invalid("the request body is not JSON")
        made = batches.create(body if isinstance(body, dict) else {})
        if isinstance(made, str):
            return _invalid(made)
        if batches.create_delay_s:  # the batch exists (and is listed) before its creator hears of it
            await asyncio.sleep(batches.create_delay_s)
        return JSONResponse(made)

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(batch_id: str, request: Request) -> Response:
        found = batches.get(batch_id)
        return auth(request) or (JSONResponse(found) if found else _invalid(f"no batch {batch_id}", 404))

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, request: Request) -> Response:
        found = batches.cancel(batch_id)
        return auth(request) or (JSONResponse(found) if found else _invalid(f"no batch {batch_id}", 404))

    @app.get("/v1/batches")
    async def list_batches(request: Request) -> Response:
        if (denied := auth(request)) is not None:
            return denied  # type: ignore[no-any-return]
        rows = [batches.get(b) for b in reversed(list(batches.batches))]
        after, limit = request.query_params.get("after"), int(request.query_params.get("limit") or 20)
        ids = [r["id"] for r in rows if r]
        start = ids.index(after) + 1 if after in ids else 0
        page = [r for r in rows[start:start + limit] if r]
        return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None,
                             "has_more": start + limit < len(rows)})
