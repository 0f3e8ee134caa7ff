"""``conveyor status``, ``quota``, ``reconcile``, ``diff`` and ``report``: what runs did (they only read)."""

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TextIO

import typer

from conveyor.cli.common import (
    DEFAULT_BLOBS,
    Blobs,
    Db,
    Json,
    app,
    emit,
    store_for,
)
from conveyor.errors import NotFound, StoreMissing, UserError
from conveyor.store import DEFAULT_DB

# The quality sample's options, as `reconcile` and `report` take them.
Sample = Annotated[int, typer.Option("--sample", min=0, help="accepted records per slice value in the quality "
                                     "sample (0: none)")]
Slices = Annotated[list[str] | None, typer.Option("--slice", metavar="FIELD", help="also slice the sample by this "
                                                  "field of the accepted record (dotted path); repeat for more")]
Seed = Annotated[str | None, typer.Option("--seed", help="the sample's seed (default: the run id)")]

@app.command()
def status(
    run_id: Annotated[str | None, typer.Argument(help="a run id; default: the recent runs")] = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Per-stage progress of one run, or a list of recent runs."""
    from conveyor.cli import render
    from conveyor.service.report import find_run, list_status, status_report

    try:
        with store_for(db, create=False) as store:
            data = status_report(store, find_run(store, run_id)) if run_id else list_status(store)
    except StoreMissing as exc:
        if run_id:
            raise NotFound(f"no run {run_id!r}: {exc}") from None
        data = {"runs": []}
    emit(data, as_json, render.status)


@app.command()
def quota(db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """What the fleet holds of each provider model's limit in the current window, and any pause."""
    from conveyor.cli import render
    from conveyor.runtime.quota import window_seconds
    from conveyor.service.report import quota_report

    try:
        with store_for(db, create=False) as store:
            data = quota_report(store)
    except StoreMissing:
        data = {"window_s": window_seconds(), "models": []}
    emit(data, as_json, render.quota)


@app.command("provider-batches")
def provider_batches(
    run_id: Annotated[str | None, typer.Option("--run", help="also the run's tasks waiting on batch answers")] = None,
    pipeline: Annotated[str | None, typer.Option("--pipeline", help="only this pipeline's batches")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="the newest N batches")] = 20,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """The provider batch lane: its batches (newest first), its requests by state, and a run's waiting tasks."""
    from conveyor.cli import render
    from conveyor.service.provider_batches import provider_batch_report

    try:
        with store_for(db, create=False) as store:
            data = provider_batch_report(store, pipeline, run_id, limit)
    except StoreMissing:
        data = {"pipeline": pipeline, "run_id": run_id, "batches": [], "requests": {}, "waiting": {}}
    emit(data, as_json, render.provider_batches)


@app.command()
def reconcile(
    run_id: Annotated[str, typer.Argument(help="the run id")], db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS,
    as_json: Json = False,
    sample: Sample = 3, slices: Slices = None, seed: Seed = None,
) -> None:
    """Every expected item with its outcome, cost per accepted item and a quality sample; exits 3 when items
    are unaccounted or not done, 4 when some failed or were rejected, 5 when some await review."""
    from conveyor.blobs import open_blobs
    from conveyor.cli import render
    from conveyor.service.records import SampleOptions
    from conveyor.service.report import exit_code, find_run
    from conveyor.service.report import reconcile as reconcile_run

    options = SampleOptions(sample, tuple(slices or ()), seed)
    try:
        with store_for(db, create=False) as store:
            data = reconcile_run(store, find_run(store, run_id), blobs=open_blobs(blobs), sample=options)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_id!r}: {exc}") from None
    emit(data, as_json, render.reconciliation)
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
    from conveyor.blobs import open_blobs
    from conveyor.cli import render
    from conveyor.service.diff import diff_runs

    try:
        with store_for(db, create=False) as store:
            data = diff_runs(store, open_blobs(blobs), run_a, run_b, limit)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_a!r}: {exc}") from None
    emit(data, as_json, render.diff)


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="the run id")],
    html: Annotated[str | None, typer.Option("--html", metavar="FILE", help="write the report as one "
                                             "self-contained HTML page to FILE (-: stdout)")] = None,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS,
    as_json: Annotated[bool, typer.Option("--json", help="print the report's data as one JSON object on "
                                          "stdout")] = False,
    sample: Sample = 3, slices: Slices = None, seed: Seed = None,
) -> None:
    """A report you can mail: the reconciliation, throughput over time, time from submission to outcome,
    attempts and errors by class, cost per accepted item and a quality sample, as one HTML page with inline
    charts (--html FILE) or as data (--json). Exits 0 once written, whatever the run's outcomes."""
    from conveyor.blobs import open_blobs
    from conveyor.cli.htmlreport import render_html
    from conveyor.service.records import SampleOptions
    from conveyor.service.report import find_run
    from conveyor.service.runreport import run_report

    if html is None and not as_json:
        raise UserError("say where the report goes: --html FILE (- for stdout), or --json")
    if html == "-" and as_json:
        raise UserError("--html - and --json would both print on stdout; give --html a FILE")
    with page_output(html) as page:
        try:
            with store_for(db, create=False) as store:
                data = run_report(store, find_run(store, run_id), open_blobs(blobs),
                                  SampleOptions(sample, tuple(slices or ()), seed))
        except StoreMissing as exc:
            raise NotFound(f"no run {run_id!r}: {exc}") from None
        if page is not None:
            page(render_html(data))
    if as_json:
        emit(data, True, lambda _: None)
    if html not in (None, "-"):
        typer.echo(f"wrote the report of run {data['run_id']} to {html}", err=True)


@contextmanager
def page_output(path: str | None) -> Iterator[Callable[[str], None] | None]:
    """A function that writes the page: to stdout for ``-``, else to a temporary file beside ``path`` that
    replaces it only when the block ends without an error (a failed report never leaves half a page); an
    unwritable path fails before any work."""
    if path is None or path == "-":
        yield None if path is None else _stdout
        return
    import tempfile

    target = Path(path)
    with _unwritable(path):
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with open(fd, "w", encoding="utf-8") as handle:
            yield lambda text: _write(handle, text, path)
        with _unwritable(path):
            os.chmod(temp, 0o666 & ~_umask())
            os.replace(temp, target)
    finally:
        Path(temp).unlink(missing_ok=True)


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _write(handle: TextIO, text: str, path: str) -> None:
    with _unwritable(path):
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def _unwritable(path: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; give --html a file in a writable "
                        "folder") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
