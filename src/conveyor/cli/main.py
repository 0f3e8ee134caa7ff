"""The ``conveyor`` command: a thin shell over the service functions.

Exit codes: 0 every item published or completed; 2 a user error (one line on stderr); 3 items
unaccounted or not at an end yet (or a submission that did not finish); 4 items failed, dead-lettered
or rejected; 5 none of those, but items await review; 130 interrupted (the line says how to resume).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from typer.exceptions import TyperException

from conveyor import __version__
from conveyor.blobs import open_blobs
from conveyor.errors import ConveyorError, NotFound, StoreMissing, UserError
from conveyor.store import DEFAULT_DB, SqlStore, open_store

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False, help="Durable, idempotent batch AI pipelines.")
dlq_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                      help="The dead-letter list: inspect and replay poison tasks.")
app.add_typer(dlq_app, name="dlq")

DEFAULT_BLOBS = ".conveyor/blobs"
INTERRUPTED = 130
F = TypeVar("F", bound=Callable[..., Any])

Db = Annotated[str, typer.Option("--db", envvar="CONVEYOR_DB", help="sqlite:///file.db or postgresql://...")]
Blobs = Annotated[str, typer.Option("--blobs", envvar="CONVEYOR_BLOBS", help="blob folder or file:// URL")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]
Target = Annotated[str, typer.Argument(help="file.py:pipeline or package.module:pipeline")]
Input = Annotated[str, typer.Option("--input", "-i", help="a folder, a file, or a manifest.jsonl")]
Lane = Annotated[str, typer.Option("--lane", help="bulk, or interactive: claimed first, with a reserved share "
                                   "of every provider quota")]
Workers = Annotated[int, typer.Option("--workers", "-w", help="worker processes (default: one per CPU core); "
                                      "0 runs in this process")]
SkipBadLines = Annotated[bool, typer.Option(
    "--skip-bad-lines", help="a manifest line that is not JSON or has no usable key becomes a bad_input item "
    "(keyed MANIFEST:LINE) instead of refusing the submission")]
StrictInputs = Annotated[bool, typer.Option(
    "--strict-inputs", help="refuse the whole submission when a source cannot be read, instead of making that "
    "item fail with bad_input")]
ACCEPT_CODE = "--accept-code-change"
AcceptCode = Annotated[list[str] | None, typer.Option(
    ACCEPT_CODE, metavar="[STAGE]", help="keep outputs that other code of STAGE made under its current "
    "version (silences stale_code for it); repeat for more stages; without STAGE, every stage")]


def main() -> None:
    """Entry point: user errors print one line and exit 2, never a traceback."""
    logging.basicConfig(level=os.environ.get("CONVEYOR_LOG", "WARNING").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _every_stage_when_unnamed(sys.argv)
    try:
        code = app(standalone_mode=False)
    except TyperException as exc:  # a usage error: Typer's own parser found it
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.format_message(), err=True)
            raise SystemExit(2) from None
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        _fail(f"error: {exc.format_message()}{where}", exc.exit_code)
    except typer.Abort:
        _fail("interrupted", INTERRUPTED)
    except UserError as exc:
        _fail(f"error: {exc}", 2)
    except ConveyorError as exc:
        _fail(f"error [{exc.code}]: {exc}", 1)
    raise SystemExit(code if isinstance(code, int) else 0)


def _every_stage_when_unnamed(argv: list[str]) -> None:
    """``--accept-code-change`` with no STAGE after it means every stage (Typer has no optional values);
    what follows it is not a STAGE when it is an option or a TARGET (``file.py:pipe``)."""
    for index in range(len(argv) - 1, 0, -1):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if argv[index] == ACCEPT_CODE and (following is None or following.startswith("-") or ":" in following):
            argv.insert(index + 1, "*")


def _fail(line: str, code: int) -> None:
    typer.echo(" ".join(line.split("\n")), err=True)
    raise SystemExit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"conveyor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """Durable, idempotent batch AI pipelines."""


@contextmanager
def _store(db: str, create: bool = True) -> Iterator[SqlStore]:
    store = open_store(db or DEFAULT_DB, create=create)
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


def _writable_blobs(url: str) -> Any:
    blobs = open_blobs(url)
    check = getattr(blobs, "check_writable", None)
    if check is not None:
        check()
    return blobs


def _finish_run(summary: dict[str, Any], as_json: bool, input_label: str | None = None) -> None:
    """Warnings on stderr, the summary, and the exit code a script can read."""
    from conveyor.cli import render
    from conveyor.service.report import exit_code, stale_code_warnings

    if input_label is not None and not summary["expected"]:
        typer.echo(f"warning: --input {input_label} holds no items; the run expects 0", err=True)
    if summary.get("resumed"):
        typer.echo(f"note: finished the submission of run {summary['run_id']}, which had stopped part way "
                   "(items already submitted were kept, none twice)", err=True)
    for line in stale_code_warnings(summary.get("stale_code") or []):
        typer.echo(line, err=True)
    _emit(summary, as_json, render.summary)
    code = exit_code(summary)
    if code:
        raise typer.Exit(code)


def _resume_hint(run_id: str, db: str, blobs: str) -> str:
    parts = ["conveyor", "resume", run_id]
    if db != DEFAULT_DB:
        parts += ["--db", db]
    if blobs != DEFAULT_BLOBS:
        parts += ["--blobs", blobs]
    return " ".join(shlex.quote(p) for p in parts)


def _interrupted(run_id: str, db: str, blobs: str, command: str | None = None) -> None:
    hint = command or _resume_hint(run_id, db, blobs)
    typer.echo(f"interrupted: run {run_id} is not finished; resume it with: {hint}", err=True)
    raise typer.Exit(INTERRUPTED)


def _submit_options(skip_bad_lines: bool, strict_inputs: bool, accept: list[str] | None,
                    resume: str | None = None) -> Any:
    from conveyor.service.submit import SubmitOptions

    return SubmitOptions(skip_bad_lines=skip_bad_lines, strict_inputs=strict_inputs, resume=resume,
                         accept_code_change=tuple(accept or ()))


def _stages_progress(as_json: bool) -> Any:
    from conveyor.cli import render

    return render.progress(bars=not as_json)


# --- commands ---------------------------------------------------------------

def _default_workers() -> int:
    from conveyor.service.runs import default_workers

    return default_workers()


@app.command()
def run(
    target: Target, input: Input, workers: Workers = _default_workers(),
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False, lane: Lane = "bulk",
    skip_bad_lines: SkipBadLines = False, strict_inputs: StrictInputs = False, accept_code_change: AcceptCode = None,
) -> None:
    """Submit INPUT and process it to completion; print the reconciliation."""
    from conveyor.runtime.target import load_target
    from conveyor.service.runs import Interrupted, RunOptions, run_pipeline

    pipeline = load_target(target)
    _check_limits_env()  # before any worker starts: a bad CONVEYOR_LIMITS would stop every one of them
    blob_store = _writable_blobs(blobs)
    options = RunOptions(workers=workers, lane=lane,
                         submit=_submit_options(skip_bad_lines, strict_inputs, accept_code_change))
    with _store(db) as store, _stages_progress(as_json) as progress, _stage_output_to_stderr():
        try:
            summary = run_pipeline(pipeline, target, input, store, blob_store, options, progress)
        except Interrupted as exc:
            _interrupted(exc.run_id, db, blobs)
    _finish_run(summary, as_json, input)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="the run to finish")], workers: Workers = _default_workers(),
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
    skip_bad_lines: SkipBadLines = False, strict_inputs: StrictInputs = False, accept_code_change: AcceptCode = None,
) -> None:
    """Finish a run: its submission, if that stopped part way, then its tasks; print the reconciliation."""
    from conveyor.service.runs import Interrupted, RunOptions, resume_run

    _check_limits_env()
    options = RunOptions(workers=workers, submit=_submit_options(skip_bad_lines, strict_inputs, accept_code_change))
    try:
        store = open_store(db or DEFAULT_DB, create=False)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_id!r}: {exc}") from None
    store.close()
    with _store(db) as store, _stages_progress(as_json) as progress, _stage_output_to_stderr():
        blob_store = _writable_blobs(blobs)  # after the store: resuming in a folder with no store creates nothing
        try:
            summary = resume_run(run_id, store, blob_store, options, progress)
        except Interrupted as exc:
            _interrupted(exc.run_id, db, blobs)
    _finish_run(summary, as_json)


@app.command()
def submit(
    target: Target,
    input: Annotated[str | None, typer.Option("--input", "-i", help="a folder, a file, or a manifest.jsonl")]
    = None,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False, lane: Lane = "bulk",
    skip_bad_lines: SkipBadLines = False, strict_inputs: StrictInputs = False, accept_code_change: AcceptCode = None,
    resume_run: Annotated[str | None, typer.Option("--resume", metavar="RUN", help="finish the submission of "
                                                   "RUN, which stopped part way (its input is read again)")] = None,
) -> None:
    """Create a run without processing it; print its id."""
    from conveyor.runtime.target import load_target
    from conveyor.service.report import stale_code_warnings
    from conveyor.service.runs import sigterm_as_interrupt
    from conveyor.service.submit import submit as submit_run

    pipeline = load_target(target)
    blob_store = _writable_blobs(blobs)
    options = _submit_options(skip_bad_lines, strict_inputs, accept_code_change, resume_run)
    with _store(db) as store:
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
                _interrupted(started[-1], db, blobs, " ".join(shlex.quote(a) for a in ["conveyor", *again]))
            raise
    if not done.expected:
        typer.echo(f"warning: --input {source} holds no items; the run expects 0", err=True)
    for line in stale_code_warnings(done.stale_code):
        typer.echo(line, err=True)
    data = {"run_id": done.run_id, "expected": done.expected, "cached": done.cached, "resumed": done.resumed,
            "stale_code": done.stale_code}
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
    blob_store = _writable_blobs(blobs)
    # A fleet started by `run` is --quiet: the run itself says what its workers found, once.
    options = WorkerOptions(run_id=run_id, until_idle=until_idle, batch_size=batch_size, warn_stale_code=not quiet)
    with _stage_output_to_stderr():
        stats = Worker(pipeline, target, db, blob_store, options).run()
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

    try:
        with _store(db, create=False) as store:
            data = status_report(store, find_run(store, run_id)) if run_id else list_status(store)
    except StoreMissing as exc:
        if run_id:
            raise NotFound(f"no run {run_id!r}: {exc}") from None
        data = {"runs": []}
    _emit(data, as_json, render.status)


@app.command()
def quota(db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """What the fleet holds of each provider model's limit in the current window, and any pause."""
    from conveyor.cli import render
    from conveyor.runtime.quota import window_seconds
    from conveyor.service.report import quota_report

    try:
        with _store(db, create=False) as store:
            data = quota_report(store)
    except StoreMissing:
        data = {"window_s": window_seconds(), "models": []}
    _emit(data, as_json, render.quota)


