"""What a worker process shares with its stages: the model provider, made once, on first use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.pipeline import Pipeline


class Services:
    def __init__(self, pipeline: Pipeline) -> None:
        self._factory: Callable[[], Any] | None = pipeline.provider_factory
        self._provider: Any = None

    def provider(self) -> Any:
        if self._provider is None:
            if self._factory is None:
                from conveyor.providers.factory import provider_from_env

                self._factory = provider_from_env
            self._provider = self._factory()
        return self._provider


@dataclass
class Usage:
    """Tokens and cost of every provider call one attempt made, failed calls included."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    models: set[str] = field(default_factory=set)
    prompt_versions: set[str] = field(default_factory=set)

    def add(self, result: Any, prompt_version: str | None = None) -> None:
        self.calls += 1
        self.prompt_tokens += int(getattr(result, "prompt_tokens", 0) or 0)
        self.completion_tokens += int(getattr(result, "completion_tokens", 0) or 0)
        self.cost += float(getattr(result, "cost", 0.0) or 0.0)
        model = getattr(result, "model", None)
        if model:
            self.models.add(str(model))
        if prompt_version:
            self.prompt_versions.add(prompt_version)
