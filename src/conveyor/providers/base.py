"""The provider contract: results, the Provider protocol, prices and ProviderError.

Nothing here imports an SDK; the adapters (openai_provider, anthropic_provider)
do, and only when they are imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

from conveyor.retry_after import sane_delay

Message = Mapping[str, Any]

RETRYABLE = frozenset({"rate_limited", "overloaded", "timeout", "connection", "server_error", "malformed_output"})
TERMINAL = frozenset({"bad_request", "auth", "content_policy", "context_length", "not_found"})
ERROR_CLASSES = RETRYABLE | TERMINAL
DEADLINE_GRACE_S = 1.0
DEFAULT_BATCH_DISCOUNT = 0.5  # what OpenAI's and Anthropic's Batch APIs charge of the direct price


@dataclass(frozen=True)
class Completion:
    """One chat completion, with what it cost and what produced it.

    ``data`` is the parsed JSON object in JSON mode (never a malformed one: that
    raises ``ProviderError('malformed_output')``), else None. ``model`` is what
    the provider reports (``gpt-4o-2024-08-06``, ``sim-1@2026-11-01``);
    ``limits`` holds the rate-limit headers read from the response::

        done = await provider.chat([{"role": "user", "content": "Hi"}], model="gpt-4o-mini")
        print(done.text, done.prompt_tokens, done.completion_tokens, done.cost)
    """

    text: str
    data: dict[str, Any] | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost: float
    request_id: str | None
    prompt_version: str | None
    latency: float
    finish_reason: str | None = None
    revision: str | None = None
    priced: bool = True
    limits: dict[str, float] | None = None


@dataclass(frozen=True)
class Embeddings:
    """Vectors for a batch of texts, in input order::

        out = await provider.embed(["a manual", "a chunk"], model="text-embedding-3-small")
        len(out.vectors), len(out.vectors[0])
    """

    vectors: list[list[float]]
    model: str
    prompt_tokens: int
    cost: float
    request_id: str | None = None
    latency: float = 0.0
    priced: bool = True


@runtime_checkable
class Provider(Protocol):
    """What stages call through ``ctx``: chat/JSON completions and embeddings."""

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
    ) -> Completion: ...

    async def embed(self, texts: Sequence[str], *, model: str) -> Embeddings: ...


class AsyncClosing:
    """``async with provider:`` closes the provider (``aclose``) on the way out."""

    async def aclose(self) -> None:
        """Release the provider's connections; nothing to release by default."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class ProviderError(Exception):
    """A provider call failed; ``error_class`` is the contract the engine reads.

    Retryable: rate_limited, overloaded, timeout, connection, server_error,
    malformed_output. Terminal: bad_request, auth, content_policy,
    context_length, not_found. An attempt that was answered (a malformed or
    truncated completion) still carries its usage and cost for accounting, and
    ``priced`` is False when its model had no price (its ``cost`` is then 0.0);
    a malformed JSON-mode answer carries the ``answer`` itself (``data`` None)::

        raise ProviderError("rate_limited", "429 from openai", retry_after=2.0, status_code=429)
    """

    def __init__(
        self,
        error_class: str,
        message: str = "",
        *,
        retryable: bool | None = None,
        retry_after: float | None = None,
        status_code: int | None = None,
        provider: str = "",
        model: str | None = None,
        request_id: str | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cost: float = 0.0,
        priced: bool = True,
        answer: Completion | None = None,
    ) -> None:
        self.error_class = error_class
        self.retryable = error_class in RETRYABLE if retryable is None else retryable
        self.retry_after = sane_delay(retry_after)  # None (normal backoff) unless finite and >= 0; at most a day
        self.status_code = status_code
        self.provider = provider
        self.model = model
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cost = cost
        self.priced = priced
        # A JSON-mode answer that was answered but is not one JSON object (cut off, fenced, chatty): its text,
        # so a stage behind an acceptance boundary can hand it to the judge, which may repair its format.
        self.answer = answer
        self.detail = " ".join(str(message).split())[:500]
        super().__init__(self._line())

    def _line(self) -> str:
        head = f"{self.provider} {self.error_class}" if self.provider else self.error_class
        parts = [head + (f" (HTTP {self.status_code})" if self.status_code else "")]
        if self.retry_after is not None:
            parts.append(f"retry after {self.retry_after:.3g}s")
        return ", ".join(parts) + (f": {self.detail}" if self.detail else "")

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {k: v for k, v in self.__dict__.items() if k not in ("error_class", "detail")}
        return (_rebuild, (self.error_class, self.detail, kwargs))


