"""``conveyor requeue``: run ended tasks again (selection and replay grow here)."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.common import Db, Json, Target, app, emit, store_for
from conveyor.store import DEFAULT_DB


@app.command()
def requeue(
    target: Target,
    run_id: Annotated[str, typer.Option("--run", help="the run")],
    stage: Annotated[str, typer.Option("--stage", help="the stage to run again")],
    reason: Annotated[str, typer.Option("--reason", help="why; recorded with each task")],
    status: Annotated[list[str] | None, typer.Option("--status", help="failed and/or dead_lettered")] = None,
    error_class: Annotated[str | None, typer.Option("--error-class")] = None,
    stage_version: Annotated[str | None, typer.Option("--stage-version", help="only tasks made by this version")]
    = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Run ended tasks of a stage again under its current code (then start a worker)."""
    from conveyor.runtime.target import load_target
    from conveyor.service.report import find_run
    from conveyor.service.report import requeue as requeue_tasks

    pipeline = load_target(target)
    with store_for(db, create=False) as store:
        run = find_run(store, run_id)
        data = requeue_tasks(pipeline, store, run.run_id, stage, reason, tuple(status or ("failed", "dead_lettered")),
                             error_class, stage_version)
    emit(data, as_json, lambda d: typer.echo(f"requeued {d['requeued']} task(s) of {d['stage']}: {d['reason']}"))