@app.command()
def reconcile(
    run_id: Annotated[str, typer.Argument(help="the run id")], db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS,
    as_json: Json = False,
    sample: Annotated[int, typer.Option("--sample", min=0, help="accepted records per slice value in the "
                                        "quality sample (0: none)")] = 3,
    slices: Annotated[list[str] | None, typer.Option("--slice", metavar="FIELD", help="also slice the sample by "
                                                     "this field of the accepted record (dotted path); repeat "
                                                     "for more")] = None,
    seed: Annotated[str | None, typer.Option("--seed", help="the sample's seed (default: the run id)")] = None,
) -> None:
    """Every expected item with its outcome, cost per accepted item and a quality sample; exits 3 when items
    are unaccounted or not done, 4 when some failed or were rejected, 5 when some await review."""
    from conveyor.cli import render
    from conveyor.service.records import SampleOptions
    from conveyor.service.report import exit_code, find_run
    from conveyor.service.report import reconcile as reconcile_run

    options = SampleOptions(sample, tuple(slices or ()), seed)
    try:
        with _store(db, create=False) as store:
            data = reconcile_run(store, find_run(store, run_id), blobs=open_blobs(blobs), sample=options)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_id!r}: {exc}") from None
    _emit(data, as_json, render.reconciliation)
    code = exit_code(data)
    if code:
        raise typer.Exit(code)


