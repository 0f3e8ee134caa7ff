"""Embedding a search query with the model that made a collection's vectors.

``conveyor search --semantic`` must put the query in the same space as the published vectors, so it asks the
model each version recorded (``Record(embedding_model=...)``). Who serves that model: the provider of the
pipeline that published the collection, when it is given (``--pipeline TARGET``; the HTTP service uses the
pipelines it serves), so a model behind an endpoint (the simulator's ``sim-embed``) is reached as the workers
reached it; otherwise the local all-MiniLM-L6-v2 (providers/local_embeddings.py), loaded once per process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from conveyor.errors import UserError
from conveyor.pipeline import Pipeline
from conveyor.providers.base import ProviderError

Embedder = Callable[[str, str], Sequence[float]]  # (model, text) -> the text's vector


def query_embedder(pipeline: Pipeline | None = None) -> Embedder:
    """An embedder through ``pipeline``'s provider (when it declares one), else through the local model."""

    def embed(model: str, text: str) -> Sequence[float]:
        vector: Sequence[float] = _blocking(_embed(pipeline, model, text))
        return vector

    return embed


async def _embed(pipeline: Pipeline | None, model: str, text: str) -> Sequence[float]:
    provider = _provider(pipeline, model)
    try:
        out = await provider.embed([text], model=model)
    except ProviderError as exc:
        raise UserError(f"could not embed the query with {model!r} ({exc.error_class}: {exc}); check that the "
                        "provider that made the collection's vectors is reachable") from None
    finally:
        close = getattr(provider, "aclose", None)
        if close is not None and provider is not _LOCAL.get(model):
            await close()
    if len(out.vectors) != 1 or not out.vectors[0]:
        raise UserError(f"the provider answered {len(out.vectors)} vectors for one query with {model!r}")
    return [float(x) for x in out.vectors[0]]


_LOCAL: dict[str, Any] = {}  # local providers by model: the model stays loaded between queries


def _provider(pipeline: Pipeline | None, model: str) -> Any:
    if pipeline is not None and pipeline.provider_factory is not None:
        return pipeline.provider_factory()
    from conveyor.providers.local_embeddings import LocalEmbeddings, is_packaged

    if not (is_packaged(model) or Path(model).expanduser().is_dir()):
        raise UserError(f"the collection's vectors were made by {model!r}, which only the provider of the pipeline "
                        "that published them can embed: pass --pipeline TARGET (file.py:pipeline)")
    if model not in _LOCAL:
        _LOCAL[model] = LocalEmbeddings(model)
    return _LOCAL[model]


def _blocking(work: Any) -> Any:
    """Run a coroutine to its end from synchronous code, also where an event loop runs (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()
