"""``conveyor workers``: the fleet, as the workers themselves report it (live, lost lately, stopped)."""

from typing import Annotated

import typer

from conveyor.cli.common import Db, Json, app, emit, store_for
from conveyor.errors import StoreMissing
from conveyor.store import DEFAULT_DB


@app.command()
def workers(
    every: Annotated[bool, typer.Option("--all", help="stopped workers and long-lost ones too")] = False,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Workers of this store: host, pid, start, tasks held and done, last heartbeat; live, lost or stopped."""
    from conveyor.cli import render
    from conveyor.service.workers import list_workers

    try:
        with store_for(db, create=False) as store:
            data = list_workers(store, every)
    except StoreMissing:
        data = {"workers": []}
    emit(data, as_json, render.workers)


@app.command("queue-depth")
def queue_depth(
    pipeline: Annotated[str | None, typer.Option("--pipeline", help="only this pipeline's stages")] = None,
    stage: Annotated[str | None, typer.Option("--stage", help="only stages of this name")] = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Per stage: tasks ready to run, how long the oldest has waited, tasks running: what an autoscaler reads."""
    from conveyor.cli import render
    from conveyor.service.depth import queue_depth as depth

    try:
        with store_for(db, create=False) as store:
            data = depth(store, pipeline, stage)
    except StoreMissing:
        data = {"runnable": 0, "running": 0, "oldest_age_s": 0.0, "stages": []}
    emit(data, as_json, render.queue_depth)
