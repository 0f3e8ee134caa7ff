"""``conveyor publications``, ``rollback`` and ``search``: the built-in publication target from the command line."""

import time
from typing import Annotated, Any

import typer

from conveyor.cli.common import Db, Json, app, emit, store_for
from conveyor.errors import NotFound, StoreMissing
from conveyor.store import DEFAULT_DB

Collection = Annotated[str | None, typer.Option("--collection", help="the collection (the publish stage's into=); "
                                                "needed when the item is in several")]
Reason = Annotated[str | None, typer.Option("--reason", help="why; recorded with each version it writes")]


@app.command()
def publications(
    item_key: Annotated[str, typer.Argument(metavar="ITEM", help="the item key")], collection: Collection = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Every version of an item in the built-in target, newest first, with its provenance."""
    from conveyor.service.publications import publications as versions

    try:
        with store_for(db, create=False) as store:
            data = versions(store, item_key, collection)
    except StoreMissing as exc:
        raise NotFound(f"item {item_key!r} has never been published: {exc}") from None
    emit(data, as_json, _render_versions)


@app.command()
def rollback(
    item_key: Annotated[str | None, typer.Argument(metavar="[ITEM]", help="the item to roll back")] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="roll back every item whose live version this run "
                                               "published")] = None,
    collection: Collection = None, reason: Reason = None,
    by: Annotated[str | None, typer.Option("--by", help="who rolls back (default: your login)")] = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Make the version an item's live version replaced live again, as a new version (or retract the item
    when there was none); with --run, do it for every item that run published."""
    from conveyor.service.publications import rollback as roll_back

    try:
        with store_for(db, create=False) as store:
            data = roll_back(store, item_key, run_id, collection, by, reason)
    except StoreMissing as exc:
        raise NotFound(f"nothing has been published: {exc}") from None
    emit(data, as_json, _render_rolled_back)


@app.command()
def search(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="words that must all occur (taken literally); with "
                                         "--semantic or --hybrid, what to find by meaning")],
    collection: Annotated[str | None, typer.Option("--collection", help="only this collection")] = None,
    limit: Annotated[int, typer.Option("--limit", help="at most this many results")] = 10,
    semantic: Annotated[bool, typer.Option("--semantic", help="rank by meaning: the query embedded with the model "
                                           "that made the collection's vectors, by cosine similarity")] = False,
    hybrid: Annotated[bool, typer.Option("--hybrid", help="fuse the word and the meaning rankings (reciprocal rank "
                                         "fusion, k=60)")] = False,
    pipeline: Annotated[str | None, typer.Option("--pipeline", help="file.py:pipeline whose provider embeds the "
                                                 "query (default: the local all-MiniLM-L6-v2)")] = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Search the live versions in the built-in target, best match first: by words (full text), by meaning
    (--semantic) or both (--hybrid)."""
    from conveyor.errors import UserError
    from conveyor.service.publications import Mode, check_search
    from conveyor.service.publications import search as find

    if semantic and hybrid:
        raise UserError("--semantic and --hybrid are two modes: give one (--hybrid ranks by words and meaning)")
    mode: Mode = "semantic" if semantic else "hybrid" if hybrid else "words"
    check_search(query, limit, mode)  # a bad query is an error even where nothing is published yet
    try:
        with store_for(db, create=False) as store:
            data = find(store, query, collection, limit, mode, _embedder(pipeline))
    except StoreMissing:
        if mode != "words":
            raise UserError("nothing has been published in this store yet: there are no vectors to search") from None
        data = {"query": query, "collection": collection, "results": []}
    emit(data, as_json, _render_hits)


def _embedder(target: str | None) -> Any:
    from conveyor.service.embedder import query_embedder

    if target is None:
        return query_embedder()
    from conveyor.runtime.target import load_target

    return query_embedder(load_target(target))


def _render_versions(data: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from conveyor.cli.render import out

    live = data["live_version"]
    table = Table(title=escape(f"{data['item_key']} in {data['collection']}: ")
                  + (f"version {live} is live" if live else "nothing is live"))
    for column in ("version", "action", "live", "run", "created", "by", "reason", "vectors"):
        table.add_column(column)
    for v in data["versions"]:
        action = f"{v['action']} of {v['restores']}" if v["restores"] else v["action"]
        table.add_row(str(v["version"]), action, "live" if v["live"] else "", v["run_id"] or "", _when(v["created_at"]),
                      escape(v["created_by"]), escape(v["reason"] or ""), str(v["vectors"]))
    out.print(table)


def _render_rolled_back(data: dict[str, Any]) -> None:
    if not data["rolled_back"]:
        typer.echo(f"nothing to roll back: run {data['run_id']} is the publisher of no live version")
    for r in data["rolled_back"]:
        what = "retracted (nothing is live)" if r["action"] == "retract" else "rolled back"
        typer.echo(f"{r['collection']}/{r['item_key']}: {what}, version {r['from_version']} -> {r['to_version']}")


def _render_hits(data: dict[str, Any]) -> None:
    if not data["results"]:
        typer.echo(f"no live publication matches {data['query']!r}")
    for h in data["results"]:
        typer.echo(f"{h['score']:10.4g}  {h['collection']}/{h['item_key']} v{h['version']}  {h['snippet']}")
    if data.get("model"):
        typer.echo(f"({data['mode']}: the query embedded with {data['model']}, ranked by {data['index']})", err=True)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
