"""The provider simulator, driven through the official openai client as user code would."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

for _extra in ("openai", "fastapi", "uvicorn"):  # the `sim` extra
    pytest.importorskip(_extra)

import openai  # noqa: E402
from openai.types.chat import ChatCompletion  # noqa: E402

from conveyor.providers.simulator import SimConfig, run_simulator  # noqa: E402

USER = [{"role": "user", "content": "Summarise the service manual of pump X200 for a field engineer."}]
JSON_MODE = {"type": "json_object"}


@contextmanager
def client(config: SimConfig, timeout: float = 10.0) -> Iterator[openai.OpenAI]:
    with run_simulator(config) as url:
        yield openai.OpenAI(base_url=url, api_key="sim", max_retries=0, timeout=timeout)


def chat(c: openai.OpenAI, text: str = "hello", **kw: Any) -> ChatCompletion:
    return c.chat.completions.create(model="sim-1", messages=[{"role": "user", "content": text}], **kw)


def test_chat_round_trip_reports_usage_revision_and_headers() -> None:
    with client(SimConfig(seed=1, rpm=100, tpm=100_000)) as c:
        raw = c.chat.completions.with_raw_response.create(model="sim-1", messages=USER, max_tokens=300)
        done = raw.parse()
    assert done.model == "sim-1@2026-11-01"
    assert done.choices[0].message.content
    assert done.choices[0].finish_reason == "stop"
    usage = done.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert raw.headers["x-request-id"]
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    assert raw.headers["x-ratelimit-remaining-requests"] == "99"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) == 100_000 - usage.total_tokens
    assert raw.headers["x-ratelimit-reset-tokens"].endswith("s")


def test_json_mode_is_parseable_and_deterministic() -> None:
    with client(SimConfig(seed=1)) as c:
        first = c.chat.completions.create(model="sim-1", messages=USER, response_format=JSON_MODE)
        again = c.chat.completions.create(model="sim-1", messages=USER, response_format=JSON_MODE)
        other = chat(c, "Something else entirely", response_format=JSON_MODE)
    obj = json.loads(first.choices[0].message.content or "")
    assert set(obj) == {"title", "summary", "words"}
    assert obj["words"] == len(USER[0]["content"].split())
    assert again.choices[0].message.content == first.choices[0].message.content
    assert other.choices[0].message.content != first.choices[0].message.content


def test_max_tokens_cuts_the_completion() -> None:
    with client(SimConfig(seed=1)) as c:
        done = c.chat.completions.create(model="sim-1", messages=USER, max_tokens=3)
    assert done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens <= 3


def test_embeddings_are_unit_deterministic_384() -> None:
    texts = ["alpha", "beta", "a longer chunk of a manual"]
    with client(SimConfig(seed=1)) as c:
        first = c.embeddings.create(model="sim-embed-1", input=texts)
        floats = c.embeddings.create(model="sim-embed-1", input=texts, encoding_format="float")
        single = c.embeddings.create(model="sim-embed-1", input="beta")
    vectors = [d.embedding for d in first.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    for v in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, abs_tol=1e-5)
    assert vectors[0] != vectors[1]
    assert single.data[0].embedding == pytest.approx(vectors[1], abs=1e-6)
    assert floats.data[2].embedding == pytest.approx(vectors[2], abs=1e-6)
    assert first.model == "sim-embed-1@2026-11-01" and first.usage.prompt_tokens > 0


def test_rpm_limit_answers_429_with_retry_after() -> None:
    with client(SimConfig(seed=1, rpm=5)) as c:
        for _ in range(5):
            chat(c)
        with pytest.raises(openai.RateLimitError) as caught:
            chat(c)
    err = caught.value
    assert err.status_code == 429
    assert int(err.response.headers["retry-after"]) > 0
    assert int(err.response.headers["retry-after-ms"]) > 0
    assert err.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert err.body["type"] == "rate_limit_exceeded"


def test_tpm_limit_refuses_a_request_whose_estimate_does_not_fit() -> None:
    with client(SimConfig(seed=1, tpm=1_000)) as c:
        chat(c, max_tokens=400)  # charged prompt + completion (< 200), not the estimate
        chat(c, max_tokens=400)
        with pytest.raises(openai.RateLimitError) as caught:
            chat(c, max_tokens=900)
        with pytest.raises(openai.BadRequestError):  # larger than the whole limit: never fits
            chat(c, max_tokens=2_000)
    headers = caught.value.response.headers
    assert int(headers["retry-after"]) > 0 and int(headers["retry-after-ms"]) > 0
    assert int(headers["x-ratelimit-remaining-tokens"]) < 900


def test_5xx_injection() -> None:
    with client(SimConfig(seed=1, error_rate_5xx=1.0)) as c, pytest.raises(openai.InternalServerError) as caught:
        chat(c)
    assert caught.value.status_code in (500, 503)
    assert caught.value.body["type"] == "server_error"


def test_malformed_and_truncated_json() -> None:
    with client(SimConfig(seed=1, malformed_rate=1.0)) as c:
        malformed = c.chat.completions.create(model="sim-1", messages=USER, response_format=JSON_MODE)
        plain = c.chat.completions.create(model="sim-1", messages=USER)
    with pytest.raises(ValueError):
        json.loads(malformed.choices[0].message.content or "")
    assert plain.choices[0].message.content  # text mode is untouched
    with client(SimConfig(seed=1, truncated_rate=1.0)) as c:
        cut = c.chat.completions.create(model="sim-1", messages=USER, response_format=JSON_MODE)
    assert cut.choices[0].finish_reason == "length"
    text = cut.choices[0].message.content or ""
    assert text.startswith("{")
    with pytest.raises(ValueError):
        json.loads(text)


def test_hang_ends_in_a_client_timeout() -> None:
    with client(SimConfig(seed=1, hang_rate=1.0), timeout=1.0) as c:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            chat(c)
        assert time.monotonic() - started < 3.0


def _statuses(config: SimConfig, n: int) -> list[int]:
    out = []
    with client(config) as c:
        for i in range(n):
            try:
                chat(c, f"request {i}", response_format=JSON_MODE)
                out.append(200)
            except openai.APIStatusError as exc:
                out.append(exc.status_code)
    return out


def test_same_seed_same_statuses() -> None:
    config = SimConfig(seed=7, error_rate_5xx=0.3, rpm=25)
    first, second = _statuses(config, 30), _statuses(config, 30)
    assert first == second
    assert {200, 429} <= set(first) and set(first) & {500, 503}
    assert first[25:] == [429] * 5
    assert _statuses(SimConfig(seed=8, error_rate_5xx=0.3, rpm=25), 30) != first


def test_log_has_one_line_per_request(tmp_path: Path) -> None:
    log = tmp_path / "sim.jsonl"
    with client(SimConfig(seed=1, rpm=2, log_path=log)) as c:
        chat(c)
        c.embeddings.create(model="sim-embed-1", input=["a", "b"])
        with pytest.raises(openai.RateLimitError):
            chat(c)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["status"] for r in lines] == [200, 200, 429]
    fields = {"time", "model", "prompt_tokens", "completion_tokens", "status", "retry_after"}
    assert all(fields <= set(r) for r in lines)
    assert lines[0]["model"] == "sim-1" and lines[0]["completion_tokens"] > 0
    assert lines[1]["endpoint"] == "embeddings" and lines[1]["retry_after"] is None
    assert lines[2]["retry_after"] > 0


def test_bad_request_and_auth() -> None:
    with run_simulator(SimConfig(api_key="secret")) as url:
        wrong = openai.OpenAI(base_url=url, api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            chat(wrong)
        right = openai.OpenAI(base_url=url, api_key="secret", max_retries=0)
        with pytest.raises(openai.BadRequestError):
            right.chat.completions.create(model="sim-1", messages=[])
        assert [m.id for m in right.models.list()] == ["sim-1", "sim-embed-1"]


def test_cli_prints_the_base_url() -> None:
    cmd = [sys.executable, "-m", "conveyor.providers.simulator", "--port", "0", "--seed", "1", "--rpm", "10"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as resp:
            assert json.load(resp) == {"status": "ok"}
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_cli_help_shows_defaults_models_and_endpoints() -> None:
    script = Path(sys.executable).with_name("conveyor")  # the installed entry point, as a user runs it
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "conveyor"]
    proc = subprocess.run([*cmd, "provider-sim", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps lines at the terminal's width
    for default in ("(default: 8765)", "(default: 127.0.0.1)", "(default: 2026-11-01)", "(default: 60.0)"):
        assert default in text, default
    assert '"sim-1@2026-11-01"' in text and "sim-embed-1" in text
    assert "POST /v1/chat/completions" in text and "POST /v1/embeddings" in text


def test_window_limiter_retry_after_is_exact() -> None:
    from conveyor.providers.simlimits import Entry, Refusal, WindowLimiter

    now = [1000.0]
    limiter = WindowLimiter(rpm=2, tpm=100, clock=lambda: now[0])
    first = limiter.admit(60)
    assert isinstance(first, Entry)
    limiter.settle(first, 30)  # charged less than reserved
    now[0] += 10
    assert isinstance(limiter.admit(50), Entry)
    refused = limiter.admit(10)
    assert isinstance(refused, Refusal) and refused.limit == "requests"
    assert refused.retry_after_s == pytest.approx(50.0)
    now[0] += refused.retry_after_s
    assert isinstance(limiter.admit(60), Refusal)  # the first entry left, but 50 + 60 > 100
    assert isinstance(limiter.admit(50), Entry)
    full = limiter.admit(1)
    assert isinstance(full, Refusal) and full.retry_after_s == pytest.approx(10.0)
    assert limiter.headers()["x-ratelimit-remaining-tokens"] == "0"
