"""The provider layer's pure parts: prices, headers, the HTTP → error-class table, the factory."""

from __future__ import annotations

import json
from email.utils import formatdate
from pathlib import Path
from time import time

import pytest

from conveyor.errors import UserError
from conveyor.providers.base import ERROR_CLASSES, RETRYABLE, PriceTable, ProviderError
from conveyor.providers.errormap import from_status, parse_json_object
from conveyor.providers.factory import provider_from_env
from conveyor.providers.headers import exhausted_reset, parse_duration, rate_limits, retry_after


def test_price_table_lookup_cost_and_unknown(tmp_path: Path) -> None:
    prices = PriceTable.from_dict({"gpt-4o": {"input": 2.5, "output": 10.0}, "gpt-4o-mini": [0.15, 0.6],
                                   "embed": 0.02})
    assert prices.cost("gpt-4o", 1_000_000, 1_000_000) == pytest.approx(12.5)
    assert prices.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0) == pytest.approx(0.15)  # longest prefix wins
    assert prices.cost("gpt-4o@rev", 0, 1_000_000) == pytest.approx(10.0)
    assert prices.cost("embed", 500_000) == pytest.approx(0.01)
    assert prices.cost("other", 10, 10) == 0.0 and prices.unknown == {"other"}
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"models": {"m": {"input": 1, "output": 2}}}))
    assert PriceTable.load(str(path)).cost("m", 1_000_000, 1_000_000) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="price of 'x'"):
        PriceTable.from_dict({"x": {"output": 1}})


def test_cost_for_prefers_the_requested_model() -> None:
    prices = PriceTable.from_dict({"a": [1.0, 1.0], "b-2026": [2.0, 2.0]})
    assert prices.cost_for("a", "a-x", 1_000_000, 0) == (pytest.approx(1.0), True)
    assert prices.cost_for("b", "b-2026", 1_000_000, 0) == (pytest.approx(2.0), True)
    assert prices.cost_for("c", "c-1", 1_000_000, 0) == (0.0, False)


def test_provider_error_defaults_and_one_line_message() -> None:
    assert ProviderError("timeout").retryable and not ProviderError("auth").retryable
    assert ProviderError("auth", retryable=True).retryable
    err = ProviderError("server_error", "line one\nline two", status_code=500, provider="openai")
    assert str(err) == "openai server_error (HTTP 500): line one line two"
    assert RETRYABLE < ERROR_CLASSES


def test_headers() -> None:
    assert parse_duration("1m2.5s") == pytest.approx(62.5)
    assert parse_duration("250ms") == pytest.approx(0.25)
    assert parse_duration("6") == 6.0 and parse_duration("soon") is None
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"Retry-After": "3"}) == 3.0
    assert 8 <= (retry_after({"retry-after": formatdate(time() + 10, usegmt=True)}) or 0) <= 10
    limits = rate_limits({"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "0",
                          "x-ratelimit-reset-tokens": "2s", "x-ratelimit-remaining-requests": "5"})
    assert limits == {"limit_tokens": 1000, "remaining_tokens": 0, "reset_tokens_s": 2, "remaining_requests": 5}
    assert exhausted_reset(limits) == 2.0 and rate_limits({}) is None


@pytest.mark.parametrize(("status", "typ", "code", "message", "expected"), [
    (429, "requests", "rate_limit_exceeded", "Rate limit reached", "rate_limited"),
    (429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota", "auth"),
    (529, "overloaded_error", None, "Overloaded", "overloaded"),
    (503, None, None, "Service unavailable", "overloaded"),
    (500, "server_error", None, "The engine is currently overloaded", "overloaded"),
    (502, None, None, "Bad gateway", "server_error"),
    (504, None, None, "Gateway timeout", "timeout"),
    (400, "invalid_request_error", "context_length_exceeded", "This model's maximum context length is 8192",
     "context_length"),
    (400, "invalid_request_error", None, "prompt is too long: 250000 tokens > 200000 maximum", "context_length"),
    (400, None, "content_filter", "The response was filtered", "content_policy"),
    (400, "invalid_request_error", "content_policy_violation", "Your request was rejected", "content_policy"),
    (400, "invalid_request_error", None, "Unsupported parameter: 'max_tokens'", "bad_request"),
    (422, None, None, "Unprocessable", "bad_request"),
    (401, None, "invalid_api_key", "Incorrect API key", "auth"),
    (403, "permission_error", None, "Forbidden", "auth"),
    (404, "not_found_error", None, "model: x", "not_found"),
])
def test_status_table(status: int, typ: str | None, code: str | None, message: str, expected: str) -> None:
    err = from_status("p", status, message=message, error_type=typ, code=code, headers={"retry-after": "2"})
    assert err.error_class == expected and err.status_code == status
    assert err.retryable == (expected in RETRYABLE)
    assert (err.retry_after == 2.0) == (expected in {"rate_limited", "overloaded", "timeout", "server_error"})


def test_rate_limited_without_retry_after_uses_the_exhausted_reset() -> None:
    headers = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1.5s"}
    assert from_status("openai", 429, message="slow", headers=headers).retry_after == 1.5


def test_parse_json_object() -> None:
    assert parse_json_object('{"a": 1}') == {"a": 1}
    assert parse_json_object("[1, 2]") is None and parse_json_object('{"a": ') is None
    assert parse_json_object('```json\n{"a": 1}\n```') is None
    assert parse_json_object('```json\n{"a": 1}\n```', lenient=True) == {"a": 1}
    assert parse_json_object('Here: {"a": {"b": 2}} done', lenient=True) == {"a": {"b": 2}}


def test_factory_picks_from_the_environment(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    from conveyor.providers.anthropic_provider import AnthropicProvider
    from conveyor.providers.openai_provider import OpenAIProvider

    path = tmp_path / "p.json"
    path.write_text('{"m": [1, 2]}')
    chosen = provider_from_env({"OPENAI_BASE_URL": "http://127.0.0.1:1/v1", "CONVEYOR_PRICES": str(path),
                                "ANTHROPIC_API_KEY": "k"})
    assert isinstance(chosen, OpenAIProvider) and chosen.prices.known("m")
    assert isinstance(provider_from_env({"OPENAI_API_KEY": "sk"}), OpenAIProvider)
    assert isinstance(provider_from_env({"ANTHROPIC_API_KEY": "k"}), AnthropicProvider)
    with pytest.raises(UserError, match="provider-sim") as info:
        provider_from_env({})
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="price table"):
        provider_from_env({"OPENAI_API_KEY": "sk", "CONVEYOR_PRICES": str(tmp_path / "missing.json")})
