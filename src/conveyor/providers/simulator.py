"""A local OpenAI-compatible provider simulator, seeded and reproducible.

Endpoints: ``POST /v1/chat/completions`` (text, or JSON mode with
``response_format={"type": "json_object"}``), ``POST /v1/embeddings``,
``GET /v1/models``, ``GET /health``, and the Batch API (``/v1/files``,
``/v1/batches``: see simbatch). Any model name is accepted; responses
report it with a revision suffix (``sim-1@2026-11-01``).

Faults, all drawn from one ``random.Random(seed)``: every well-formed
chat/embeddings request draws the same six values in arrival order (latency,
hang, 5xx, 5xx status, truncated, malformed-or-fenced), so the same seed and the
same request order give the same behaviour. Precedence: 429 (limits), hang, 5xx,
then, for JSON answers only (JSON mode, or a prompt that asks for a JSON record:
see simcontent), truncated, malformed (not JSON at all) or fenced content (the
JSON in a code fence with a trailing comma: broken only in its format). Latency
is lognormal: ``latency_ms * exp(latency_tail * z)``, capped at 120 s.

Limits (see simlimits): a sliding 60 s window over requests and tokens. A
request reserves prompt tokens + max_tokens (``default_max_tokens`` when
absent) and is charged prompt + completion tokens when answered; a 5xx or a
hang is charged 0 tokens but counts as a request; a 429 counts as nothing. A
request whose estimate exceeds the whole TPM gets 400 ``request_too_large``.
Every response carries ``x-request-id`` (numbered per /v1 request) and the
``x-ratelimit-*`` headers of the limits that are set (none for an unlimited one).
Token counting: see simcontent.

Log (``log_path``): one JSON line per chat/embeddings request with time
(wall clock at arrival), endpoint, request_id, model, status (0 for a hang),
prompt_tokens, completion_tokens, charged_tokens, retry_after (seconds) and
fault (hang, 5xx, or a content fault applied to a JSON answer: truncated,
malformed, fenced).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.providers.simbatch import SimBatches, add_batch_routes
from conveyor.providers.simlimits import Entry, Refusal, WindowLimiter, retry_headers
from conveyor.providers.simrequests import Record, chat_payload, embed_payload, parse_chat, parse_embed

MAX_LATENCY_S = 120.0
MAX_HANG_S = 600.0


@dataclass(frozen=True)
class SimConfig:
    """Limits, faults and identity of one simulated provider (0 = unlimited / never)."""

    seed: int = 0
    tpm: int = 0
    rpm: int = 0
    latency_ms: float = 0.0
    latency_tail: float = 0.0
    error_rate_5xx: float = 0.0
    hang_rate: float = 0.0
    hang_seconds: float = MAX_HANG_S
    truncated_rate: float = 0.0
    malformed_rate: float = 0.0
    fenced_rate: float = 0.0
    log_path: str | Path | None = None
    api_key: str | None = None
    revision: str = "2026-11-01"
    models: tuple[str, ...] = ("sim-1", "sim-embed-1")
    embedding_dim: int = 384
    default_max_tokens: int = 512
    window_s: float = 60.0  # the limits' window; shorter only to test quota logic quickly
    batch_delay_s: float = 2.0  # how long a batch takes (simbatch: /v1/files + /v1/batches)
    batch_failure_rate: float = 0.0  # share of batch entries answered HTTP 500
    batch_expired_rate: float = 0.0  # share of batch entries left unanswered: the batch ends expired
    batch_create_delay_s: float = 0.0  # a created batch's answer is held this long (a crash may fall in between)

    def __post_init__(self) -> None:
        for name in ("error_rate_5xx", "hang_rate", "truncated_rate", "malformed_rate", "fenced_rate",
                     "batch_failure_rate", "batch_expired_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        if self.malformed_rate + self.fenced_rate > 1.0:
            raise ValueError("malformed_rate + fenced_rate must be at most 1 (they share one draw)")
        for name in ("tpm", "rpm", "latency_ms", "latency_tail", "batch_delay_s", "batch_create_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not 0 < self.hang_seconds <= MAX_HANG_S:
            raise ValueError(f"hang_seconds must be in (0, {MAX_HANG_S:g}]")
        if self.window_s <= 0:
            raise ValueError("window_s must be > 0")
        if self.embedding_dim < 1 or self.default_max_tokens < 1:
            raise ValueError("embedding_dim and default_max_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class _Draws:
    latency_s: float
    hang: bool
    error_status: int | None
    truncated: bool
    malformed: bool
    fenced: bool

    def content_fault(self) -> str | None:
        """The fault a JSON answer gets, if any."""
        return "truncated" if self.truncated else "malformed" if self.malformed else "fenced" if self.fenced else None


Build = Callable[[Record], dict[str, Any]]


class _Sim:
    """The mutable state of one simulator app: rng, limiter, request counter, log."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.limiter = WindowLimiter(config.rpm, config.tpm, config.window_s)
        self._count = 0
        self.log_path = Path(config.log_path) if config.log_path else None

    def next_request_id(self) -> str:
        self._count += 1
        return f"req-{self.config.seed}-{self._count:08d}"

    def served_model(self, model: str) -> str:
        return f"{model}@{self.config.revision}"

    def draw(self) -> _Draws:
        c, rng = self.config, self.rng
        z = rng.gauss(0.0, 1.0)
        u_hang, u_err, u_status, u_trunc, u_mal = (rng.random() for _ in range(5))
        truncated = u_trunc < c.truncated_rate
        # malformed and fenced share one draw (malformed below its rate, fenced in the next band), so a seed
        # gives the same faults it gave before fenced answers existed
        return _Draws(
            latency_s=min(c.latency_ms / 1000.0 * math.exp(c.latency_tail * z), MAX_LATENCY_S),
            hang=u_hang < c.hang_rate,
            error_status=(500 if u_status < 0.5 else 503) if u_err < c.error_rate_5xx else None,
            truncated=truncated,
            malformed=not truncated and u_mal < c.malformed_rate,
            fenced=not truncated and c.malformed_rate <= u_mal < c.malformed_rate + c.fenced_rate,
        )

    def write(self, rec: Record) -> None:
        if self.log_path is not None:
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(asdict(rec)) + "\n")

    def auth_error(self, request: Request) -> JSONResponse | None:
        key = self.config.api_key
        if key is None or request.headers.get("authorization") == f"Bearer {key}":
            return None
        return _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")

    async def serve(self, request: Request, rec: Record, estimate: int, build: Build,
                    json_answer: bool = False) -> Response:
        """Limits, faults and latency around building the answer; content faults only for a JSON answer."""
        draws = self.draw()
        if self.config.tpm and estimate > self.config.tpm:
            msg = f"Request too large: {estimate} tokens requested, limit {self.config.tpm} per min."
            return _error(400, msg, "invalid_request_error", "request_too_large")
        admitted = self.limiter.admit(estimate)
        if isinstance(admitted, Refusal):
            rec.retry_after = admitted.retry_after_s
            return _rate_limited(admitted)
        try:
            return await self._answer(request, rec, admitted, draws, build, json_answer)
        finally:
            self.limiter.settle(admitted, rec.charged_tokens)

    async def _answer(self, request: Request, rec: Record, entry: Entry, draws: _Draws, build: Build,
                      json_answer: bool) -> Response:
        if draws.hang:
            rec.fault = "hang"
            self.limiter.settle(entry, 0)
            self.write(rec)
            await _hang(request, self.config.hang_seconds)
            return Response(status_code=504)
        if draws.latency_s > 0:
            await asyncio.sleep(draws.latency_s)
        if draws.error_status is not None:
            rec.fault = "5xx"
            return _error(draws.error_status, "The server had an error while processing your request.",
                          "server_error", None)
        if json_answer:
            rec.fault = draws.content_fault()
        payload = build(rec)
        rec.charged_tokens = rec.prompt_tokens + rec.completion_tokens
        return JSONResponse(payload)


