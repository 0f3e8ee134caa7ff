"""Pick a provider from the environment.

``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` → OpenAIProvider (any OpenAI-compatible
endpoint, the simulator included); else ``ANTHROPIC_API_KEY`` → AnthropicProvider;
else a UserError saying what to set. ``CONVEYOR_PRICES`` may name a JSON price
table (see ``PriceTable``)::

    provider = provider_from_env()  # e.g. OPENAI_BASE_URL=http://127.0.0.1:8765/v1
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from conveyor.errors import UserError
from conveyor.providers.base import Prices, PriceTable, Provider

MISSING = (
    "no model provider configured: set OPENAI_BASE_URL and/or OPENAI_API_KEY (any OpenAI-compatible endpoint), "
    "or ANTHROPIC_API_KEY, or start `conveyor provider-sim` and set OPENAI_BASE_URL to the URL it prints"
)


def provider_from_env(env: Mapping[str, str] = os.environ, *, prices: Prices = None,
                      timeout: float = 60.0) -> Provider:
    """OpenAI-compatible when OPENAI_BASE_URL/OPENAI_API_KEY are set, else Anthropic, else UserError."""
    table = _prices(env, prices)
    base_url, key = env.get("OPENAI_BASE_URL") or None, env.get("OPENAI_API_KEY") or None
    if base_url or key:
        try:
            from conveyor.providers.openai_provider import PLACEHOLDER_KEY, OpenAIProvider
        except ImportError as exc:
            raise UserError("OPENAI_* is set but the openai package is missing: "
                            "pip install 'conveyor[providers]'") from exc
        return OpenAIProvider(base_url, key or PLACEHOLDER_KEY, prices=table, timeout=timeout)
    anthropic_key = env.get("ANTHROPIC_API_KEY") or None
    if anthropic_key:
        try:
            from conveyor.providers.anthropic_provider import AnthropicProvider
        except ImportError as exc:
            raise UserError("ANTHROPIC_API_KEY is set but the anthropic package is missing: "
                            "pip install 'conveyor[providers]'") from exc
        return AnthropicProvider(anthropic_key, env.get("ANTHROPIC_BASE_URL") or None, prices=table,
                                 timeout=timeout)
    raise UserError(MISSING)


def _prices(env: Mapping[str, str], prices: Prices) -> PriceTable:
    source: Prices = prices if prices is not None else (env.get("CONVEYOR_PRICES") or None)
    try:
        return PriceTable.load(source)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the price table {source!s}: {exc}") from exc
