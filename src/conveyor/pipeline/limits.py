"""Provider rate limits, declared per pipeline or given in the environment.

A limit is keyed by model (``"gpt-4o-mini"``), by provider and model
(``"openai/gpt-4o-mini"``), by provider (``"openai/*"``) or for every model
(``"*"``); the most specific key wins. Each model keeps a budget of its own
even when a wildcard declared it::

    pipe = Pipeline("manuals", limits={"gpt-4o-mini": RateLimit(tpm=2_000_000, rpm=5_000)})

``CONVEYOR_LIMITS`` holds the same as JSON and overrides the pipeline key by key::

    CONVEYOR_LIMITS='{"gpt-4o-mini": {"tpm": 2000000, "rpm": 5000, "interactive_share": 0.1}}'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.errors import PipelineError

ENV_VAR = "CONVEYOR_LIMITS"


@dataclass(frozen=True)
class RateLimit:
    """Tokens and requests per minute for one provider model, shared by the whole fleet.

    ``tpm``/``rpm`` of None means that dimension is not limited. While interactive
    work is about (an interactive call in the last minute), bulk calls may use only
    ``1 - interactive_share`` of each limit, so the interactive lane always finds room.
    ``spread=True`` also holds grants to a sixtieth of each limit per second, for providers that
    enforce a minute's limit in shorter periods (OpenAI documents that it may); without it the
    fleet may spend a minute's budget in its first seconds, which a sliding minute allows.
    """

    tpm: int | None = None
    rpm: int | None = None
    interactive_share: float = 0.1
    spread: bool = False

    def __post_init__(self) -> None:
        for name in ("tpm", "rpm"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise PipelineError(f"RateLimit({name}={value!r}): give a positive whole number, or None for no limit")
        if self.tpm is None and self.rpm is None:
            raise PipelineError("RateLimit() limits nothing: give tpm=, rpm= or both")
        if not 0.0 <= self.interactive_share < 1.0:
            raise PipelineError(f"RateLimit(interactive_share={self.interactive_share!r}) must be in [0, 1)")


def parse_limits(raw: str | Mapping[str, Any] | None, source: str = ENV_VAR) -> dict[str, RateLimit]:
    """``{"model": {"tpm": N, "rpm": N, "interactive_share": F}}`` (JSON text or a dict) → limits."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise PipelineError(f"{source} is not JSON ({exc}); write it as "
                                '\'{"MODEL": {"tpm": 200000, "rpm": 1000}}\'') from None
    if not isinstance(raw, Mapping):
        raise PipelineError(f'{source} must be a JSON object of model -> {{"tpm": N, "rpm": N}}')
    limits = {}
    for key, value in raw.items():
        if isinstance(value, RateLimit):
            limits[str(key)] = value
            continue
        if not isinstance(value, Mapping) or not set(value) <= {"tpm", "rpm", "interactive_share", "spread"}:
            raise PipelineError(f'{source}[{key!r}] must be an object with "tpm", "rpm", "interactive_share" '
                                'and/or "spread"')
        try:
            limits[str(key)] = RateLimit(**value)
        except PipelineError as exc:
            raise PipelineError(f"{source}[{key!r}]: {exc}") from None
    return limits


def find_limit(limits: Mapping[str, RateLimit], provider: str, model: str) -> RateLimit | None:
    """The most specific limit for ``provider``'s ``model``, or None."""
    for key in (f"{provider}/{model}", model, f"{provider}/*", "*"):
        if key in limits:
            return limits[key]
    return None
