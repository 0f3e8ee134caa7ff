"""Anthropic's Messages API through the ``anthropic`` SDK, with the SDK's retries off.

System messages become the ``system`` parameter. JSON mode is an instruction
plus strict parsing of the answer (code fences and surrounding prose are
tolerated; anything that is not one JSON object is ``malformed_output``).
Anthropic has no embeddings endpoint: ``embed`` raises a terminal bad_request.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import anthropic
from anthropic.resources.messages import AsyncMessages

from conveyor.providers.base import (
    AsyncClosing,
    Completion,
    Embeddings,
    Message,
    Prices,
    PriceTable,
    ProviderError,
    deadline,
    parsed,
)
from conveyor.providers.errormap import body_fields, from_status, parse_json_object
from conveyor.providers.headers import header, rate_limits

NAME = "anthropic"
# Recent SDKs (2.x) dropped sampling parameters from messages.create; send temperature only where it exists.
_SDK_TAKES_TEMPERATURE = "temperature" in inspect.signature(AsyncMessages.create).parameters
JSON_INSTRUCTION = (
    "Answer with exactly one JSON object and nothing else: no prose, no code fences, no comments."
)


class AnthropicProvider(AsyncClosing):
    """Chat/JSON completions from Anthropic's Messages API.

    Example::

        provider = AnthropicProvider(prices={"claude-sonnet-4-5": {"input": 3.0, "output": 15.0}})
        done = await provider.chat([{"role": "system", "content": "You extract part numbers."},
                                    {"role": "user", "content": manual_text}],
                                   model="claude-sonnet-4-5", json_mode=True, prompt_version="parts@2")
        done.data, done.prompt_tokens, done.cost
    """

    name = NAME

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        prices: Prices = None,
        timeout: float = 60.0,
        client: anthropic.AsyncAnthropic | None = None,
    ) -> None:
        self.prices = PriceTable.load(prices)
        self.timeout = timeout
        if client is not None:
            self._client = client.with_options(max_retries=0)
            return
        try:
            self._client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0,
                                                    timeout=timeout)
        except anthropic.AnthropicError as exc:
            raise ProviderError("auth", str(exc), provider=NAME) from exc

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_mode: bool = False,
        prompt_version: str | None = None,
        timeout: float | None = None,
    ) -> Completion:
        """One message; in JSON mode ``data`` is the parsed object or ProviderError('malformed_output')."""
        kwargs = self.params(messages, model=model, max_tokens=max_tokens, temperature=temperature,
                             json_mode=json_mode)
        if timeout is not None:
            kwargs["timeout"] = timeout
        started = time.monotonic()
        try:
            async with deadline(timeout or self.timeout, NAME):
                raw = await self._client.messages.with_raw_response.create(**kwargs)
                done = await parsed(raw)
        except anthropic.AnthropicError as exc:
            raise map_error(exc) from exc
        latency = time.monotonic() - started
        return self._completion(done, raw.headers, model, json_mode, prompt_version, latency)

    @staticmethod
    def params(messages: Sequence[Message], *, model: str, max_tokens: int, temperature: float,
               json_mode: bool) -> dict[str, Any]:
        """The Messages API parameters of a chat call (a batch request's ``params`` too)."""
        system, turns = split_system(messages)
        if json_mode:
            system = f"{system}\n\n{JSON_INSTRUCTION}" if system else JSON_INSTRUCTION
        kwargs: dict[str, Any] = {"model": model, "messages": turns, "max_tokens": max_tokens}
        if _SDK_TAKES_TEMPERATURE:
            kwargs["temperature"] = temperature
        if system:
            kwargs["system"] = system
        return kwargs

    def batch_api(self) -> Any:
        """Anthropic's Message Batches API, for the provider batch lane."""
        from conveyor.providers.anthropic_batch import AnthropicBatches

        return AnthropicBatches(self)

    def _completion(self, done: Any, headers: Any, model: str, json_mode: bool,
                    prompt_version: str | None, latency: float, discount: float = 1.0) -> Completion:
        usage = done.usage
        prompt = sum(int(getattr(usage, k, 0) or 0) for k in
                     ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
        completion = int(getattr(usage, "output_tokens", 0) or 0)
        reported = str(done.model or model)
        cost, priced = self.prices.cost_for(model, reported, prompt, completion)
        cost *= discount  # a batch answer's: the price table's batch_discount
        request_id = header(headers, "request-id") or getattr(done, "id", None)
        text = "".join(getattr(b, "text", "") for b in done.content if getattr(b, "type", "") == "text")
        stop = done.stop_reason

        def fail(error_class: str, message: str, answer: Completion | None = None) -> ProviderError:
            return ProviderError(error_class, message, provider=NAME, model=reported, request_id=request_id,
                                 prompt_tokens=prompt, completion_tokens=completion, cost=cost,
                                 priced=priced, answer=answer)

        if stop == "refusal":
            raise fail("content_policy", "the model refused to answer (stop_reason=refusal)")
        answer = Completion(text=text, data=None, model=reported, prompt_tokens=prompt, completion_tokens=completion,
                            cost=cost, request_id=request_id, prompt_version=prompt_version, latency=latency,
                            finish_reason=stop, priced=priced, limits=rate_limits(headers))
        if not json_mode:
            return answer
        if stop == "max_tokens":
            raise fail("malformed_output", f"JSON cut off at max_tokens after {completion} tokens", answer)
        data = parse_json_object(text, lenient=True)
        if data is None:
            raise fail("malformed_output", f"JSON mode answer is not a JSON object: {text[:120]!r}", answer)
        return replace(answer, data=data)

    async def embed(self, texts: Sequence[str], *, model: str) -> Embeddings:
        """Always fails: Anthropic has no embeddings endpoint."""
        raise ProviderError("bad_request", "Anthropic has no embeddings endpoint; use an OpenAI-compatible "
                            "provider or a local embeddings model", retryable=False, provider=NAME)

    async def aclose(self) -> None:
        await self._client.close()


def split_system(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system text, the other turns): Anthropic takes the system prompt as a parameter."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "system":
            content = message.get("content")
            system.append(content if isinstance(content, str) else
                          "".join(p.get("text", "") for p in content or [] if isinstance(p, dict)))
        else:
            turns.append({"role": message.get("role", "user"), "content": message.get("content", "")})
    return "\n\n".join(s for s in system if s), turns


def map_error(exc: anthropic.AnthropicError) -> ProviderError:
    """The ProviderError for an exception of the anthropic SDK."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError("timeout", str(exc), provider=NAME)
    if isinstance(exc, anthropic.APIConnectionError):
        return ProviderError("connection", f"{exc} {exc.__cause__ or ''}", provider=NAME)
    if isinstance(exc, anthropic.APIStatusError):
        typ, code, msg = body_fields(exc.body)
        return from_status(NAME, exc.status_code, message=msg or exc.message, error_type=typ, code=code,
                           headers=exc.response.headers)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return ProviderError("server_error", str(exc), status_code=exc.status_code, provider=NAME)
    return ProviderError("bad_request", str(exc), provider=NAME)
