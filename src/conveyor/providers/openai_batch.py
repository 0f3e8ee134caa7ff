"""The OpenAI Batch API (``/v1/files`` + ``/v1/batches``) for the provider batch lane, on the ``openai`` SDK.

One batch file per model (the API takes one model per batch), chat completions only; each batch carries
``metadata={"conveyor_tag": TAG}``, the hash of its content, so a batch created by a keeper that died before
recording its id is found again (``find``) and adopted rather than paid for twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import openai
from openai.types.chat import ChatCompletion

from conveyor.providers.base import Completion, ProviderError
from conveyor.providers.batchapi import BatchEntry, BatchLimits, BatchState
from conveyor.providers.errormap import body_fields, from_status

if TYPE_CHECKING:
    from conveyor.providers.openai_provider import OpenAIProvider

NAME = "openai"
ENDPOINT: Final = "/v1/chat/completions"
WINDOW: Final = "24h"
TAG_KEY = "conveyor_tag"
LIMITS = BatchLimits(50_000, 200 * 2**20)
ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
LIST_PAGE = 100
LIST_SKEW_S = 600  # batches created this long before our record are still looked at when adopting


class OpenAIBatches:
    """Batches of chat completions through an OpenAIProvider's client and prices."""

    name = NAME
    limits = LIMITS

    def __init__(self, provider: OpenAIProvider) -> None:
        self.provider = provider
        self.client = provider._client

    def body(self, messages: Sequence[Any], options: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": options["model"], "messages": [dict(m) for m in messages],
                                "max_tokens": int(options.get("max_tokens", 512)),
                                "temperature": float(options.get("temperature", 0.0))}
        if options.get("json_mode"):
            body["response_format"] = {"type": "json_object"}
        return body

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes:
        record = {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body}
        return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    async def create(self, model: str, lines: Sequence[bytes], tag: str) -> BatchState:
        try:
            uploaded = await self.client.files.create(file=(f"conveyor-{tag}.jsonl", b"".join(lines)),
                                                      purpose="batch")
            batch = await self.client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT,
                                                     completion_window=WINDOW, metadata={TAG_KEY: tag})
        except openai.OpenAIError as exc:
            raise _error(exc) from exc
        return _state(batch)

    async def find(self, tag: str, since: float, requests: int) -> BatchState | None:
        """The batch tagged ``tag``, looking back to batches created a little before ``since``."""
        try:
            async for batch in self.client.batches.list(limit=LIST_PAGE):
                if (batch.metadata or {}).get(TAG_KEY) == tag:
                    return _state(batch)
                if batch.created_at < since - LIST_SKEW_S:
                    return None
        except openai.OpenAIError as exc:
            raise _error(exc) from exc
        return None

    async def status(self, batch_id: str) -> BatchState:
        try:
            return _state(await self.client.batches.retrieve(batch_id))
        except openai.OpenAIError as exc:
            raise _error(exc) from exc

    async def results(self, batch_id: str, custom_ids: Sequence[str]) -> list[BatchEntry]:
        """Every entry of an ended batch: from its output and error files; an entry in neither was not run (the
        batch expired, was cancelled or failed as a whole): ``expired``, to be called directly."""
        try:
            batch = await self.client.batches.retrieve(batch_id)
            found: dict[str, BatchEntry] = {}
            for file_id in (batch.output_file_id, batch.error_file_id):
                if file_id:
                    content = await self.client.files.content(file_id)
                    for raw in content.text.splitlines():
                        if raw.strip():
                            entry = _entry(json.loads(raw))
                            found[entry.custom_id] = entry
        except openai.OpenAIError as exc:
            raise _error(exc) from exc
        return [found.get(c) or BatchEntry(c, None, expired=True) for c in custom_ids]

    def completion(self, body: dict[str, Any], options: dict[str, Any]) -> Completion:
        done = ChatCompletion.model_validate(body)
        return self.provider._completion(done, {}, str(options["model"]), bool(options.get("json_mode")),
                                         options.get("prompt_version"), 0.0,
                                         discount=self.provider.prices.batch_discount)


def _state(batch: Any) -> BatchState:
    return BatchState(str(batch.id), str(batch.status), str(batch.status) in ENDED)


def _entry(line: dict[str, Any]) -> BatchEntry:
    custom_id = str(line.get("custom_id"))
    error, response = line.get("error"), line.get("response") or {}
    if error:
        code = str(error.get("code") or "") if isinstance(error, dict) else ""
        if code == "batch_expired":
            return BatchEntry(custom_id, None, expired=True)
        message = str(error.get("message") or code) if isinstance(error, dict) else str(error)
        return BatchEntry(custom_id, None, ProviderError("server_error", message, provider=NAME))
    status, body = int(response.get("status_code") or 0), response.get("body")
    if status == 200 and isinstance(body, dict):
        return BatchEntry(custom_id, body)
    typ, kind, msg = body_fields(body)
    return BatchEntry(custom_id, None, from_status(NAME, status or 500, message=msg or f"HTTP {status}",
                                                  error_type=typ, code=kind))


def _error(exc: openai.OpenAIError) -> ProviderError:
    from conveyor.providers.openai_provider import map_error

    return map_error(exc)
