"""The ``conveyor`` command: a thin shell over the service functions."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer

from conveyor.blobs import open_blobs
from conveyor.errors import ConveyorError, UserError
from conveyor.store import DEFAULT_DB, SqlStore, open_store

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Durable, idempotent batch AI pipelines.")
dlq_app = typer.Typer(no_args_is_help=True, help="The dead-letter list: inspect and replay poison tasks.")
app.add_typer(dlq_app, name="dlq")

DEFAULT_BLOBS = ".conveyor/blobs"
F = TypeVar("F", bound=Callable[..., Any])

Db = Annotated[str, typer.Option("--db", envvar="CONVEYOR_DB", help="sqlite:///file.db or postgresql://...")]
Blobs = Annotated[str, typer.Option("--blobs", envvar="CONVEYOR_BLOBS", help="blob folder or file:// URL")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]
Target = Annotated[str, typer.Argument(help="file.py:pipeline or package.module:pipeline")]
Input = Annotated[str, typer.Option("--input", "-i", help="a folder, a file, or a manifest.jsonl")]
Lane = Annotated[str, typer.Option("--lane", help="bulk, or interactive: claimed first, with a reserved share "
                                   "of every provider quota")]


def main() -> None:
    """Entry point: user errors print one line and exit 2, never a traceback."""
    logging.basicConfig(level=os.environ.get("CONVEYOR_LOG", "WARNING").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        app()  # standalone: Typer itself reports usage errors and exits 2
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    except ConveyorError as exc:
        typer.echo(f"error [{exc.code}]: {exc}", err=True)
        raise SystemExit(1) from None


@contextmanager
def _store(db: str) -> Iterator[SqlStore]:
    store = open_store(db or DEFAULT_DB)
    try:
        yield store
    finally:
        store.close()


def _emit(data: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, default=str) + "\n")
        sys.stdout.flush()
    else:
        render(data)


@contextmanager
def _stage_output_to_stderr() -> Iterator[None]:
    """While stages run in this process (and its children), file descriptor 1 points at stderr,
    so whatever stage code prints cannot corrupt the one JSON object on stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _check_limits_env() -> None:
    from conveyor.pipeline import parse_limits
    from conveyor.pipeline.limits import ENV_VAR

    parse_limits(os.environ.get(ENV_VAR))


# --- commands ---------------------------------------------------------------

@app.command()
def run(
    target: Target, input: Input, workers: Annotated[int, typer.Option("--workers", "-w",
        help="worker processes; 0 runs in this process")] = 1,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False, lane: Lane = "bulk",
) -> None:
    """Submit INPUT and process it to completion; print the reconciliation."""
    from conveyor.cli import render
    from conveyor.runtime.target import load_target
    from conveyor.service.runs import RunOptions, run_pipeline

    pipeline = load_target(target)
    _check_limits_env()  # before any worker starts: a bad CONVEYOR_LIMITS would stop every one of them
    with _store(db) as store, render.progress(enabled=not as_json) as progress, _stage_output_to_stderr():
        options = RunOptions(workers=workers, lane=lane)
        summary = run_pipeline(pipeline, target, input, store, open_blobs(blobs), options, progress)
    _emit(summary, as_json, render.summary)
    if summary["unaccounted"]:
        raise typer.Exit(3)


@app.command()
def submit(target: Target, input: Input, db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS,
           as_json: Json = False, lane: Lane = "bulk") -> None:
    """Create a run without processing it; print its id."""
    from conveyor.runtime.target import load_target
    from conveyor.service.submit import submit as submit_run

    pipeline = load_target(target)
    with _store(db) as store:
        done = submit_run(pipeline, target, input, store, open_blobs(blobs), lane=lane)
    data = {"run_id": done.run_id, "expected": done.expected, "cached": done.cached}
    _emit(data, as_json, lambda d: typer.echo(d["run_id"]))


