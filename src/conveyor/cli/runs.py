"""``conveyor run``, ``resume``, ``submit`` and ``worker``: processing runs."""

import os
import shlex
import sys
from typing import Annotated, Any

import typer

from conveyor.cli.common import (
    DEFAULT_BLOBS,
    INPUT_HELP,
    AcceptCode,
    Blobs,
    BudgetUsd,
    Db,
    Input,
    Json,
    Key,
    Lane,
    Meta,
    PathColumn,
    ProviderBatch,
    Sets,
    SkipBadLines,
    StrictInputs,
    Target,
    Text,
    Value,
    Workers,
    app,
    check_limits_env,
    default_workers,
    emit,
    finish_run,
    interrupted,
    released_everything,
    resume_hint,
    stage_output_to_stderr,
    stages_progress,
    store_for,
    submit_options,
    table_input,
    writable_blobs,
)
from conveyor.errors import NotFound, StoreMissing, UserError
from conveyor.store import DEFAULT_DB, open_store


@app.command()
def run(
    target: Target, input: Input, workers: Workers = default_workers(),
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False, lane: Lane = "bulk",
    skip_bad_lines: SkipBadLines = False, strict_inputs: StrictInputs = False, accept_code_change: AcceptCode = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="create nothing: say what would run, what the memo "
                                          "would answer, and the forecast tokens, cost and wall time")] = False,
    sample: Annotated[int, typer.Option("--sample", min=0, help="with --dry-run, for stages with no past attempts: "
                                        "run this many items for real in a scratch store to measure them (paid "
                                        "for; 0: no sample)")] = 3,
    budget_usd: BudgetUsd = None, provider_batch: ProviderBatch = False, sets: Sets = None,
    key: Key = None, text: Text = None, path: PathColumn = None, value: Value = None, meta: Meta = None,
) -> None:
    """Submit INPUT and process it to completion; print the reconciliation."""
    from conveyor.runtime.services import require_provider
    from conveyor.runtime.target import load_target
    from conveyor.service.forks import forked_workers
    from conveyor.service.runs import Interrupted, RunOptions, run_pipeline

    input = table_input(input, key, text, path, value, meta)
    pipeline = load_target(target)
    check_limits_env()  # before any worker starts: a bad CONVEYOR_LIMITS would stop every one of them
    if dry_run:
        _dry_run(pipeline, target, input, db, blobs, workers, sample, skip_bad_lines, as_json, sets)
        return
    require_provider(pipeline)  # before the store, the blobs or a worker exist: a refusal leaves nothing behind
    # The workers are forked now, with the pipeline loaded, before the store is opened (service/forks.py).
    with forked_workers(pipeline, target, workers) as forks:
        blob_store = writable_blobs(blobs)
        options = RunOptions(workers=workers, lane=lane, provider_batch=provider_batch, forks=forks,
                             submit=submit_options(skip_bad_lines, strict_inputs, accept_code_change,
                                                   budget_usd=budget_usd, sets=sets))
        with store_for(db) as store, stages_progress(as_json) as progress, stage_output_to_stderr():
            try:
                summary = run_pipeline(pipeline, target, input, store, blob_store, options, progress)
            except Interrupted as exc:
                interrupted(exc.run_id, db, blobs)
    released_everything()
    finish_run(summary, as_json, input, resume_hint(summary["run_id"], db, blobs))


def _dry_run(pipeline: Any, target: str, input: str, db: str, blobs: str, workers: int, sample: int,
             skip_bad_lines: bool, as_json: bool, sets: list[str] | None) -> None:
    """``run --dry-run``: reads the store when there is one, creates nothing either way."""
    from conveyor.blobs import open_blobs
    from conveyor.cli import render
    from conveyor.service.dryrun import dry_run

    try:
        store = open_store(db or DEFAULT_DB, create=False)
    except StoreMissing:
        store = open_store("sqlite:///:memory:")  # no history, no memo: everything would run
    try:
        with stage_output_to_stderr():
            data = dry_run(pipeline, target, input, store, open_blobs(blobs), max(1, workers), sample, skip_bad_lines,
                           tuple(sets or ()))
    finally:
        store.close()
    emit(data, as_json, render.dry_run)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="the run to finish")], workers: Workers = default_workers(),
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
    skip_bad_lines: SkipBadLines = False, strict_inputs: StrictInputs = False, accept_code_change: AcceptCode = None,
    budget_usd: BudgetUsd = None, provider_batch: ProviderBatch = False,
) -> None:
    """Finish a run: its submission, if that stopped part way, then its tasks (a paused run carries on, with a
    new --budget-usd when its budget is spent); print the reconciliation."""
    from conveyor.service.runs import Interrupted, RunOptions, resume_run

    check_limits_env()
    options = RunOptions(workers=workers, provider_batch=provider_batch,
                         submit=submit_options(skip_bad_lines, strict_inputs, accept_code_change,
                                               budget_usd=budget_usd))
    try:
        store = open_store(db or DEFAULT_DB, create=False)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_id!r}: {exc}") from None
    store.close()
    with store_for(db) as store, stages_progress(as_json) as progress, stage_output_to_stderr():
        blob_store = writable_blobs(blobs)  # after the store: resuming in a folder with no store creates nothing
        try:
            summary = resume_run(run_id, store, blob_store, options, progress)
        except Interrupted as exc:
            interrupted(exc.run_id, db, blobs)
    released_everything()
    finish_run(summary, as_json, resume_with=resume_hint(summary["run_id"], db, blobs))


