"""``conveyor dlq list|show|replay``: the dead-letter list."""

from typing import Annotated, Any

import typer

from conveyor.cli.common import Db, Json, app, emit, store_for
from conveyor.errors import StoreMissing, UserError
from conveyor.store import DEFAULT_DB

dlq_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                      help="The dead-letter list: inspect and replay poison tasks.")

Filter = Annotated[str | None, typer.Option()]


@dlq_app.command("list")
def dlq_list(run: Filter = None, stage: Filter = None, error_class: Filter = None,
             all_: Annotated[bool, typer.Option("--all", help="include replayed entries")] = False,
             db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """Dead-lettered tasks, newest last."""
    from conveyor.cli import render
    from conveyor.service.report import dlq_list as list_entries

    try:
        with store_for(db, create=False) as store:
            data = list_entries(store, run, stage, error_class, all_)
    except StoreMissing:
        data = {"entries": []}
    emit(data, as_json, render.dlq)


@dlq_app.command("show")
def dlq_show(entry_id: Annotated[int, typer.Argument(help="dead-letter id")], db: Db = DEFAULT_DB,
             as_json: Json = False) -> None:
    """One dead letter with its full error and every attempt."""
    from conveyor.cli import render
    from conveyor.service.report import dlq_show as show_entry

    with store_for(db, create=False) as store:
        data = show_entry(store, entry_id)
    emit(data, as_json, render.dlq_entry)


@dlq_app.command("replay")
def dlq_replay(
    ids: Annotated[list[int] | None, typer.Argument(help="dead-letter ids")] = None,
    reason: Annotated[str, typer.Option("--reason", help="why; recorded with each entry")] = "",
    run: Filter = None, stage: Filter = None, error_class: Filter = None,
    all_: Annotated[bool, typer.Option("--all", help="every entry not replayed yet")] = False,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Queue dead-lettered tasks again with a fresh attempt budget; then run a worker."""
    from conveyor.service.report import dlq_replay as replay

    if not reason.strip():
        raise UserError("a replay needs --reason \"why\"; it is recorded with the dead letter")
    with store_for(db, create=False) as store:
        data = replay(store, list(ids or []), reason, run, stage, error_class, all_)
    emit(data, as_json, _render_replayed)


def _render_replayed(data: dict[str, Any]) -> None:
    from conveyor.service.report import not_replayed_line

    typer.echo(f"replayed {data['replayed']} task(s): {data['reason']}")
    for skipped in data["skipped"]:
        typer.echo(not_replayed_line(skipped))


app.add_typer(dlq_app, name="dlq")
