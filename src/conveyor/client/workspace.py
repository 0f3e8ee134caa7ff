"""``conveyor.open()``: a handle on a store and its blob store, found as the command line finds them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from conveyor.places import blobs_url, db_url, resume_command

if TYPE_CHECKING:
    from conveyor.blobs import Blobs
    from conveyor.client.datasets import Collection
    from conveyor.client.run import Run
    from conveyor.pipeline import Pipeline
    from conveyor.store import SqlStore


def open(db: str | None = None, blobs: str | os.PathLike[str] | None = None) -> Workspace:
    """A handle on the store at ``db`` and the blob store at ``blobs``, each defaulting as the command line's
    ``--db`` and ``--blobs`` do: ``$CONVEYOR_DB`` / ``$CONVEYOR_BLOBS``, else ``.conveyor/`` in the current
    folder. Nothing is opened until used; a run creates the store when there is none.

    Example::

        ws = conveyor.open("postgresql://localhost/conveyor", "s3://bucket/conveyor")
        run = pipe.run("docs/", store=ws)
        ws.collection("manuals").to_parquet("manuals.parquet")
    """
    return Workspace(db_url(db), blobs_url(blobs))


class Workspace:
    """A store (``db``: its URL) and its blob store (``blobs``: a folder or URL). Opens the store for each call
    and closes it after, as a command does, so a handle may be kept as long as you like and shared between
    threads."""

    def __init__(self, db: str, blobs: str) -> None:
        self.db, self.blobs = db, blobs

    def __repr__(self) -> str:
        return f"Workspace(db={self.db!r}, blobs={self.blobs!r})"

    def run(self, run_id: str, pipeline: Pipeline | None = None) -> Run:
        """The run ``run_id`` (NotFound when the store has none such), to read, reconcile or resume. ``pipeline``:
        its Pipeline, to resume a run of one declared where it cannot be loaded again (a notebook cell); by
        default a resume loads it from the run's recorded target, as ``conveyor resume`` does."""
        from conveyor.client.run import Run
        from conveyor.errors import NotFound, StoreMissing
        from conveyor.service.report import find_run

        try:
            with self.opened(create=False) as store:
                find_run(store, run_id)
        except StoreMissing as exc:
            raise NotFound(f"no run {run_id!r}: {exc}") from None
        return Run(self, run_id, pipeline)

    def collection(self, name: str) -> Collection:
        """The collection ``name`` of the built-in target: its live published versions as data."""
        from conveyor.client.datasets import Collection

        return Collection(self, name)

    @contextmanager
    def opened(self, create: bool = True) -> Iterator[SqlStore]:
        """The store, open for the block (``create=False``: StoreMissing when there is none); a connection lost
        on the way is one line that says so."""
        from conveyor.store import opened_store

        with opened_store(self.db, create=create) as store:
            yield store

    def blob_store(self, writable: bool = False) -> Blobs:
        """The blob store (``writable``: checked that it can be written, as a run needs)."""
        from conveyor.blobs import open_blobs

        blobs = open_blobs(self.blobs)
        check = getattr(blobs, "check_writable", None) if writable else None
        if check is not None:
            check()
        return blobs

    def python_open(self) -> str:
        """The ``conveyor.open(...)`` call that gives this handle again (its arguments when not the defaults)."""
        args = [repr(value) if value != default else None for value, default in
                ((self.db, db_url()), (self.blobs, blobs_url()))]
        given = [f"{name}={arg}" for name, arg in zip(("db", "blobs"), args, strict=True) if arg is not None]
        return f"conveyor.open({', '.join(given)})"

    def resume_command(self, run_id: str) -> str:
        """The shell command that resumes ``run_id`` on this store."""
        return resume_command(run_id, self.db, self.blobs)
