"""The built-in publication target, for the CLI and the API: an item's versions with their provenance,
rollback (of an item, or of everything a run published) and search over the live versions: by words (full
text), by meaning (the query embedded with the model that made the collection's vectors, ranked by cosine
similarity) or both (the two rankings fused by reciprocal rank fusion).

Each function returns the plain dict that ``--json`` prints; docs/reference/json.md documents every field.
"""

from __future__ import annotations

import getpass
import json
from typing import Any, Literal

from conveyor.errors import NotFound, UserError
from conveyor.service.embedder import Embedder, query_embedder
from conveyor.service.report import find_run
from conveyor.service.tenancy import TenantView, client_key, owned_key
from conveyor.store import SqlStore
from conveyor.store.fulltext import words
from conveyor.store.publications import UNRECORDED, PublicationVersion, RolledBack, SearchHit, StageProvenance

Mode = Literal["words", "semantic", "hybrid"]
MODES: tuple[Mode, ...] = ("words", "semantic", "hybrid")
RRF_K = 60  # reciprocal rank fusion: a hit's score is the sum over the rankings that hold it of 1 / (RRF_K + rank)
FUSED_DEPTH = 50  # hits each ranking gives to the fusion (at least --limit)


def publications(store: SqlStore, item_key: str, collection: str | None = None) -> dict[str, Any]:
    """Every version of ``item_key`` in its collection, newest first, each with its provenance."""
    collection = _collection_of(store, item_key, collection)
    versions = store.publication_versions(collection, item_key)
    stages = {run: store.item_provenance(run, item_key) for run in {v.run_id for v in versions if v.run_id}}
    return {
        "item_key": item_key, "collection": collection,
        "live_version": next((v.version for v in versions if v.live), None),
        "versions": [_version(v, stages.get(v.run_id or "", [])) for v in versions],
    }


def rollback(store: SqlStore, item_key: str | None = None, run_id: str | None = None,
             collection: str | None = None, by: str | None = None, reason: str | None = None) -> dict[str, Any]:
    """Roll an item back to the content its live version replaced (or retract it, when there was none), or do
    that for every item whose live version ``run_id`` published. Each rollback is a new, recorded version."""
    if (item_key is None) == (run_id is None):
        raise UserError("roll back either an ITEM or a run (--run RUN), not both" if item_key is not None
                        else "name what to roll back: an ITEM, or --run RUN for everything a run published")
    who, why, now = by or current_user(), (reason or "").strip() or None, store.clock()
    if run_id is not None:
        if collection is not None:
            raise UserError("--collection is for rolling back an ITEM; --run rolls back every item the run published")
        done = store.rollback_run(find_run(store, run_id).run_id, who, why, now)
    else:
        assert item_key is not None
        done = [store.rollback_item(_collection_of(store, item_key, collection), item_key, who, why, now)]
    return {"rolled_back": [_rolled_back(r) for r in done], "run_id": run_id, "by": who, "reason": why}


def search(store: SqlStore, query: str, collection: str | None = None, limit: int = 10, mode: Mode = "words",
           embed: Embedder | None = None, prefix: str | None = None) -> dict[str, Any]:
    """The live versions that answer ``query``, best first. ``mode``: ``words`` (every word occurs, taken
    literally), ``semantic`` (nearest by meaning: the query is embedded with the model that made the
    collection's vectors, through ``embed`` (default: service/embedder.py's local model), and versions rank
    by the cosine similarity of their best vector) or ``hybrid`` (both rankings fused by reciprocal rank fusion,
    k = RRF_K). ``prefix``: only item keys that start with it (a tenant's)::

        search(store, "compress a file", "manuals", mode="semantic")["results"][0]["item_key"]
    """
    check_search(query, limit, mode)
    if mode == "words":
        hits = store.search_publications(query, collection, limit, prefix)
        return {"query": query, "collection": collection, "results": [_hit(h) for h in hits]}  # the shape of old
    collection, model = _searched_by_meaning(store, collection, prefix)
    vector = (embed or query_embedder())(model, query)
    depth = limit if mode == "semantic" else max(limit, FUSED_DEPTH)
    index, near = store.nearest_publications(collection, vector, depth, prefix)
    results = ([{**_hit(h), "similarity": h.score} for h in near] if mode == "semantic"
               else _fused(store.search_publications(query, collection, depth, prefix), near, limit))
    return {"query": query, "collection": collection, "mode": mode, "model": model, "index": index,
            "results": results}


def tenant_search(view: TenantView, query: str, collection: str | None = None, limit: int = 10,
                  mode: Mode = "words", embed: Embedder | None = None) -> dict[str, Any]:
    """``search`` as the HTTP service's caller may see it: a tenant finds its own items only (their keys as it
    chose them), an operator every item."""
    scope = view.scope
    found = search(view.store, query, collection, limit, mode, embed, None if scope is None else owned_key(scope, ""))
    if scope is not None:
        for hit in found["results"]:
            hit["item_key"] = client_key(scope, hit["item_key"])
    return found