def _error(status: int, message: str, type_: str, code: str | None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _invalid(message: str) -> JSONResponse:
    return _error(400, message, "invalid_request_error", "invalid_request")


def _rate_limited(refusal: Refusal) -> JSONResponse:
    return _error(429, refusal.message, "rate_limit_exceeded", f"rate_limit_{refusal.limit}",
                  retry_headers(refusal.retry_after_s))


async def _hang(request: Request, seconds: float) -> None:
    deadline = time.monotonic() + min(seconds, MAX_HANG_S)
    while time.monotonic() < deadline:
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.2)


async def _json_body(request: Request) -> dict[str, Any] | str:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return "The request body is not valid JSON."
    return body if isinstance(body, dict) else "The request body must be a JSON object."


async def _chat(sim: _Sim, request: Request, rec: Record) -> Response:
    body = await _json_body(request)
    parsed = parse_chat(body, sim.config.default_max_tokens) if isinstance(body, dict) else body
    if isinstance(parsed, str):
        return _invalid(parsed)
    rec.model, rec.prompt_tokens = parsed.model, parsed.prompt_tokens
    estimate = parsed.prompt_tokens + parsed.max_tokens
    served = sim.served_model(parsed.model)
    return await sim.serve(request, rec, estimate, lambda r: chat_payload(parsed, r, served, sim.config.revision),
                           parsed.json_answer)