@app.command()
def diff(
    run_a: Annotated[str, typer.Argument(help="the earlier run")],
    run_b: Annotated[str, typer.Argument(help="the later run (a reprocess)")],
    limit: Annotated[int, typer.Option("--limit", min=0, help="items listed (counts cover every item)")] = 1000,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
) -> None:
    """What a reprocess changed, per item: new, removed, changed (field by field), unchanged, newly failing,
    newly accepted."""
    from conveyor.cli import render
    from conveyor.service.diff import diff_runs

    try:
        with _store(db, create=False) as store:
            data = diff_runs(store, open_blobs(blobs), run_a, run_b, limit)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_a!r}: {exc}") from None
    _emit(data, as_json, render.diff)


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
    with _store(db, create=False) as store:
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

    try:
        with _store(db, create=False) as store:
            data = list_entries(store, run, stage, error_class, all_)
    except StoreMissing:
        data = {"entries": []}
    _emit(data, as_json, render.dlq)


@dlq_app.command("show")
def dlq_show(entry_id: Annotated[int, typer.Argument(help="dead-letter id")], db: Db = DEFAULT_DB,
             as_json: Json = False) -> None:
    """One dead letter with its full error and every attempt."""
    from conveyor.cli import render
    from conveyor.service.report import dlq_show as show_entry

    with _store(db, create=False) as store:
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

    if not reason.strip():
        raise UserError("a replay needs --reason \"why\"; it is recorded with the dead letter")
    with _store(db, create=False) as store:
        data = replay(store, list(ids or []), reason, run, stage, error_class, all_)
    _emit(data, as_json, lambda d: typer.echo(f"replayed {d['replayed']} task(s): {d['reason']}"))


# Command groups in modules of their own (they import the helpers above).
from conveyor.cli import publications as _publications  # noqa: E402, F401  (publications, rollback, search)
from conveyor.cli.review import review_app  # noqa: E402

app.add_typer(review_app, name="review")
