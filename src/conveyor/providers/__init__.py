"""Model providers: adapters on the official SDKs, and a local OpenAI-compatible simulator.

The simulator lives in ``conveyor.providers.simulator`` and needs the ``sim``
extra (fastapi, uvicorn, openai); nothing here imports it.

The adapter layer (the ``providers`` extra: openai, anthropic), one module each:

- ``base``: ``Completion``, ``Embeddings``, the ``Provider`` protocol
  (``chat``, ``embed``), ``PriceTable`` (USD per 1M tokens per model) and
  ``ProviderError`` (``error_class``, ``retryable``, ``retry_after``,
  ``status_code``, ``provider``; usage and cost of an answered attempt).
- ``openai_provider``: ``OpenAIProvider``, any OpenAI-compatible endpoint.
- ``anthropic_provider``: ``AnthropicProvider``, the Messages API (no embeddings).
- ``errormap``: HTTP answers → error classes; strict JSON-object parsing.
- ``headers``: Retry-After and the x-ratelimit-* / anthropic-ratelimit-* headers.
- ``factory``: ``provider_from_env()`` from OPENAI_* / ANTHROPIC_API_KEY.

The SDKs' own retries are off (``max_retries=0``); conveyor owns retries.
Nothing here imports an SDK until an adapter is first used: ``OpenAIProvider``,
``AnthropicProvider`` and ``LocalEmbeddings`` are imported on first access::

    from conveyor.providers import OpenAIProvider, PriceTable  # imports openai only now
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.lazy import lazy_names
from conveyor.providers.base import (
    ERROR_CLASSES,
    Completion,
    Embeddings,
    Price,
    PriceTable,
    Provider,
    ProviderError,
)
from conveyor.providers.composite import CompositeProvider
from conveyor.providers.factory import provider_from_env

if TYPE_CHECKING:
    from conveyor.providers.anthropic_provider import AnthropicProvider
    from conveyor.providers.local_embeddings import LocalEmbeddings
    from conveyor.providers.openai_provider import OpenAIProvider

__all__ = [
    "ERROR_CLASSES", "AnthropicProvider", "Completion", "CompositeProvider", "Embeddings", "LocalEmbeddings",
    "OpenAIProvider", "Price", "PriceTable", "Provider", "ProviderError", "provider_from_env",
]

# The SDK-backed adapters, by the module that defines each: imported when the name is first used.
_LAZY = {
    "OpenAIProvider": "conveyor.providers.openai_provider",
    "AnthropicProvider": "conveyor.providers.anthropic_provider",
    "LocalEmbeddings": "conveyor.providers.local_embeddings",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)
