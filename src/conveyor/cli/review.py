"""``conveyor review list|show|approve|edit|reject|expire``: the review queue from the command line."""

from typing import Annotated, Any

import typer

from conveyor.cli.common import DEFAULT_BLOBS, Blobs, Db, Json, app, emit, store_for
from conveyor.errors import StoreMissing
from conveyor.store import DEFAULT_DB

review_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Answers waiting for people: list, show, approve, edit, reject, expire.")

Ids = Annotated[list[int], typer.Argument(help="review ids (`conveyor review list` shows them)")]
By = Annotated[str | None, typer.Option("--by", help="who decides (default: CONVEYOR_REVIEWER, else your login)")]
Why = Annotated[str | None, typer.Option("--why", help="why; recorded with the decision")]


@review_app.command("list")
def review_list(
    run: Annotated[str | None, typer.Option("--run", help="only this run's entries")] = None,
    stage: Annotated[str | None, typer.Option("--stage", help="only this stage's entries")] = None,
    all_: Annotated[bool, typer.Option("--all", help="decided entries too")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 1000,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Entries waiting for a decision (reads only: entries past their deadline stay until `review expire`
    or a worker applies it)."""
    from conveyor.service.review import review_list as listing

    try:
        with store_for(db, create=False) as store:
            data = listing(store, run, stage, all_, limit)
    except StoreMissing:
        data = {"reviews": [], "overdue": 0}
    emit(data, as_json, _render_list)


@review_app.command("show")
def review_show(review_id: Annotated[int, typer.Argument(help="review id")], db: Db = DEFAULT_DB,
                blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False) -> None:
    """One entry: why it waits, the answer, and the task's attempts."""
    from conveyor.blobs import open_blobs
    from conveyor.service.review import review_show as show

    with store_for(db, create=False) as store:
        data = show(store, open_blobs(blobs), review_id)
    emit(data, as_json, _render_entry)


@review_app.command("approve")
def review_approve(ids: Ids, by: By = None, why: Why = None, db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS,
                   as_json: Json = False) -> None:
    """Accept answers as they are; their items continue down the pipeline."""
    from conveyor.blobs import open_blobs
    from conveyor.service.review import approve

    with store_for(db, create=False) as store:
        data = approve(store, open_blobs(blobs), ids, by, why)
    emit(data, as_json, _render_decided)


@review_app.command("edit")
def review_edit(
    review_id: Annotated[int, typer.Argument(help="review id")],
    fields: Annotated[str, typer.Option("--fields", help="the corrected fields, a JSON object merged over the answer")],
    by: By = None, why: Why = None, db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
) -> None:
    """Accept an answer with corrected fields; its item continues with the corrected record."""
    from conveyor.blobs import open_blobs
    from conveyor.service.review import edit

    with store_for(db, create=False) as store:
        data = edit(store, open_blobs(blobs), review_id, fields, by, why)
    emit(data, as_json, _render_decided)


@review_app.command("reject")
def review_reject(ids: Ids, why: Annotated[str, typer.Option("--why", help="why; recorded with the item")] = "",
                  by: By = None, db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """Refuse answers: their items end rejected."""
    from conveyor.service.review import reject

    with store_for(db, create=False) as store:
        data = reject(store, ids, why, by)
    emit(data, as_json, _render_decided)


@review_app.command("expire")
def review_expire(run: Annotated[str | None, typer.Argument(help="only this run's entries (default: every run)")]
                  = None, db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """Apply passed deadlines: each entry takes its Review(on_deadline=...) outcome (workers do this too)."""
    from conveyor.service.review import expire_deadlines

    try:
        with store_for(db, create=False) as store:
            data = expire_deadlines(store, run)
    except StoreMissing:
        data = {"now": None, "runs": [], "decided": {}, "not_applicable": 0}
    emit(data, as_json, _render_expired)


def _render_list(data: dict[str, Any]) -> None:
    if data.get("overdue"):
        count = data["overdue"]
        typer.echo(f"{count} entr{'y is' if count == 1 else 'ies are'} past the deadline; "
                   "`conveyor review expire` (or a worker) applies it")
    if not data["reviews"]:
        typer.echo("no entries waiting for review")
    for e in data["reviews"]:
        sure = "" if e["confidence"] is None else f" confidence {e['confidence']:g}"
        typer.echo(f"{e['id']:>6}  {e['status']:<9} {e['run_id']}  {e['item_key']}  {e['stage']}: "
                   f"{e['reason_class']}{sure} — {e['reason']}")


def _render_entry(data: dict[str, Any]) -> None:
    import json

    from conveyor.cli.render import utc

    _render_list({"reviews": [data]})
    deadline = "no deadline" if data["deadline_at"] is None else (
        f"deadline {utc(data['deadline_at'])} (then: {data['on_deadline']})")
    decided = "" if data["decided_at"] is None else f"; decided {utc(data['decided_at'])} by {data['decided_by']}"
    typer.echo(f"waiting since {utc(data['created_at'])}; {deadline}{decided}; tier {data['tier']}")
    typer.echo(json.dumps(data["candidate"], indent=2, ensure_ascii=False, default=str))


def _render_expired(data: dict[str, Any]) -> None:
    if not data["runs"]:
        typer.echo("no entries past their deadline")
    for run in data["runs"]:
        decided = ", ".join(f"{count} {decision}" for decision, count in run["decided"].items()) or "none decided"
        typer.echo(f"{run['run_id']}: {decided} by deadline" if run["reason"] is None else
                   f"{run['run_id']}: {run['not_applicable']} entr{'y' if run['not_applicable'] == 1 else 'ies'} "
                   f"not applied: {run['reason']}")


def _render_decided(data: dict[str, Any]) -> None:
    for d in data["decided"]:
        then = f"; {d['queued']} next task(s) queued" if d["queued"] else ""
        typer.echo(f"review {d['id']} ({d['item_key']}): {d['decision']} by {data['by']}{then}")
    if any(d["queued"] for d in data["decided"]):
        runs = sorted({d["run_id"] for d in data["decided"]})
        typer.echo(f"carry them on with: conveyor resume {' '.join(runs[:1])}")


app.add_typer(review_app, name="review")
