"""``Run``: one run of a pipeline, seen from Python: its status, its reconciliation, its resumption, its results."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.client.datasets import Result, _Rows
from conveyor.service.export import Export, run_export
from conveyor.service.report import find_run, reconcile, status_report

if TYPE_CHECKING:
    from conveyor.blobs import Blobs
    from conveyor.client.inputs import Inputs
    from conveyor.client.running import _Job
    from conveyor.client.workspace import Workspace
    from conveyor.pipeline import Pipeline
    from conveyor.store import SqlStore

ACCEPTED = "accepted"


class Run(_Rows):
    """A run in a store: the same run ``conveyor status RUN``, ``reconcile``, ``resume`` and ``export`` see.

    ``Pipeline.run`` returns one finished, ``Pipeline.submit`` one still working (``wait()``), and
    ``conveyor.open().run(RUN_ID)`` any run of the store. Results are one row per root item, in key order: every
    item has one (``outcome="all"``), so one that did not make it says why (``outcome``, ``error_class``).

    Example::

        run = pipe.run([("a", "first text"), ("b", {"title": "second"})], workers=0)
        for key, value, provenance, outcome in run.results():
            print(key, value, provenance["cost"])
        run.to_parquet("accepted.parquet")
    """

    def __init__(self, workspace: Workspace, run_id: str, pipeline: Pipeline | None = None,
                 job: _Job | None = None) -> None:
        self.workspace, self._id, self.pipeline, self._job = workspace, run_id, pipeline, job

    def __repr__(self) -> str:
        return f"Run({self._id!r})"

    @property
    def id(self) -> str:
        """The run's id (``r20261205-…``), as the command line names it."""
        return self._id

    @property
    def pipeline_name(self) -> str:
        if self.pipeline is not None:
            return self.pipeline.name
        with self.workspace.opened(create=False) as store:
            return find_run(store, self._id).pipeline

    def wait(self, timeout: float | None = None) -> Run:
        """Wait until the work this process started on the run (``Pipeline.submit``) ends, at most ``timeout``
        seconds (it goes on past them); raise what it stopped on (``Interrupted`` on Ctrl-C: the run is left
        resumable). A run this process does not work on returns at once."""
        if self._job is not None:
            self._job.wait(timeout)
        return self

    def status(self) -> dict[str, Any]:
        """Per-stage task counts and totals, as ``conveyor status RUN --json`` gives them."""
        with self.workspace.opened(create=False) as store:
            return status_report(store, find_run(store, self._id))

    def reconcile(self) -> dict[str, Any]:
        """Every expected item in exactly one outcome, as ``conveyor reconcile RUN --json`` gives it:
        ``expected``, ``outcomes`` (counts), ``unaccounted`` (0 when every item has one), ``not_done``."""
        with self.workspace.opened(create=False) as store:
            return reconcile(store, find_run(store, self._id), blobs=self.workspace.blob_store())

    def resume(self, inputs: Inputs | None = None, *, workers: int | None = None, budget_usd: float | None = None,
               progress: bool = True, key: str | None = None, text: str | None = None, path: str | None = None,
               value: str | None = None, meta: Sequence[str] = ()) -> Run:
        """Finish the run, as ``conveyor resume`` does: its submission, if that stopped part way, then its tasks
        (a paused run carries on; ``budget_usd``: its new budget). A run submitted from Python objects whose
        submission stopped needs them again: ``inputs`` (a table's with its ``key=``, ``text=``... columns;
        items submitted already are kept, none twice)."""
        from conveyor.client.inputs import Columns
        from conveyor.client.running import resume

        if self._job is not None:
            self._job.wait()
        resume(self, inputs, workers, budget_usd, progress, Columns(key, text, path, value, tuple(meta)))
        return self

    def _export(self, store: SqlStore, blobs: Blobs, stage: str | None, outcome: str | None) -> Export:
        return run_export(store, blobs, self._id, stage, outcome)

    def results(self, stage: str | None = None, outcome: str = ACCEPTED) -> Iterator[Result]:
        """Each item as ``(item_key, value, provenance, outcome)``, streamed in key order. ``stage``: whose output
        is the value (default: the stage of the item's accepted record); ``outcome``: ``accepted`` (published,
        completed or accepted), ``all``, or outcomes separated by commas (``failed,dead_lettered``)."""
        return self._results(stage, outcome)

    def to_arrow(self, stage: str | None = None, outcome: str = ACCEPTED) -> Any:
        """The items as one ``pyarrow.Table``: ``item_key``, ``outcome``, ``error_class``, ``error``, the value's
        columns (``value.KEY`` for each top-level key of a JSON object, else ``value``), then provenance
        (``model`` … ``cost``); ``stage`` and ``outcome`` as for ``results``. Needs the ``data`` extra."""
        return self._arrow(stage, outcome, "to_arrow()")

    def to_pandas(self, stage: str | None = None, outcome: str = ACCEPTED) -> Any:
        """``to_arrow()`` as a pandas DataFrame (needs pandas and pyarrow: the ``dataframes`` extra)."""
        return self._pandas(stage, outcome)

    def to_polars(self, stage: str | None = None, outcome: str = ACCEPTED) -> Any:
        """``to_arrow()`` as a polars DataFrame (needs polars and pyarrow: the ``dataframes`` extra)."""
        return self._polars(stage, outcome)

    def to_parquet(self, path: str | os.PathLike[str], stage: str | None = None,
                   outcome: str = ACCEPTED) -> dict[str, Any]:
        """Write ``to_arrow()``'s rows to the Parquet file ``path``, a batch at a time, as ``conveyor export
        --format parquet`` does; ``{"rows", "path", ...}``."""
        return self._parquet(path, stage, outcome)
