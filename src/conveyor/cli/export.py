"""``conveyor export RUN | --collection NAME``: a run's items, or a collection's live versions, as a dataset
(Parquet, JSON lines or CSV), streamed a batch at a time (it only reads)."""

import os
from typing import Annotated, Any

import typer

from conveyor.cli.common import DEFAULT_BLOBS, Blobs, Db, Json, app, emit, store_for
from conveyor.errors import NotFound, StoreMissing, UserError
from conveyor.store import DEFAULT_DB


@app.command()
def export(
    run_id: Annotated[str | None, typer.Argument(help="the run whose items to export (`conveyor status` lists "
                                                "them)")] = None,
    collection: Annotated[str | None, typer.Option("--collection", help="export this collection's live "
                                                   "published versions instead of a run")] = None,
    stage: Annotated[str | None, typer.Option("--stage", help="the stage whose output is the value (default: the "
                                              "stage of the item's accepted record)")] = None,
    outcome: Annotated[str | None, typer.Option(
        "--outcome", help="accepted (default: published, completed or accepted), all, or outcomes separated by "
        "commas (failed,dead_lettered ...)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="parquet (needs the 'data' extra), jsonl or csv")] = "jsonl",
    out: Annotated[str, typer.Option("--out", "-o", help="the file to write, or - for stdout")] = "-",
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
) -> None:
    """One row per item: its outcome and error class, its value's fields as columns, and its provenance."""
    from conveyor.blobs import open_blobs
    from conveyor.service.datasets import write_export
    from conveyor.service.export import collection_export, run_export

    if (run_id is None) == (collection is None):
        raise UserError("export either a RUN or --collection NAME, not both" if run_id is not None
                        else "name what to export: a RUN, or --collection NAME for its live published versions")
    if collection is not None and (stage is not None or outcome is not None):
        raise UserError("--stage and --outcome are for a RUN; --collection exports the live published versions")
    # An export reads each page once, in key order: a small page cache serves it as well as a large one, and
    # the process's memory stays within its bound whatever the size of the run.
    from conveyor.store.dialect import ENV_SQLITE_CACHE, WORKER_SQLITE_CACHE_MB

    os.environ.setdefault(ENV_SQLITE_CACHE, str(WORKER_SQLITE_CACHE_MB))
    try:
        with store_for(db, create=False) as store:
            if collection is not None:
                chosen = collection_export(store, open_blobs(blobs), collection)
            else:
                assert run_id is not None
                chosen = run_export(store, open_blobs(blobs), run_id, stage, outcome)
            summary = write_export(chosen, fmt, out)
    except StoreMissing as exc:
        raise NotFound(f"nothing to export: {exc}") from None
    except BrokenPipeError:  # the reader of stdout stopped (`| head`): not an error of the export
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return
    if out != "-":
        emit(summary, as_json, _render)


def _render(summary: dict[str, Any]) -> None:
    typer.echo(f"wrote {summary['rows']:,} row(s) to {summary['path']} ({summary['format']})", err=True)