@contextlib.asynccontextmanager
async def deadline(seconds: float, provider: str) -> AsyncIterator[None]:
    """A wall-clock cap just above the SDK's per-phase timeout, so a trickling answer cannot hold a task."""
    try:
        async with asyncio.timeout(seconds + DEADLINE_GRACE_S):
            yield
    except TimeoutError as exc:
        raise ProviderError("timeout", f"no complete answer within {seconds:g}s", provider=provider) from exc


async def parsed(raw: Any) -> Any:
    """The parsed body of an SDK raw response: ``parse()`` is sync in some SDK releases, async in others."""
    value = raw.parse()
    return await value if inspect.isawaitable(value) else value


def _rebuild(error_class: str, message: str, kwargs: dict[str, Any]) -> ProviderError:
    return ProviderError(error_class, message, **kwargs)


@dataclass(frozen=True)
class Price:
    """USD per one million input and output tokens."""

    input: float
    output: float = 0.0


@dataclass
class PriceTable:
    """USD per 1M tokens, per model; an unknown model costs 0.0 and is remembered in ``unknown``.

    Lookup tries the exact name, then the name before ``@`` (a revision), then
    the longest known prefix ending at a ``-`` (``gpt-4o-2024-08-06`` → ``gpt-4o``).
    ``batch_discount`` is the share of the price a provider's Batch API charges (0.5: half)::

        prices = PriceTable.from_dict({"gpt-4o-mini": {"input": 0.15, "output": 0.60}})
        prices.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0)  # 0.15
        PriceTable.from_dict({"batch_discount": 0.5, "models": {"gpt-4o-mini": [0.15, 0.6]}})
    """

    prices: dict[str, Price] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)
    batch_discount: float = DEFAULT_BATCH_DISCOUNT

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PriceTable:
        """``{"model": {"input": 2.5, "output": 10.0}}`` or ``{"model": [2.5, 10.0]}``; optionally
        ``{"batch_discount": 0.5, "models": {...}}``."""
        table = raw.get("models", raw) if isinstance(raw.get("models"), Mapping) else raw
        discount = _discount(raw.get("batch_discount", DEFAULT_BATCH_DISCOUNT))
        return cls({str(name): _price(name, value) for name, value in table.items() if name != "batch_discount"},
                   batch_discount=discount)

    @classmethod
    def from_json(cls, path: str | Path) -> PriceTable:
        """Load the same shape as ``from_dict`` from a JSON file."""
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a price table must be a JSON object of model -> prices")
        return cls.from_dict(raw)

    @classmethod
    def load(cls, source: PriceTable | Mapping[str, Any] | str | Path | None) -> PriceTable:
        """A table from a table, a dict, a JSON file path, or nothing (empty: everything costs 0.0)."""
        if source is None:
            return cls()
        if isinstance(source, PriceTable):
            return source
        if isinstance(source, Mapping):
            return cls.from_dict(source)
        return cls.from_json(source)

    def find(self, model: str) -> Price | None:
        if model in self.prices:
            return self.prices[model]
        base = model.split("@", 1)[0]
        if base in self.prices:
            return self.prices[base]
        best = max((k for k in self.prices if base.startswith(k + "-")), key=len, default=None)
        return self.prices[best] if best is not None else None

    def known(self, model: str) -> bool:
        return self.find(model) is not None

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int = 0) -> float:
        """USD for one call; 0.0 (and ``model`` added to ``unknown``) when the model has no price."""
        price = self.find(model)
        if price is None:
            self.unknown.add(model)
            return 0.0
        return (prompt_tokens * price.input + completion_tokens * price.output) / 1_000_000

    def cost_for(self, requested: str, reported: str, prompt_tokens: int, completion_tokens: int) -> tuple[float, bool]:
        """Cost by the requested model's price, else the reported one's; and whether a price was found."""
        name = requested if self.known(requested) or not reported else reported
        priced = self.known(name)
        return self.cost(name, prompt_tokens, completion_tokens), priced


def _discount(value: Any) -> float:
    try:
        discount = float(value)
    except (TypeError, ValueError):
        discount = -1.0
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"batch_discount {value!r}: expected the share of the price a batch call costs, 0 to 1")
    return discount


def _price(name: object, value: Any) -> Price:
    try:
        if isinstance(value, Mapping):
            return Price(float(value["input"]), float(value.get("output", 0.0)))
        if isinstance(value, (list, tuple)) and 1 <= len(value) <= 2:
            return Price(*(float(v) for v in value))
        return Price(float(value))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"price of {name!r}: expected {{'input': USD, 'output': USD}} per 1M tokens") from exc


Prices = PriceTable | Mapping[str, Any] | str | Path | None