def check_search(query: str, limit: int, mode: str = "words") -> None:
    """An empty query, a limit below 1 or an unknown mode is a user error."""
    words(query)
    if limit < 1:
        raise UserError(f"--limit {limit}: give a number of results of at least 1")
    if mode not in MODES:
        raise UserError(f"search mode {mode!r}: use one of {', '.join(MODES)}")


def _searched_by_meaning(store: SqlStore, collection: str | None, prefix: str | None) -> tuple[str, str]:
    """The collection a search by meaning ranks and the one model that made its live vectors; a user error
    when there is no such collection, or its vectors come from several models or from an unnamed one."""
    found = store.vector_models(collection, prefix)
    collections = sorted({m.collection for m in found})
    if not collections:
        where = f"collection {collection!r}" if collection else "this store"
        raise UserError(f"no live publication in {where} has vectors to search by meaning; search by words "
                        "(drop --semantic/--hybrid) or publish Records with vectors and an embedding_model")
    if len(collections) > 1:
        raise UserError(f"several collections have vectors ({', '.join(collections)}); "
                        "pass --collection to search one by meaning")
    models = {m.model: m.versions for m in found}
    if UNRECORDED in models:
        raise UserError(f"{models[UNRECORDED]} live versions of collection {collections[0]!r} have vectors from a "
                        "model nobody recorded; return Record(..., embedding_model=\"MODEL\") from the publish stage "
                        "and publish them again (conveyor replay --stage PUBLISH)")
    if len(models) > 1:
        counts = ", ".join(f"{m}: {n}" for m, n in models.items())
        raise UserError(f"the live vectors of collection {collections[0]!r} come from several models ({counts}); "
                        "a query can be embedded with one only: publish every item again with one model "
                        "(conveyor replay --stage PUBLISH)")
    return collections[0], next(iter(models))


def _fused(text: list[SearchHit], near: list[SearchHit], limit: int) -> list[dict[str, Any]]:
    """Reciprocal rank fusion of the word and the vector rankings: score = sum of 1 / (RRF_K + rank)."""
    fused: dict[tuple[str, str], dict[str, Any]] = {}
    for ranking, rank_field in ((text, "text_rank"), (near, "vector_rank")):
        for rank, h in enumerate(ranking, 1):
            entry = fused.setdefault((h.collection, h.item_key), {
                **_hit(h), "score": 0.0, "text_rank": None, "vector_rank": None, "similarity": None})
            entry["score"] += 1.0 / (RRF_K + rank)
            entry[rank_field] = rank
            if rank_field == "vector_rank":
                entry["similarity"] = h.score
            elif ranking is text:
                entry["snippet"] = h.snippet  # the words' snippet marks what matched
    ordered = sorted(fused.values(), key=lambda e: (-e["score"], e["text_rank"] or 10**9, e["item_key"]))
    return ordered[:limit]


def current_user() -> str:
    """Who rolls back, unless told: the login name."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _collection_of(store: SqlStore, item_key: str, collection: str | None) -> str:
    """The one collection meant: the given one, or the only one that holds the item."""
    found = store.publication_collections(item_key)
    if not found:
        raise NotFound(f"item {item_key!r} has never been published in this store; "
                       "`conveyor search \"WORDS\"` finds published items")
    if collection is None and len(found) > 1:
        raise UserError(f"item {item_key!r} is published in {len(found)} collections ({', '.join(found)}); "
                        "pass --collection")
    if collection is not None and collection not in found:
        raise NotFound(f"item {item_key!r} has never been published in collection {collection!r}; "
                       f"it is in: {', '.join(found)}")
    return collection or found[0]


def _version(v: PublicationVersion, stages: list[StageProvenance]) -> dict[str, Any]:
    return {
        "version": v.version, "action": v.action, "live": v.live, "digest": v.digest, "run_id": v.run_id,
        "created_at": v.created_at, "created_by": v.created_by, "reason": v.reason,
        "fields": json.loads(v.fields) if v.fields is not None else None, "vectors": v.vectors,
        "restores": v.restores,
        "provenance": {
            "run_id": v.run_id, "pipeline": v.pipeline, "task_id": v.task_id, "created_by": v.created_by,
            "reason": v.reason,
            "stages": [{"stage": s.stage, "item_key": s.item_key, "version": s.stage_version,
                        "config_hash": s.config_hash} for s in stages],
        },
    }


def _rolled_back(r: RolledBack) -> dict[str, Any]:
    return {"item_key": r.item_key, "collection": r.collection, "from_version": r.from_version,
            "to_version": r.to_version, "action": r.action}


def _hit(h: SearchHit) -> dict[str, Any]:
    return {"item_key": h.item_key, "collection": h.collection, "version": h.version, "run_id": h.run_id,
            "score": h.score, "snippet": h.snippet, "fields": json.loads(h.fields)}