@app.command()
def worker(
    target: Target,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="exit when no task is left")] = False,
    run_id: Annotated[str | None, typer.Option("--run", help="only this run's tasks")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 1000,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Process tasks from the shared store; run as many as you like, anywhere."""
    from conveyor.runtime.target import load_target
    from conveyor.runtime.worker import Worker, WorkerOptions

    pipeline = load_target(target)
    open_store(db).close()  # fail fast, with one line, on a bad URL or unreachable server
    options = WorkerOptions(run_id=run_id, until_idle=until_idle, batch_size=batch_size)
    with _stage_output_to_stderr():
        stats = Worker(pipeline, target, db, open_blobs(blobs), options).run()
    data = {"worker": "done", **dict(stats)}
    if as_json:
        _emit(data, True, lambda d: None)
    elif not quiet:
        typer.echo(" ".join(f"{k}={v}" for k, v in sorted(stats.items())), err=True)


@app.command()
def status(
    run_id: Annotated[str | None, typer.Argument(help="a run id; default: the recent runs")] = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Per-stage progress of one run, or a list of recent runs."""
    from conveyor.cli import render
    from conveyor.service.report import find_run, list_status, status_report

    with _store(db) as store:
        data = status_report(store, find_run(store, run_id)) if run_id else list_status(store)
    _emit(data, as_json, render.status)


@app.command()
def quota(db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """What the fleet holds of each provider model's limit in the current window, and any pause."""
    from conveyor.cli import render
    from conveyor.service.report import quota_report

    with _store(db) as store:
        data = quota_report(store)
    _emit(data, as_json, render.quota)


@app.command()
def reconcile(run_id: Annotated[str, typer.Argument(help="the run id")], db: Db = DEFAULT_DB,
              as_json: Json = False) -> None:
    """Every expected item with its outcome; exits 3 when some are unaccounted."""
    from conveyor.cli import render
    from conveyor.service.report import find_run
    from conveyor.service.report import reconcile as reconcile_run

    with _store(db) as store:
        data = reconcile_run(store, find_run(store, run_id))
    _emit(data, as_json, render.summary)
    if data["unaccounted"]:
        raise typer.Exit(3)


@app.command()
def requeue(
    target: Target,
    run_id: Annotated[str, typer.Option("--run", help="the run")],
    stage: Annotated[str, typer.Option("--stage", help="the stage to run again")],
    reason: Annotated[str, typer.Option("--reason", help="why; recorded with each task")] = "",
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
    with _store(db) as store:
        run = find_run(store, run_id)
        data = requeue_tasks(pipeline, store, run.run_id, stage, reason, tuple(status or ("failed", "dead_lettered")),
                             error_class, stage_version)
    _emit(data, as_json, lambda d: typer.echo(f"requeued {d['requeued']} task(s) of {d['stage']}: {d['reason']}"))


@app.command("provider-sim", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def provider_sim(ctx: typer.Context) -> None:
    """A local OpenAI-compatible provider with TPM/RPM limits and seeded faults (--help for its flags)."""
    try:
        from conveyor.providers.simulator import main as simulator_main
    except ImportError as exc:
        raise UserError(
            f"the simulator needs the 'sim' extra ({exc.name} is missing): pip install 'conveyor[sim]'") from None
    raise typer.Exit(simulator_main(list(ctx.args)))


Filter = Annotated[str | None, typer.Option()]


@dlq_app.command("list")
def dlq_list(run: Filter = None, stage: Filter = None, error_class: Filter = None,
             all_: Annotated[bool, typer.Option("--all", help="include replayed entries")] = False,
             db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """Dead-lettered tasks, newest last."""
    from conveyor.cli import render
    from conveyor.service.report import dlq_list as list_entries

    with _store(db) as store:
        data = list_entries(store, run, stage, error_class, all_)
    _emit(data, as_json, render.dlq)


@dlq_app.command("show")
def dlq_show(entry_id: Annotated[int, typer.Argument(help="dead-letter id")], db: Db = DEFAULT_DB,
             as_json: Json = False) -> None:
    """One dead letter with its full error and every attempt."""
    from conveyor.cli import render
    from conveyor.service.report import dlq_show as show_entry

    with _store(db) as store:
        data = show_entry(store, entry_id)
    _emit(data, as_json, render.dlq_entry)


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

    with _store(db) as store:
        data = replay(store, list(ids or []), reason, run, stage, error_class, all_)
    _emit(data, as_json, lambda d: typer.echo(f"replayed {d['replayed']} task(s): {d['reason']}"))
