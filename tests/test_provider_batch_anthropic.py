"""The provider batch lane on Anthropic's Message Batches API, through the official SDK, against a small local
server that speaks it (create, retrieve, list, results) and the Messages API (for direct calls)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("anthropic")

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service.report import find_run, reconcile
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.helpers import make_docs, write_pipeline

PRICE_IN, PRICE_OUT, TOKENS_IN, TOKENS_OUT = 3.0, 15.0, 10, 5
DIRECT_COST = (TOKENS_IN * PRICE_IN + TOKENS_OUT * PRICE_OUT) / 1e6

PIPE = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.anthropic_provider import AnthropicProvider

    def provider():
        return AnthropicProvider("key", os.environ["ANTHROPIC_SIM"], prices={"claude-test": [3.0, 15.0]})

    pipe = Pipeline("claude", provider=provider, retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    @pipe.stage(version="1", batch=True)
    async def label(ctx, source: bytes) -> str:
        answer = await ctx.chat([{"role": "system", "content": "Label it."},
                                 {"role": "user", "content": source.decode()}], model="claude-test")
        return answer.text
"""


def _message(text: str) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": TOKENS_IN, "output_tokens": TOKENS_OUT}}


class _Server:
    """Batches end 0.3 s after creation. The first entry of the first batch errors (overloaded: batched again),
    its second entry expires (called directly)."""

    def __init__(self) -> None:
        self.batches: dict[str, dict[str, Any]] = {}
        self.direct = 0
        self.base = ""

    def batch(self, batch_id: str) -> dict[str, Any]:
        b = self.batches[batch_id]
        ended = time.time() >= b["ends"]
        n = len(b["requests"])
        counts = {"processing": 0 if ended else n, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if ended:
            for result in b["results"]:
                counts[result["result"]["type"]] += 1
        return {"id": batch_id, "type": "message_batch", "processing_status": "ended" if ended else "in_progress",
                "request_counts": counts, "created_at": b["created"], "expires_at": b["created"],
                "ended_at": b["created"] if ended else None, "archived_at": None, "cancel_initiated_at": None,
                "results_url": f"{self.base}/v1/messages/batches/{batch_id}/results" if ended else None}

    def create(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        batch_id = f"msgbatch_{len(self.batches) + 1:04d}"
        first = not self.batches
        results = []
        for i, request in enumerate(requests):
            text = "label: " + request["params"]["messages"][-1]["content"][:20]
            if first and i == 0:
                result = {"type": "errored", "error": {"type": "error", "error": {"type": "overloaded_error",
                                                                                  "message": "Overloaded"}}}
            elif first and i == 1:
                result = {"type": "expired"}
            else:
                result = {"type": "succeeded", "message": _message(text)}
            results.append({"custom_id": request["custom_id"], "result": result})
        created = datetime.now(UTC).isoformat()
        self.batches[batch_id] = {"requests": requests, "results": results, "ends": time.time() + 0.3,
                                  "created": created}
        return self.batch(batch_id)


def _handler(server: _Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: Any, raw: bytes | None = None) -> None:
            data = raw if raw is not None else json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if self.path == "/v1/messages/batches":
                self._send(server.create(body["requests"]))
            else:
                server.direct += 1
                self._send(_message("label: direct"))

        def do_GET(self) -> None:
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts == ["v1", "messages", "batches"]:
                data = [server.batch(b) for b in reversed(list(server.batches))]
                self._send({"data": data, "has_more": False, "first_id": None, "last_id": None})
            elif len(parts) == 5 and parts[4] == "results":
                lines = "".join(json.dumps(r) + "\n" for r in server.batches[parts[3]]["results"])
                self._send(None, lines.encode())
            else:
                self._send(server.batch(parts[3]))

    return Handler


@pytest.fixture
def anthropic_sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    server = _Server()
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.base = f"http://127.0.0.1:{http.server_address[1]}"
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("ANTHROPIC_SIM", server.base)
    monkeypatch.setenv("CONVEYOR_PROVIDER_BATCH_GATHER_S", "0.2")
    monkeypatch.setenv("CONVEYOR_PROVIDER_BATCH_POLL_S", "0.3")
    yield server
    http.shutdown()


def test_message_batches_answer_at_half_price(tmp_path: Path, store_url: str, anthropic_sim: _Server) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 5, "ticket {i}")
    store = open_store(store_url)
    try:
        run_id = submit(load_target(target), target, str(docs), store, FilesystemBlobs(tmp_path / "blobs")).run_id
    finally:
        store.close()
    Worker(load_target(target), target, store_url, FilesystemBlobs(tmp_path / "blobs"),
           WorkerOptions(run_id=run_id, until_idle=True)).run()
    store = open_store(store_url)
    try:
        report = reconcile(store, find_run(store, run_id))
    finally:
        store.close()
    assert report["outcomes"] == {"completed": 5}
    batched = sum(len(b["requests"]) for b in anthropic_sim.batches.values())
    assert batched == 6, "each ticket once, and the overloaded entry again in a later batch"
    assert anthropic_sim.direct == 1, "the expired entry was called directly"
    assert report["usage"]["provider_calls"] == 5
    assert report["usage"]["cost"] == pytest.approx(4 * DIRECT_COST / 2 + DIRECT_COST)


def test_a_message_batch_created_before_a_crash_is_adopted(tmp_path: Path, store_url: str,
                                                           anthropic_sim: _Server) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 3, "form {i}")
    store = open_store(store_url)
    try:
        run_id = submit(load_target(target), target, str(docs), store, FilesystemBlobs(tmp_path / "blobs")).run_id
    finally:
        store.close()

    def worker() -> Worker:
        return Worker(load_target(target), target, store_url, FilesystemBlobs(tmp_path / "blobs"),
                      WorkerOptions(run_id=run_id, until_idle=True, lease_seconds=5))

    first = worker()
    assert first.batch_keeper is not None

    def crash(_: Any) -> None:
        raise SystemExit("killed after create")

    first.batch_keeper.after_create = crash
    with pytest.raises(SystemExit):
        first.run()
    stats = worker().run()
    store = open_store(store_url)
    try:
        report = reconcile(store, find_run(store, run_id))
    finally:
        store.close()
    assert stats["provider_batches_adopted"] == 1 and report["outcomes"] == {"completed": 3}
    batched = sum(len(b["requests"]) for b in anthropic_sim.batches.values())
    assert batched == 4, "the first batch adopted, not created again; the overloaded entry asked again"
