"""``conveyor select``, ``replay`` and ``requeue``: which tasks a filter names, and running them again."""

from typing import Annotated, Any

import typer

from conveyor.cli.common import (
    DEFAULT_BLOBS,
    Blobs,
    BudgetUsd,
    Db,
    Json,
    Target,
    Workers,
    app,
    checked_budget,
    default_workers,
    emit,
    interrupted,
    stage_output_to_stderr,
    stages_progress,
    store_for,
)
from conveyor.errors import NotFound, StoreMissing
from conveyor.store import DEFAULT_DB

Many = Annotated[list[str] | None, typer.Option()]
Runs = Annotated[list[str] | None, typer.Option("--run", help="only this run (repeat for more; default: every run)")]
Stages = Annotated[list[str] | None, typer.Option("--stage", help="only this stage (repeatable)")]
Statuses = Annotated[list[str] | None, typer.Option(
    "--status", help="queued, running, succeeded, failed, dead_lettered, awaiting_review, rejected, superseded, or "
    "any (the default; repeatable)")]
ErrorClasses = Annotated[list[str] | None, typer.Option("--error-class", help="only tasks that ended with this error "
                                                        "class (repeatable)")]
ItemGlob = Annotated[str | None, typer.Option("--item", metavar="GLOB", help="item keys matching this shell-style "
                                              "pattern (man1/*.gz)")]
ItemsFile = Annotated[str | None, typer.Option("--items", metavar="FILE", help="items named in this file (one key "
                                               "a line, or JSON lines with a key), and their fan-out children")]
Where = Annotated[str | None, typer.Option("--where", help="provenance comparisons joined by 'and': \"parser < "
                                           "1.24.10 and schema = 3\" (= != < <= > >=; versions compare as versions)")]
Models = Annotated[list[str] | None, typer.Option("--model", help="tasks that asked this model (repeatable)")]
Since = Annotated[str | None, typer.Option("--since", help="ended (or created) at or after: 2026-12-01, "
                                           "2026-12-01T09:30Z, epoch seconds, or a duration ago (2h)")]
Until = Annotated[str | None, typer.Option("--until", help="ended (or created) before; as --since")]
Outcomes = Annotated[list[str] | None, typer.Option(
    "--outcome", help="items whose reconciliation outcome is this (rejected, failed, published, ...; repeatable); "
    "without --status/--stage, the tasks that make that outcome")]
KeyPrefix = Annotated[str | None, typer.Option("--key-prefix", metavar="PREFIX", help="root items whose key starts "
                                               "with this (their fan-out children with them)")]
ErrorText = Annotated[str | None, typer.Option("--error-text", metavar="WORDS", help="tasks whose error message "
                                               "holds every one of these words (full-text)")]
Reviews = Annotated[list[str] | None, typer.Option("--review", help="tasks with a review entry in this state: open, "
                                                   "approved, edited, accepted, rejected, escalated (repeatable)")]


def _selection(runs: list[str] | None, stages: list[str] | None, statuses: list[str] | None,
               error_classes: list[str] | None, item: str | None, items: str | None, where: str | None,
               models: list[str] | None, since: str | None, until: str | None, outcomes: list[str] | None,
               now: float, key_prefix: str | None = None, error_text: str | None = None,
               reviews: list[str] | None = None) -> Any:
    from conveyor.service.selection import selection_of

    return selection_of(runs or (), stages or (), statuses or (), error_classes or (), item, items, where,
                        models or (), since, until, outcomes or (), now, key_prefix, error_text, reviews or ())


