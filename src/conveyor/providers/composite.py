"""One provider made of two: chat from one, embeddings from another.

A pipeline can then extract with a remote LLM and embed with the local model::

    from conveyor.providers.composite import CompositeProvider
    from conveyor.providers.local_embeddings import LocalEmbeddings
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return CompositeProvider(chat=OpenAIProvider(), embed=LocalEmbeddings())

    pipe = Pipeline("manuals", provider=provider)
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from conveyor.providers.base import AsyncClosing, Completion, Embeddings, Message, Provider

NAME = "composite"


class CompositeProvider(AsyncClosing):
    """Delegates ``chat`` to ``chat`` and ``embed`` to ``embed``; options pass through unchanged::

        provider = CompositeProvider(chat=OpenAIProvider(url, key), embed=LocalEmbeddings())
        done = await provider.chat([{"role": "user", "content": "Hi"}], model="gpt-4o-mini")  # remote
        out = await provider.embed(["a chunk"])                                                # local
    """

    name = NAME

    def __init__(self, *, chat: Provider, embed: Provider) -> None:
        self.chat_provider = chat
        self.embed_provider = embed

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
        """The chat provider's completion."""
        return await self.chat_provider.chat(messages, model=model, max_tokens=max_tokens, temperature=temperature,
                                             json_mode=json_mode, prompt_version=prompt_version, timeout=timeout)

    async def embed(self, texts: Sequence[str], **options: Any) -> Embeddings:
        """The embed provider's vectors (``model`` and any other option passed as given)."""
        embed: Any = self.embed_provider.embed
        result: Embeddings = await embed(texts, **options)
        return result

    async def aclose(self) -> None:
        """Close both providers (once if they are the same object), where they can be closed."""
        providers = [self.chat_provider] if self.chat_provider is self.embed_provider else [
            self.chat_provider, self.embed_provider]
        for provider in providers:
            close = getattr(provider, "aclose", None)
            if close is not None:
                result = close()
                if inspect.isawaitable(result):
                    await result

    def __repr__(self) -> str:
        return f"CompositeProvider(chat={self.chat_provider!r}, embed={self.embed_provider!r})"