async def _embed(sim: _Sim, request: Request, rec: Record) -> Response:
    body = await _json_body(request)
    parsed = parse_embed(body, sim.config.embedding_dim) if isinstance(body, dict) else body
    if isinstance(parsed, str):
        return _invalid(parsed)
    rec.model, rec.prompt_tokens = parsed.model, parsed.prompt_tokens
    served = sim.served_model(parsed.model)
    return await sim.serve(request, rec, parsed.prompt_tokens, lambda r: embed_payload(parsed, r, served))


Handler = Callable[[_Sim, Request, Record], Awaitable[Response]]


async def _logged(sim: _Sim, request: Request, endpoint: str, handler: Handler) -> Response:
    rec = Record(time=time.time(), endpoint=endpoint, request_id=request.state.request_id)
    response = sim.auth_error(request) or await handler(sim, request, rec)
    if rec.fault != "hang":
        rec.status = response.status_code
        sim.write(rec)
    return response


class _Headers:
    """ASGI middleware: x-request-id and the x-ratelimit-* headers on every response."""

    def __init__(self, app: ASGIApp, sim: _Sim) -> None:
        self.app, self.sim = app, sim

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        request_id = self.sim.next_request_id() if path.startswith("/v1/") else f"req-{self.sim.config.seed}-0"
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["x-request-id"] = request_id
                for name, value in self.sim.limiter.headers().items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(config: SimConfig) -> FastAPI:
    """A fresh simulator app; all state lives in the app, none in the module."""
    sim = _Sim(config)
    app = FastAPI(title="conveyor provider simulator", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Headers, sim=sim)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        return _error(status, str(getattr(exc, "detail", exc)), "invalid_request_error", None)

    app.add_exception_handler(StarletteHTTPException, http_error)
    add_batch_routes(app, SimBatches(config.seed, config.batch_delay_s, config.batch_failure_rate,
                                     config.batch_expired_rate, config.revision, config.default_max_tokens,
                                     sim.served_model, config.batch_create_delay_s), sim.auth_error)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _logged(sim, request, "chat", _chat)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await _logged(sim, request, "embeddings", _embed)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "conveyor-sim"} for m in config.models]
        return sim.auth_error(request) or JSONResponse({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _wait_healthy(base: str, thread: threading.Thread, timeout: float = 15.0) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("the provider simulator stopped during startup")
        with contextlib.suppress(OSError), opener.open(f"{base}/health", timeout=1) as resp:
            if resp.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the provider simulator did not answer {base}/health within {timeout:g}s")


@contextlib.contextmanager
def run_simulator(config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve the simulator from a background thread; yields the base URL ``http://HOST:PORT/v1``."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP: asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    netloc = f"[{host}]:{sock.getsockname()[1]}" if family == socket.AF_INET6 else f"{host}:{sock.getsockname()[1]}"
    uv_config = uvicorn.Config(create_app(config), log_level="warning", access_log=False,
                               lifespan="off", timeout_graceful_shutdown=2)
    server = uvicorn.Server(uv_config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="provider-sim", daemon=True)
    thread.start()
    try:
        _wait_healthy(f"http://{netloc}", thread)
        yield f"http://{netloc}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each flag's default after its help (unless it has none); description and epilog kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def _epilog() -> str:
    chat, embed = SimConfig.models
    return f"""\
models:
  Any model name is served and reported with the revision: model="{chat}" answers
  as "{chat}@{SimConfig.revision}". GET /v1/models lists {chat} (chat) and {embed}
  (embeddings, {SimConfig.embedding_dim} dimensions; "dimensions" may ask for fewer).

endpoints (the base URL printed on stdout, http://HOST:PORT/v1):
  POST /v1/chat/completions  text, or JSON mode: response_format={{"type": "json_object"}}; a system
                             prompt asking for "names" and "confidence" gets a JSON record (names from
                             the user message's "NAME: a, b - text" line), in either mode
  POST /v1/embeddings        encoding_format "float" or "base64"
  POST /v1/files, GET /v1/files/ID[/content], POST /v1/batches, GET /v1/batches[/ID], POST .../cancel:
                             the Batch API (chat completions), answered --batch-delay-s after creation
  GET  /v1/models, GET /health

use it:
  OPENAI_BASE_URL=http://127.0.0.1:8765/v1 (any OPENAI_API_KEY unless --api-key is set);
  give {chat} a price in CONVEYOR_PRICES, else its cost shows as unpriced.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="conveyor provider-sim", formatter_class=_HelpFormatter, epilog=_epilog(),
                                description="Run a local OpenAI-compatible provider with TPM/RPM limits and seeded\n"
                                            "faults; prints its base URL on stdout and serves until Ctrl-C.")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    p.add_argument("--seed", type=int, default=0, help="seed of every fault and latency draw")
    p.add_argument("--tpm", type=int, default=0, help="tokens per minute, 0 = unlimited")
    p.add_argument("--rpm", type=int, default=0, help="requests per minute, 0 = unlimited")
    p.add_argument("--latency-ms", type=float, default=0.0, help="median latency in milliseconds")
    p.add_argument("--latency-tail", type=float, default=0.0, help="lognormal sigma of the latency")
    p.add_argument("--error-rate-5xx", type=float, default=0.0, help="share of requests answered 500 or 503")
    p.add_argument("--hang-rate", type=float, default=0.0, help="share of requests held, then answered 504")
    p.add_argument("--hang-seconds", type=float, default=MAX_HANG_S, help="how long a hang holds a request")
    p.add_argument("--truncated-rate", type=float, default=0.0, help="share of JSON-mode answers cut off")
    p.add_argument("--malformed-rate", type=float, default=0.0, help="share of JSON-mode answers not JSON")
    p.add_argument("--fenced-rate", type=float, default=0.0,
                   help="share of JSON-mode answers in a ```json fence with a trailing comma (repairable)")
    p.add_argument("--log", dest="log_path", default=None, help="write a JSONL request log, one line per request")
    p.add_argument("--api-key", default=None, help="require this bearer key (unset: any key is accepted)")
    p.add_argument("--revision", default=SimConfig.revision, help="revision reported after the model name")
    p.add_argument("--window-s", type=float, default=60.0, help="the limits' window (tests use a short one)")
    p.add_argument("--batch-delay-s", type=float, default=SimConfig.batch_delay_s,
                   help="seconds a batch (/v1/batches) takes to complete")
    p.add_argument("--batch-failure-rate", type=float, default=0.0, help="share of batch entries answered 500")
    p.add_argument("--batch-expired-rate", type=float, default=0.0,
                   help="share of batch entries left unanswered (the batch ends expired)")
    p.add_argument("--batch-create-delay-s", type=float, default=0.0,
                   help="seconds the answer to a batch creation is held after the batch exists")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry: serve until interrupted; prints the base URL on stdout."""
    args = vars(_parser().parse_args(argv))
    host, port = args.pop("host"), args.pop("port")
    try:
        config = SimConfig(**args)
    except ValueError as exc:
        print(f"provider-sim: {exc}", file=sys.stderr)
        return 2
    import signal

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with run_simulator(config, host, port) as url:
            print(url, flush=True)
            print("provider simulator running; Ctrl-C to stop", file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