@app.command("select")
def select_(
    run: Runs = None, stage: Stages = None, status: Statuses = None, error_class: ErrorClasses = None,
    item: ItemGlob = None, items: ItemsFile = None, where: Where = None, model: Models = None, since: Since = None,
    until: Until = None, outcome: Outcomes = None, key_prefix: KeyPrefix = None, error_text: ErrorText = None,
    review: Reviews = None,
    count: Annotated[bool, typer.Option("--count", help="also count the tasks per stage and the items per "
                                        "outcome")] = False,
    limit: Annotated[int, typer.Option("--limit", min=0, help="tasks listed (count covers them all)")] = 1000,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """The tasks a filter names (filters combine), each with its status, error class and provenance."""
    from conveyor.cli import render
    from conveyor.service.selection import select_report

    try:
        with store_for(db, create=False) as store:
            selection = _selection(run, stage, status, error_class, item, items, where, model, since, until,
                                   outcome, store.clock(), key_prefix, error_text, review)
            data = select_report(store, selection, limit, count)
    except StoreMissing as exc:
        raise NotFound(f"nothing to select: {exc}") from None
    emit(data, as_json, render.selection)


@app.command()
def replay(
    reason: Annotated[str, typer.Option("--reason", help="retry, reprocess, source-corrected or manual; recorded "
                                        "on every task it re-opens")],
    run: Runs = None, stage: Stages = None, status: Statuses = None, error_class: ErrorClasses = None,
    item: ItemGlob = None, items: ItemsFile = None, where: Where = None, model: Models = None, since: Since = None,
    until: Until = None, outcome: Outcomes = None, key_prefix: KeyPrefix = None, error_text: ErrorText = None,
    review: Reviews = None,
    note: Annotated[str | None, typer.Option("--note", help="more about why, recorded with the reason")] = None,
    downstream: Annotated[bool, typer.Option("--downstream", help="also make again everything after each re-opened "
                                             "task on its item")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="change nothing; say what would run and what it "
                                          "would cost")] = False,
    process: Annotated[bool, typer.Option("--process", help="then process the re-opened work to the end, as "
                                          "`conveyor resume` does")] = False,
    workers: Workers = default_workers(),
    target: Annotated[str | None, typer.Option("--target", help="the pipeline (file.py:pipeline) to run them "
                                               "under; default: the TARGET each run recorded")] = None,
    by: Annotated[str | None, typer.Option("--by", help="who (default: CONVEYOR_REVIEWER, else your login)")] = None,
    budget_usd: BudgetUsd = None,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
) -> None:
    """Re-open the tasks a filter names (succeeded ones too) under their stages' current code, with a reason;
    --dry-run says what would run and its cost, --process runs it."""
    from conveyor.cli import render
    from conveyor.service.replay import ReplayOptions, process_replay
    from conveyor.service.replay import replay as reopen

    options = ReplayOptions(reason, note, downstream, dry_run, by, target, workers=max(1, workers))
    try:
        with store_for(db, create=False) as store, stages_progress(as_json) as progress:
            selection = _selection(run, stage, status, error_class, item, items, where, model, since, until,
                                   outcome, store.clock(), key_prefix, error_text, review)
            blob_store = _blobs(blobs)
            data = reopen(store, blob_store, selection, options)
            if process and not dry_run:
                from conveyor.service.runs import Interrupted

                try:
                    with stage_output_to_stderr():
                        data["processed"] = process_replay(store, blob_store, data["runs"], workers, progress,
                                                           checked_budget(budget_usd))
                except Interrupted as exc:
                    interrupted(exc.run_id, db, blobs)
    except StoreMissing as exc:
        raise NotFound(f"nothing to replay: {exc}") from None
    emit(data, as_json, render.replay)
    code = _worst_exit(data.get("processed") or [])
    if code:
        raise typer.Exit(code)


def _blobs(url: str) -> Any:
    from conveyor.cli.common import writable_blobs

    return writable_blobs(url)


def _worst_exit(summaries: list[dict[str, Any]]) -> int:
    from conveyor.service.report import exit_code

    codes = [exit_code(s) for s in summaries]
    for code in (3, 4, 5):
        if code in codes:
            return code
    return 0


@app.command()
def requeue(
    target: Target,
    run_id: Annotated[str, typer.Option("--run", help="the run")],
    stage: Annotated[str, typer.Option("--stage", help="the stage to run again")],
    reason: Annotated[str, typer.Option("--reason", help="why; recorded with each task")],
    status: Annotated[list[str] | None, typer.Option("--status", help="failed, dead_lettered and/or rejected "
                                                     "(default: failed and dead_lettered)")] = None,
    error_class: Annotated[str | None, typer.Option("--error-class")] = None,
    stage_version: Annotated[str | None, typer.Option("--stage-version", help="only tasks made by this version")]
    = None,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
) -> None:
    """Run ended tasks of a stage again under its current code (a replay with reason retry; then start a worker)."""
    from conveyor.runtime.target import load_target
    from conveyor.service.replay import requeue as requeue_tasks

    pipeline = load_target(target)
    with store_for(db, create=False) as store:
        data = requeue_tasks(pipeline, store, _blobs(blobs), run_id, stage, reason,
                             tuple(status or ("failed", "dead_lettered")), error_class, stage_version)
    emit(data, as_json, lambda d: typer.echo(f"requeued {d['requeued']} task(s) of {d['stage']}: {d['reason']}"))