@app.command()
def submit(
    target: Target,
    input: Annotated[str | None, typer.Option("--input", "-i", help=INPUT_HELP)] = None,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False, lane: Lane = "bulk",
    skip_bad_lines: SkipBadLines = False, strict_inputs: StrictInputs = False, accept_code_change: AcceptCode = None,
    resume_run: Annotated[str | None, typer.Option("--resume", metavar="RUN", help="finish the submission of "
                                                   "RUN, which stopped part way (its input is read again)")] = None,
    sets: Sets = None,
    key: Key = None, text: Text = None, path: PathColumn = None, value: Value = None, meta: Meta = None,
) -> None:
    """Create a run without processing it; print its id."""
    from conveyor.runtime.target import load_target
    from conveyor.service.report import stale_code_warnings
    from conveyor.service.runs import sigterm_as_interrupt
    from conveyor.service.submit import submit as submit_run

    if input is not None:
        input = table_input(input, key, text, path, value, meta)
    elif key or text or path or value or meta:
        raise UserError("--key, --text, --path, --value and --meta name the columns of --input TABLE; a resumed "
                        "submission reads its table by the columns its run recorded")
    pipeline = load_target(target)
    blob_store = writable_blobs(blobs)
    if sets and resume_run is not None:
        raise UserError("--set is for a new run: a resumed submission keeps the parameters its run recorded")
    options = submit_options(skip_bad_lines, strict_inputs, accept_code_change, resume_run, sets=sets)
    with store_for(db) as store:
        source = input
        if resume_run is not None:
            from conveyor.service.report import find_run

            source = source or find_run(store, resume_run).input
        if source is None:
            raise UserError("give --input PATH (or --resume RUN to finish a submission that stopped)")
        started: list[str] = []
        try:
            with sigterm_as_interrupt():
                done = submit_run(pipeline, target, source, store, blob_store, lane=lane, options=options,
                                  on_run=started.append)
        except KeyboardInterrupt:
            if started and store.get_run(started[-1]) is not None:
                again = [a for a in sys.argv[1:] if a != "--json"]
                if "--resume" not in again:
                    again += ["--resume", started[-1]]
                interrupted(started[-1], db, blobs, " ".join(shlex.quote(a) for a in ["conveyor", *again]))
            raise
    if not done.expected:
        typer.echo(f"warning: --input {source} holds no items; the run expects 0", err=True)
    for line in stale_code_warnings(done.stale_code):
        typer.echo(line, err=True)
    data = {"run_id": done.run_id, "expected": done.expected, "cached": done.cached, "resumed": done.resumed,
            "stale_code": done.stale_code}
    emit(data, as_json, lambda d: typer.echo(d["run_id"]))


@app.command()
def worker(
    target: Target,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="exit when no task is left")] = False,
    run_id: Annotated[str | None, typer.Option("--run", help="only this run's tasks")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 1000,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", min=0, max=65535, help="serve Prometheus metrics at http://0.0.0.0:N/metrics")] = None,
    provider_batch: ProviderBatch = False,
) -> None:
    """Process tasks from the shared store; run as many as you like, anywhere."""
    from conveyor.runtime.services import require_provider
    from conveyor.runtime.target import load_target
    from conveyor.runtime.worker import Worker, WorkerOptions
    from conveyor.service.fleet import exit_with_parent
    from conveyor.store.dialect import ENV_SQLITE_CACHE, WORKER_SQLITE_CACHE_MB

    exit_with_parent()  # a worker of `conveyor serve` stops when the server's process is gone
    # A worker's SQLite page cache is the small one (its memory), unless CONVEYOR_SQLITE_CACHE_MB says otherwise.
    os.environ.setdefault(ENV_SQLITE_CACHE, str(WORKER_SQLITE_CACHE_MB))

    pipeline = load_target(target)
    require_provider(pipeline)  # before the store or the blobs are made: a refusal leaves nothing behind
    with store_for(db):  # fail fast, with one line, on a bad URL or unreachable server
        pass
    blob_store = writable_blobs(blobs)
    if metrics_port is not None:
        _serve_metrics(metrics_port, db, pipeline)
    # A fleet started by `run` is --quiet: the run itself says what its workers found, once.
    options = WorkerOptions(run_id=run_id, until_idle=until_idle, batch_size=batch_size, warn_stale_code=not quiet,
                            provider_batch=provider_batch)
    with stage_output_to_stderr():
        stats = Worker(pipeline, target, db, blob_store, options).run()
    data = {"worker": "done", **dict(stats)}
    if as_json:
        emit(data, True, lambda d: None)
    elif not quiet:
        typer.echo(" ".join(f"{k}={v}" for k, v in sorted(stats.items())), err=True)




def _serve_metrics(port: int, db: str, pipeline: Any) -> None:
    """The store's metrics at http://0.0.0.0:PORT/metrics, from a daemon thread, while the worker runs."""
    from conveyor.metrics import serve_metrics

    try:
        serve_metrics(port, db, [pipeline])
    except OSError as exc:
        raise UserError(f"--metrics-port {port}: cannot listen there ({exc.strerror}); pick a free port") from None
