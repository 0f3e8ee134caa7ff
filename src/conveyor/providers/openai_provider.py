"""Any OpenAI-compatible endpoint (OpenAI, Azure, vLLM, Ollama, llama.cpp) through the ``openai`` SDK.

The SDK's own retries are off (``max_retries=0``): conveyor owns retries. Every
SDK exception becomes a ``ProviderError`` (see ``errormap`` for the table).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import openai

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

NAME = "openai"
PLACEHOLDER_KEY = "not-needed"  # local servers (vLLM, Ollama, llama.cpp) accept any key


class OpenAIProvider(AsyncClosing):
    """Chat/JSON completions and embeddings from an OpenAI-compatible endpoint.

    Example (the simulator, or any server speaking the OpenAI API)::

        provider = OpenAIProvider("http://127.0.0.1:8765/v1", "sim",
                                  prices={"sim-1": {"input": 0.15, "output": 0.6}})
        done = await provider.chat([{"role": "user", "content": "Extract the part numbers"}],
                                   model="sim-1", json_mode=True, prompt_version="extract@3")
        done.data, done.cost, done.model  # parsed object, USD, "sim-1@2026-11-01"

    Azure: pass ``client=openai.AsyncAzureOpenAI(...)``; any client given is copied with ``max_retries=0``.
    """

    name = NAME

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        prices: Prices = None,
        timeout: float = 60.0,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self.prices = PriceTable.load(prices)
        self.timeout = timeout
        if client is not None:
            self._client = client.with_options(max_retries=0)
            return
        if api_key is None and base_url is not None:
            import os

            api_key = os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_KEY
        try:
            self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
        except openai.OpenAIError as exc:
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
        """One completion; in JSON mode ``data`` is the parsed object or ProviderError('malformed_output')."""
        kwargs: dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages],
                                  "max_tokens": max_tokens, "temperature": temperature}
        if json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        if timeout is not None:
            kwargs["timeout"] = timeout
        started = time.monotonic()
        try:
            async with deadline(timeout or self.timeout, NAME):
                raw = await self._client.chat.completions.with_raw_response.create(**kwargs)
                done = await parsed(raw)
        except openai.OpenAIError as exc:
            raise map_error(exc) from exc
        latency = time.monotonic() - started
        return self._completion(done, raw.headers, model, json_mode, prompt_version, latency)

    def _completion(self, done: Any, headers: Any, model: str, json_mode: bool,
                    prompt_version: str | None, latency: float, discount: float = 1.0) -> Completion:
        usage = done.usage
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        reported = str(done.model or model)
        cost, priced = self.prices.cost_for(model, reported, prompt, completion)
        cost *= discount  # a batch answer's: the price table's batch_discount
        request_id = header(headers, "x-request-id") or getattr(done, "id", None)
        choice = done.choices[0] if done.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        finish = choice.finish_reason if choice is not None else None
        refusal = getattr(choice.message, "refusal", None) if choice is not None else None

        def fail(error_class: str, message: str, answer: Completion | None = None) -> ProviderError:
            return ProviderError(error_class, message, provider=NAME, model=reported, request_id=request_id,
                                 prompt_tokens=prompt, completion_tokens=completion, cost=cost,
                                 priced=priced, answer=answer)

        if finish == "content_filter" or refusal:
            raise fail("content_policy", f"the completion was refused or filtered: {refusal or finish}")
        answer = Completion(text=text, data=None, model=reported, prompt_tokens=prompt, completion_tokens=completion,
                            cost=cost, request_id=request_id, prompt_version=prompt_version, latency=latency,
                            finish_reason=finish, revision=getattr(done, "system_fingerprint", None),
                            priced=priced, limits=rate_limits(headers))
        if not json_mode:
            return answer
        if finish == "length":
            raise fail("malformed_output", f"JSON cut off at max_tokens after {completion} tokens", answer)
        data = parse_json_object(text)
        if data is None:
            raise fail("malformed_output", f"JSON mode answer is not a JSON object: {text[:120]!r}", answer)
        return replace(answer, data=data)

    async def embed(self, texts: Sequence[str], *, model: str) -> Embeddings:
        """Vectors for ``texts`` (one request; batch upstream for very large inputs)."""
        started = time.monotonic()
        try:
            async with deadline(self.timeout, NAME):
                raw = await self._client.embeddings.with_raw_response.create(
                    model=model, input=list(texts), encoding_format="float")
                done = await parsed(raw)
        except openai.OpenAIError as exc:
            raise map_error(exc) from exc
        latency = time.monotonic() - started
        rows = sorted(done.data, key=lambda d: d.index)
        vectors = [list(row.embedding) for row in rows]
        prompt = int(getattr(done.usage, "prompt_tokens", 0) or 0)
        reported = str(done.model or model)
        cost, priced = self.prices.cost_for(model, reported, prompt, 0)
        request_id = header(raw.headers, "x-request-id")
        return Embeddings(vectors=vectors, model=reported, prompt_tokens=prompt, cost=cost,
                          request_id=request_id, latency=latency, priced=priced)

    def batch_api(self) -> Any:
        """This endpoint's Batch API (``/v1/files`` + ``/v1/batches``), for the provider batch lane."""
        from conveyor.providers.openai_batch import OpenAIBatches

        return OpenAIBatches(self)

    async def aclose(self) -> None:
        await self._client.close()


def map_error(exc: openai.OpenAIError) -> ProviderError:
    """The ProviderError for an exception of the openai SDK."""
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("timeout", str(exc), provider=NAME)
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError("connection", f"{exc} {exc.__cause__ or ''}", provider=NAME)
    if isinstance(exc, openai.APIStatusError):
        typ, code, msg = body_fields(exc.body)
        return from_status(NAME, exc.status_code, message=msg or exc.message, error_type=typ,
                           code=code or exc.code, headers=exc.response.headers)
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError("server_error", str(exc), status_code=exc.status_code, provider=NAME)
    return ProviderError("bad_request", str(exc), provider=NAME)
