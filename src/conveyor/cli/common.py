"""What the command modules share: the app, option types, opening the store, printing, run endings."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from conveyor.places import BLOBS_ENV, DB_ENV, resume_command
from conveyor.places import DEFAULT_BLOBS as DEFAULT_BLOBS

if TYPE_CHECKING:
    from conveyor.store import SqlStore

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False, help="Durable, idempotent batch AI pipelines.")

INTERRUPTED = 130
F = TypeVar("F", bound=Callable[..., Any])

Db = Annotated[str, typer.Option("--db", envvar=DB_ENV, help="sqlite:///file.db or postgresql://...")]
Blobs = Annotated[str, typer.Option("--blobs", envvar=BLOBS_ENV,
                                    help="blob folder, file:// URL or s3://BUCKET/PREFIX")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]
Target = Annotated[str, typer.Argument(help="file.py:pipeline or package.module:pipeline")]
INPUT_HELP = ("a folder, a file, a manifest.jsonl, a table (.parquet, .csv, .jsonl with --key) or an S3 prefix "
              "(s3://BUCKET/PREFIX/)")
Input = Annotated[str, typer.Option("--input", "-i", help=INPUT_HELP)]
Key = Annotated[str | None, typer.Option("--key", metavar="COL", help="--input is a table: COL holds the item keys")]
Text = Annotated[str | None, typer.Option("--text", metavar="COL", help="with --key: each item's bytes are COL's "
                                          "text (UTF-8)")]
PathColumn = Annotated[str | None, typer.Option("--path", metavar="COL", help="with --key: each item's bytes are the "
                                                "file COL names (relative to the table's folder)")]
Value = Annotated[str | None, typer.Option("--value", metavar="COL", help="with --key: each item's bytes are COL's "
                                           "value as JSON with sorted keys")]
Meta = Annotated[list[str] | None, typer.Option("--meta", metavar="COL", help="with --key: COL's value goes into "
                                                "each item's meta ({COL: value}); repeat for more")]
Lane = Annotated[str, typer.Option("--lane", help="bulk, or interactive: claimed first, with a reserved share "
                                   "of every provider quota")]
Workers = Annotated[int, typer.Option("--workers", "-w", help="worker processes (default: one per CPU core); "
                                      "0 runs in this process")]
SkipBadLines = Annotated[bool, typer.Option(
    "--skip-bad-lines", help="a manifest line that is not JSON or has no usable key (a table's row with no usable "
    "key or source) becomes a bad_input item (keyed MANIFEST:LINE, TABLE:ROW) instead of refusing the submission")]
StrictInputs = Annotated[bool, typer.Option(
    "--strict-inputs", help="refuse the whole submission when a source cannot be read, instead of making that "
    "item fail with bad_input")]
BudgetUsd = Annotated[float | None, typer.Option(
    "--budget-usd", metavar="USD", help="the run's ceiling on provider spending: no model call is granted once spent "
    "plus reserved would pass it; the run pauses (paused_budget) and `conveyor resume RUN --budget-usd MORE` carries "
    "on")]
ProviderBatch = Annotated[bool, typer.Option(
    "--provider-batch", help="every stage that calls a model sends its ctx.chat calls through the provider's Batch "
    "API at the batch price; its tasks wait, holding no worker, until their batch answers (a call still waiting "
    "past the stage's batch_deadline, 24 h by default, is made directly)")]
ACCEPT_CODE = "--accept-code-change"
Sets = Annotated[list[str] | None, typer.Option(
    "--set", metavar="NAME=VALUE", help="a run parameter (Pipeline(params=...)), recorded with the run: its "
    "workers, resumes and replays use the recorded value; repeat for more")]
AcceptCode = Annotated[list[str] | None, typer.Option(
    ACCEPT_CODE, metavar="[STAGE]", help="keep outputs that other code of STAGE made under its current "
    "version (silences stale_code for it); repeat for more stages; without STAGE, every stage")]


@contextmanager
def store_for(db: str, create: bool = True) -> Iterator[SqlStore]:
    """The store at ``db`` (``create=False``: StoreMissing when there is none). A store this opening created is
    told on stderr once the command's work went through: a command that fails says one line, its error."""
    from conveyor.store import new_store_note, opened_store

    with opened_store(db, create=create) as store:
        note = new_store_note(store)
        yield store
        tell_new_store(note)


def tell_new_store(note: str | None) -> None:
    """Say on stderr that the command created a new store (``store.new_store_note``), when it did."""
    if note is not None:
        typer.echo(f"conveyor: {note}", err=True)


