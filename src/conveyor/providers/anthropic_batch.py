"""Anthropic's Message Batches API (``client.messages.batches``) for the provider batch lane.

Message batches carry no metadata, so the tag cannot travel with them: a keeper that died between creating a
batch and recording its id adopts, on recovery, a batch created since just before the batch was recorded that
holds as many requests (``find``); when it ends, any of our requests it does not answer is called directly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anthropic
from anthropic.types import Message as AnthropicMessage

from conveyor.providers.base import Completion, ProviderError
from conveyor.providers.batchapi import BatchEntry, BatchLimits, BatchState
from conveyor.providers.errormap import from_status

if TYPE_CHECKING:
    from conveyor.providers.anthropic_provider import AnthropicProvider

NAME = "anthropic"
LIMITS = BatchLimits(100_000, 256 * 2**20)
LIST_SKEW_S = 600
# The HTTP status each error type of an errored entry stands for (errormap reads statuses).
STATUS_OF = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
             "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
             "overloaded_error": 529, "timeout_error": 504}


class AnthropicBatches:
    """Message batches through an AnthropicProvider's client and prices."""

    name = NAME
    limits = LIMITS

    def __init__(self, provider: AnthropicProvider) -> None:
        self.provider = provider
        self.client = provider._client

    def body(self, messages: Sequence[Any], options: dict[str, Any]) -> dict[str, Any]:
        return self.provider.params(messages, model=str(options["model"]),
                                    max_tokens=int(options.get("max_tokens", 512)),
                                    temperature=float(options.get("temperature", 0.0)),
                                    json_mode=bool(options.get("json_mode")))

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes:
        record = {"custom_id": custom_id, "params": body}
        return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    async def create(self, model: str, lines: Sequence[bytes], tag: str) -> BatchState:
        requests: Any = [json.loads(line) for line in lines]
        try:
            return _state(await self.client.messages.batches.create(requests=requests))
        except anthropic.AnthropicError as exc:
            raise _error(exc) from exc

    async def find(self, tag: str, since: float, requests: int) -> BatchState | None:
        try:
            async for batch in self.client.messages.batches.list(limit=100):
                created = _epoch(batch.created_at)
                if created < since - LIST_SKEW_S:
                    return None
                if _total(batch) == requests:
                    return _state(batch)
        except anthropic.AnthropicError as exc:
            raise _error(exc) from exc
        return None

    async def status(self, batch_id: str) -> BatchState:
        try:
            return _state(await self.client.messages.batches.retrieve(batch_id))
        except anthropic.AnthropicError as exc:
            raise _error(exc) from exc

    async def results(self, batch_id: str, custom_ids: Sequence[str]) -> list[BatchEntry]:
        found: dict[str, BatchEntry] = {}
        try:
            async for item in await self.client.messages.batches.results(batch_id):
                found[item.custom_id] = _entry(item)
        except anthropic.AnthropicError as exc:
            raise _error(exc) from exc
        return [found.get(c) or BatchEntry(c, None, expired=True) for c in custom_ids]

    def completion(self, body: dict[str, Any], options: dict[str, Any]) -> Completion:
        done = AnthropicMessage.model_validate(body)
        return self.provider._completion(done, {}, str(options["model"]), bool(options.get("json_mode")),
                                         options.get("prompt_version"), 0.0,
                                         discount=self.provider.prices.batch_discount)


def _total(batch: Any) -> int:
    c = batch.request_counts
    return int(c.processing + c.succeeded + c.errored + c.canceled + c.expired)


def _epoch(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


def _state(batch: Any) -> BatchState:
    status = str(batch.processing_status)
    return BatchState(str(batch.id), status, status == "ended")


def _entry(item: Any) -> BatchEntry:
    result = item.result
    if result.type == "succeeded":
        return BatchEntry(item.custom_id, result.message.model_dump(mode="json"))
    if result.type == "errored":
        inner = getattr(result.error, "error", None)
        kind, message = str(getattr(inner, "type", "api_error")), str(getattr(inner, "message", ""))
        return BatchEntry(item.custom_id, None, from_status(NAME, STATUS_OF.get(kind, 500), message=message,
                                                            error_type=kind))
    return BatchEntry(item.custom_id, None, expired=True)  # expired, or canceled: called directly


def _error(exc: anthropic.AnthropicError) -> ProviderError:
    from conveyor.providers.anthropic_provider import map_error

    return map_error(exc)
