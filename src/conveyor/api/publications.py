"""Search over the built-in publication target: ``GET /v1/search``, as ``conveyor search --json``.

``mode`` is ``words`` (the default: every word occurs), ``semantic`` (by meaning) or ``hybrid`` (both, fused by
reciprocal rank fusion). A search by meaning embeds the query through the provider of the pipeline this server
serves (when it serves exactly one with a provider; otherwise the local all-MiniLM-L6-v2). A tenant's token finds
the tenant's own items only, with their keys as it chose them; an operator's finds every item.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from conveyor.api.context import Svc, View
from conveyor.api.operations import _JSON, _PROBLEM, TEXT, Filter, _json
from conveyor.service import publications as pubs
from conveyor.service.embedder import query_embedder

router = APIRouter(prefix="/v1", tags=["publications"])


@router.get("/search", responses={200: _JSON, 422: _PROBLEM})
async def search(view: View, svc: Svc,
                 q: Annotated[str, Query(min_length=1, max_length=10_000, pattern=TEXT,
                                         description="the query: words, or what to find by meaning")],
                 mode: Annotated[Literal["words", "semantic", "hybrid"], Query(
                     description="words (full text), semantic (cosine similarity of the query's embedding) or "
                                 "hybrid (reciprocal rank fusion of both, k=60)")] = "words",
                 collection: Filter = None, limit: Annotated[int, Query(ge=1, le=1000)] = 10) -> Response:
    """The live published versions that answer ``q``, best first, as ``conveyor search --json``."""
    with_provider = [p for p, _ in svc.pipelines.values() if p.provider_factory is not None]
    embed = query_embedder(with_provider[0] if len(with_provider) == 1 else None)
    return _json(await view.call(pubs.tenant_search, q, collection, limit, mode, embed))
