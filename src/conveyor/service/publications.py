"""The built-in publication target, for the CLI and the API: an item's versions with their provenance,
rollback (of an item, or of everything a run published) and full-text search over the live versions.

Each function returns the plain dict that ``--json`` prints; the README documents every field.
"""

from __future__ import annotations

import getpass
import json
from typing import Any

from conveyor.errors import NotFound, UserError
from conveyor.service.report import find_run
from conveyor.store import SqlStore
from conveyor.store.fulltext import words
from conveyor.store.publications import PublicationVersion, RolledBack, SearchHit, StageProvenance


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


def search(store: SqlStore, query: str, collection: str | None = None, limit: int = 10) -> dict[str, Any]:
    """The live versions whose text holds every word of ``query`` (taken literally), best first."""
    check_search(query, limit)
    hits = store.search_publications(query, collection, limit)
    return {"query": query, "collection": collection, "results": [_hit(h) for h in hits]}


def check_search(query: str, limit: int) -> None:
    """An empty query, or a limit below 1, is a user error."""
    words(query)
    if limit < 1:
        raise UserError(f"--limit {limit}: give a number of results of at least 1")


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