def emit(data: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        import json

        sys.stdout.write(json.dumps(data, default=str) + "\n")
        sys.stdout.flush()
    else:
        render(data)


@contextmanager
def stage_output_to_stderr() -> Iterator[None]:
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


def check_limits_env() -> None:
    from conveyor.pipeline import parse_limits
    from conveyor.pipeline.limits import ENV_VAR

    parse_limits(os.environ.get(ENV_VAR))


def writable_blobs(url: str) -> Any:
    from conveyor.blobs import open_blobs

    blobs = open_blobs(url)
    check = getattr(blobs, "check_writable", None)
    if check is not None:
        check()
    return blobs


def finish_run(summary: dict[str, Any], as_json: bool, input_label: str | None = None,
               resume_with: str | None = None) -> None:
    """Warnings on stderr, the summary, and the exit code a script can read; ``resume_with``: the command that
    resumes the run, said on stderr when it ended paused (on its budget or breaker)."""
    from conveyor.cli import render
    from conveyor.service.report import exit_code, stale_code_warnings

    if input_label is not None and not summary["expected"]:
        typer.echo(f"warning: --input {input_label} holds no items; the run expects 0", err=True)
    if summary.get("resumed"):
        typer.echo(f"note: finished the submission of run {summary['run_id']}, which had stopped part way "
                   "(items already submitted were kept, none twice)", err=True)
    for line in stale_code_warnings(summary.get("stale_code") or []):
        typer.echo(line, err=True)
    emit(summary, as_json, render.summary)
    paused = str(summary.get("status", ""))
    if resume_with is not None and paused.startswith("paused_"):
        more = " --budget-usd MORE" if paused == "paused_budget" else ""
        typer.echo(not_finished("paused", summary["run_id"], resume_with + more, summary.get("note")), err=True)
    code = exit_code(summary)
    if code:
        raise typer.Exit(code)


_released = {"everything": False}


def released_everything() -> None:
    """Said by a command once it has closed its store and its workers have exited (``run``, ``resume``): when it
    returns, ``main`` ends the process with ``quick_exit`` instead of the interpreter's teardown."""
    _released["everything"] = True


def quick_exit(code: int) -> None:
    """End the process now, when a command released everything: its output flushed and the exit handlers run
    (logging's, an exporter's), but not the interpreter's teardown, which frees every object one by one (0.1 to
    0.2 s after a run, most of what a small run spends after its last task). Only the main thread may be left,
    and no profiler or debugger may be watching (they report as the interpreter ends); otherwise this returns and
    the process ends as usual."""
    import atexit
    import threading

    if not _released["everything"] or threading.active_count() != 1 or sys.getprofile() or sys.gettrace():
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def resume_hint(run_id: str, db: str, blobs: str) -> str:
    return resume_command(run_id, db, blobs)


def not_finished(head: str, run_id: str, command: str, why: str | None = None) -> str:
    """The line that says a run stopped before its end (interrupted, paused), why, and how to carry on."""
    because = f" ({' '.join(why.split())})" if why else ""
    return f"{head}: run {run_id} is not finished{because}; resume it with: {command}"


def interrupted(run_id: str, db: str, blobs: str, command: str | None = None) -> None:
    typer.echo(not_finished("interrupted", run_id, command or resume_hint(run_id, db, blobs)), err=True)
    raise typer.Exit(INTERRUPTED)


def table_input(input: str, key: str | None, text: str | None, path: str | None, value: str | None,
                meta: list[str] | None) -> str:
    """``--input`` as the run records it: a table read by the columns named, or the input as given (with a note on
    stderr for a Parquet or CSV file given without --key: it is one item)."""
    from conveyor.service.tables import input_spec, unkeyed_note

    spec = input_spec(input, key, text, path, value, tuple(meta or ()))
    note = unkeyed_note(spec)
    if note is not None:
        typer.echo(note, err=True)
    return spec


def submit_options(skip_bad_lines: bool, strict_inputs: bool, accept: list[str] | None,
                   resume: str | None = None, budget_usd: float | None = None, sets: list[str] | None = None) -> Any:
    from conveyor.service.submit import SubmitOptions

    return SubmitOptions(skip_bad_lines=skip_bad_lines, strict_inputs=strict_inputs, resume=resume,
                         accept_code_change=tuple(accept or ()), budget_usd=checked_budget(budget_usd),
                         sets=tuple(sets or ()))


def checked_budget(value: float | None) -> float | None:
    """``--budget-usd`` as a budget, or a one-line error."""
    from conveyor.errors import PipelineError, UserError
    from conveyor.pipeline.budget import budget

    try:
        return budget(value, "--budget-usd")
    except PipelineError as exc:
        raise UserError(str(exc)) from None


def stages_progress(as_json: bool) -> Any:
    from conveyor.cli import render

    return render.progress(bars=not as_json)


def default_workers() -> int:
    from conveyor.service.fleet import default_workers as one_per_core

    return one_per_core()
