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
Nothing here imports an SDK until an adapter module is imported.
"""
