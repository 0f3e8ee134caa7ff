"""AnthropicProvider through the official anthropic SDK against a small local Messages API server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("anthropic")

from conveyor.providers.anthropic_provider import AnthropicProvider, split_system
from conveyor.providers.base import Completion, ProviderError

KEY = "right"
PRICES = {"claude-test": {"input": 3.0, "output": 15.0}}
USER = [{"role": "system", "content": "You extract facts."}, {"role": "user", "content": "Pump X200 parts?"}]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_err"}


# model name -> (status, headers, body); "text" and "json" answer normally.
ERRORS: dict[str, tuple[int, dict[str, str], dict[str, Any]]] = {
    "overloaded": (529, {}, _error("overloaded_error", "Overloaded")),
    "ratelimited": (429, {"retry-after": "7"}, _error("rate_limit_error", "Number of request tokens has exceeded "
                                                                         "your per-minute rate limit")),
    "toolong": (400, {}, _error("invalid_request_error", "prompt is too long: 250123 tokens > 200000 maximum")),
    "badparam": (400, {}, _error("invalid_request_error", "temperature: range: 0..1")),
    "missing": (404, {}, _error("not_found_error", "model: missing")),
}
ANSWERS = {
    "text": ("The X200 has three wear parts.", "end_turn"),
    "json": ('```json\n{"parts": ["seal", "impeller"]}\n```', "end_turn"),
    "json-cut": ('{"parts": ["seal", "imp', "max_tokens"),
    "json-prose": ("Sure! The parts are seal and impeller.", "end_turn"),
}


class _Handler(BaseHTTPRequestHandler):
    seen: Counter[str]
    bodies: list[dict[str, Any]]

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.bodies.append(body)
        model = str(body.get("model"))
        self.seen[model] += 1
        if self.path != "/v1/messages":
            return self._send(404, {}, _error("not_found_error", f"no route {self.path}"))
        if KEY not in (self.headers.get("x-api-key"), self.headers.get("authorization", "").removeprefix("Bearer ")):
            return self._send(401, {}, _error("authentication_error", "invalid x-api-key"))
        if model in ERRORS:
            return self._send(*ERRORS[model])
        if model == "trickle":
            return self._trickle()
        text, stop = ANSWERS[model.removeprefix("claude-test-")] if model != "claude-test" else ANSWERS["text"]
        reset = (datetime.now(UTC) + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
        headers = {"request-id": "req_ok_1", "anthropic-ratelimit-tokens-remaining": "9000",
                   "anthropic-ratelimit-tokens-limit": "10000", "anthropic-ratelimit-tokens-reset": reset}
        return self._send(200, headers, {
            "id": "msg_01", "type": "message", "role": "assistant", "model": f"{model}-20261101",
            "content": [{"type": "text", "text": text}], "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 10},
        })

    def _trickle(self) -> None:
        """Headers at once, then one byte every 0.3 s: no read timeout ever fires."""
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "100")
        self.end_headers()
        try:
            for _ in range(20):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.3)
        except OSError:
            pass

    def _send(self, status: int, headers: dict[str, str], body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture()
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"seen": Counter(), "bodies": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def chat(url: str, model: str, key: str = KEY, **kw: Any) -> Completion:
    async def main() -> Completion:
        async with AnthropicProvider(key, url, prices=PRICES, timeout=5) as provider:
            return await provider.chat(USER, model=model, **kw)

    return asyncio.run(main())


def failure(url: str, model: str, key: str = KEY, **kw: Any) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        chat(url, model, key, **kw)
    return info.value


def test_messages_round_trip(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    done = chat(url, "claude-test", prompt_version="parts@1")
    assert done.text == "The X200 has three wear parts." and done.data is None
    assert done.model == "claude-test-20261101" and done.request_id == "req_ok_1"
    assert (done.prompt_tokens, done.completion_tokens) == (130, 30)
    assert done.cost == pytest.approx((130 * 3.0 + 30 * 15.0) / 1_000_000)
    assert done.prompt_version == "parts@1" and done.finish_reason == "end_turn"
    assert done.limits is not None and done.limits["remaining_tokens"] == 9000
    assert 25 < done.limits["reset_tokens_s"] <= 30
    sent = handler.bodies[-1]
    assert sent["system"] == "You extract facts." and sent["messages"] == [USER[1]]


def test_json_mode_parses_and_rejects(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    assert chat(url, "claude-test-json", json_mode=True).data == {"parts": ["seal", "impeller"]}
    assert "JSON object" in handler.bodies[-1]["system"]
    for model in ("claude-test-json-cut", "claude-test-json-prose"):
        err = failure(url, model, json_mode=True)
        assert err.error_class == "malformed_output" and err.retryable and err.completion_tokens == 30


@pytest.mark.parametrize(("model", "error_class", "retryable", "status"), [
    ("overloaded", "overloaded", True, 529),
    ("ratelimited", "rate_limited", True, 429),
    ("toolong", "context_length", False, 400),
    ("badparam", "bad_request", False, 400),
    ("missing", "not_found", False, 404),
])
def test_error_mapping(server: tuple[str, type[_Handler]], model: str, error_class: str, retryable: bool,
                       status: int) -> None:
    url, handler = server
    err = failure(url, model)
    assert (err.error_class, err.retryable, err.status_code, err.provider) == (error_class, retryable, status,
                                                                                 "anthropic")
    assert handler.seen[model] == 1  # the SDK did not retry on its own
    if model == "ratelimited":
        assert err.retry_after == 7.0


def test_a_trickling_answer_hits_the_wall_clock_deadline(server: tuple[str, type[_Handler]]) -> None:
    url, _ = server
    started = time.monotonic()
    err = failure(url, "trickle", timeout=1)
    assert err.error_class == "timeout" and err.retryable and "no complete answer within 1s" in str(err)
    assert time.monotonic() - started < 3


def test_wrong_key_is_auth(server: tuple[str, type[_Handler]]) -> None:
    url, _ = server
    err = failure(url, "claude-test", key="wrong")
    assert (err.error_class, err.retryable, err.status_code) == ("auth", False, 401)


def test_embed_is_a_terminal_bad_request() -> None:
    async def main() -> None:
        async with AnthropicProvider("k", "http://127.0.0.1:9") as provider:
            await provider.embed(["x"], model="any")

    with pytest.raises(ProviderError) as info:
        asyncio.run(main())
    assert (info.value.error_class, info.value.retryable) == ("bad_request", False)
    assert "no embeddings endpoint" in str(info.value)


def test_split_system_joins_system_messages() -> None:
    system, turns = split_system([{"role": "system", "content": "a"}, {"role": "user", "content": "q"},
                                  {"role": "system", "content": [{"type": "text", "text": "b"}]}])
    assert system == "a\n\nb" and turns == [{"role": "user", "content": "q"}]
