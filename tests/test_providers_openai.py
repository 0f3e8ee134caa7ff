"""OpenAIProvider against the provider simulator, over real HTTP through the official openai SDK."""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

for _extra in ("openai", "fastapi", "uvicorn"):
    pytest.importorskip(_extra)

from conveyor.providers.base import Completion, Provider, ProviderError  # noqa: E402
from conveyor.providers.openai_provider import OpenAIProvider  # noqa: E402
from conveyor.providers.simulator import SimConfig, run_simulator  # noqa: E402

T = TypeVar("T")
USER = [{"role": "system", "content": "You extract facts."},
        {"role": "user", "content": "Summarise the service manual of pump X200 for a field engineer."}]
PRICES = {"sim-1": {"input": 2.0, "output": 8.0}, "sim-embed-1": {"input": 0.02}}


def with_provider(config: SimConfig, use: Callable[[OpenAIProvider], Awaitable[T]], *,
                  api_key: str = "sim", timeout: float = 10.0) -> T:
    with run_simulator(config) as url:
        async def main() -> T:
            async with OpenAIProvider(url, api_key, prices=PRICES, timeout=timeout) as provider:
                return await use(provider)

        return asyncio.run(main())


def failure(config: SimConfig, **chat: Any) -> ProviderError:
    async def use(p: OpenAIProvider) -> ProviderError:
        with pytest.raises(ProviderError) as info:
            await p.chat(USER, model="sim-1", **chat)
        return info.value

    return with_provider(config, use)


def test_chat_round_trip_reports_tokens_revision_cost_and_limits() -> None:
    async def use(p: OpenAIProvider) -> Completion:
        assert isinstance(p, Provider)
        return await p.chat(USER, model="sim-1", max_tokens=300, prompt_version="summary@3")

    done = with_provider(SimConfig(seed=1, rpm=100, tpm=100_000), use)
    assert done.text and done.data is None and done.finish_reason == "stop"
    assert done.model == "sim-1@2026-11-01" and done.revision == "fp_sim_2026-11-01"
    assert done.prompt_tokens > 0 and done.completion_tokens > 0
    expected = (done.prompt_tokens * 2.0 + done.completion_tokens * 8.0) / 1_000_000
    assert done.cost == pytest.approx(expected) and done.priced
    assert done.request_id == "req-1-00000001"
    assert done.prompt_version == "summary@3"
    assert 0 < done.latency < 5
    assert done.limits is not None
    assert done.limits["limit_requests"] == 100 and done.limits["remaining_requests"] == 99
    assert done.limits["remaining_tokens"] == 100_000 - done.prompt_tokens - done.completion_tokens


def test_json_mode_parses_an_object() -> None:
    done = with_provider(SimConfig(seed=1), lambda p: p.chat(USER, model="sim-1", json_mode=True))
    assert isinstance(done.data, dict) and done.data


@pytest.mark.parametrize("fault", ["malformed_rate", "truncated_rate"])
def test_malformed_or_truncated_json_is_malformed_output_never_data(fault: str) -> None:
    err = failure(SimConfig(seed=1, **{fault: 1.0}), json_mode=True)
    assert err.error_class == "malformed_output" and err.retryable
    assert err.prompt_tokens > 0 and err.completion_tokens > 0 and err.cost > 0  # the attempt is still paid for
    assert err.model == "sim-1@2026-11-01" and err.request_id


def test_unpriced_model_costs_nothing_and_is_flagged() -> None:
    with run_simulator(SimConfig(seed=1)) as url:
        async def main() -> Completion:
            async with OpenAIProvider(url, "sim") as provider:
                done = await provider.chat(USER, model="sim-1")
                assert provider.prices.unknown == {"sim-1@2026-11-01"}
                return done

        done = asyncio.run(main())
    assert done.cost == 0.0 and not done.priced


def test_429_is_rate_limited_with_retry_after() -> None:
    async def use(p: OpenAIProvider) -> ProviderError:
        await p.chat(USER, model="sim-1")
        with pytest.raises(ProviderError) as info:
            await p.chat(USER, model="sim-1")
        return info.value

    err = with_provider(SimConfig(seed=1, rpm=1), use)
    assert err.error_class == "rate_limited" and err.retryable and err.status_code == 429
    assert err.retry_after is not None and 0 < err.retry_after <= 60
    assert "retry after" in str(err) and "\n" not in str(err)


@pytest.mark.parametrize(("seed", "status", "error_class"), [(1, 500, "server_error"), (0, 503, "overloaded")])
def test_5xx_is_retryable(seed: int, status: int, error_class: str) -> None:
    err = failure(SimConfig(seed=seed, error_rate_5xx=1.0))
    assert (err.status_code, err.error_class, err.retryable) == (status, error_class, True)


def test_hang_times_out_quickly() -> None:
    started = time.monotonic()
    err = failure(SimConfig(seed=1, hang_rate=1.0, hang_seconds=30), timeout=1)
    assert err.error_class == "timeout" and err.retryable
    assert time.monotonic() - started < 3.5


def test_wrong_api_key_is_auth_terminal() -> None:
    async def use(p: OpenAIProvider) -> ProviderError:
        with pytest.raises(ProviderError) as info:
            await p.chat(USER, model="sim-1")
        return info.value

    err = with_provider(SimConfig(api_key="right"), use, api_key="wrong")
    assert (err.error_class, err.retryable, err.status_code) == ("auth", False, 401)


def test_request_larger_than_the_whole_quota_is_terminal() -> None:
    err = failure(SimConfig(tpm=100), max_tokens=500)
    assert (err.error_class, err.retryable, err.status_code) == ("bad_request", False, 400)


def test_connection_refused_is_connection() -> None:
    async def main() -> ProviderError:
        async with OpenAIProvider("http://127.0.0.1:9/v1", "x", timeout=2) as provider:
            with pytest.raises(ProviderError) as info:
                await provider.chat(USER, model="sim-1")
            return info.value

    err = asyncio.run(main())
    assert err.error_class == "connection" and err.retryable


def test_embeddings_are_384_dimensional() -> None:
    texts = ["a pump manual", "a chunk of it", "another"]
    out = with_provider(SimConfig(seed=1), lambda p: p.embed(texts, model="sim-embed-1"))
    assert len(out.vectors) == 3 and all(len(v) == 384 for v in out.vectors)
    assert out.model == "sim-embed-1@2026-11-01" and out.prompt_tokens > 0
    assert out.cost == pytest.approx(out.prompt_tokens * 0.02 / 1_000_000)


def test_provider_error_survives_pickling() -> None:
    err = ProviderError("rate_limited", "slow down", retry_after=1.5, status_code=429, provider="openai", cost=0.1)
    back = pickle.loads(pickle.dumps(err))
    assert (back.error_class, back.retryable, back.retry_after, back.status_code, back.cost, str(back)) == (
        "rate_limited", True, 1.5, 429, 0.1, str(err))
