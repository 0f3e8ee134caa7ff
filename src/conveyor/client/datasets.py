"""Results as data: a run's items, or a collection's live versions, as tuples, Arrow, Parquet and DataFrames.

The rows are those of ``conveyor export`` (service/export.py, which states the one rule for nesting: a value
that is a JSON object spreads its top-level keys into columns ``value.KEY``, nested values stay nested; any
other value is the column ``value``), read a batch at a time from the store.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from conveyor.errors import StoreMissing, UserError
from conveyor.service.datasets import arrow_table, iter_rows, whole_value, write_export
from conveyor.service.export import VALUE, VALUE_PREFIX, Export, Row, collection_export

if TYPE_CHECKING:
    from conveyor.blobs import Blobs
    from conveyor.client.workspace import Workspace
    from conveyor.pipeline import Pipeline
    from conveyor.store import SqlStore

_NOT_PROVENANCE = ("item_key", "outcome")


class Result(NamedTuple):
    """One item's result: its key, its value (the output of the export's stage, as the stage returned it; None
    for an item that did not get that far), ``provenance`` (the row's other columns: ``error_class`` and
    ``error`` of an item that did not make it, ``model``, ``prompt_version``, ``stage``, ``stage_version``,
    ``config_hash``, ``source_digest``, ``tokens``, ``cost``, ``run_id``; a collection's ``collection`` and
    ``version``) and its ``outcome`` as ``reconcile`` counts it."""

    item_key: str
    value: Any
    provenance: dict[str, Any]
    outcome: str


class _Rows(ABC):
    """What a run and a collection share: their rows, read through one ``Export`` per call."""

    workspace: Workspace

    @abstractmethod
    def _export(self, store: SqlStore, blobs: Blobs, stage: str | None, outcome: str | None) -> Export:
        """The rows this object stands for (a run's items, a collection's live versions)."""

    def _results(self, stage: str | None, outcome: str | None) -> Iterator[Result]:
        with self.workspace.opened(create=False) as store:
            for row in iter_rows(self._export(store, self.workspace.blob_store(), stage, outcome)):
                yield result_of(row)

    def _arrow(self, stage: str | None, outcome: str | None, needs: str) -> Any:
        with self.workspace.opened(create=False) as store:
            return arrow_table(self._export(store, self.workspace.blob_store(), stage, outcome), needs)

    def _pandas(self, stage: str | None, outcome: str | None) -> Any:
        _frames("pandas", "to_pandas()")
        return self._arrow(stage, outcome, "to_pandas()").to_pandas()

    def _polars(self, stage: str | None, outcome: str | None) -> Any:
        polars = _frames("polars", "to_polars()")
        return polars.from_arrow(self._arrow(stage, outcome, "to_polars()"))

    def _parquet(self, path: str | os.PathLike[str], stage: str | None, outcome: str | None) -> dict[str, Any]:
        with self.workspace.opened(create=False) as store:
            return write_export(self._export(store, self.workspace.blob_store(), stage, outcome), "parquet",
                                os.fspath(path))


def result_of(row: Row) -> Result:
    """An export row as a ``Result``."""
    provenance = {k: v for k, v in row.items()
                  if k not in _NOT_PROVENANCE and k != VALUE and not k.startswith(VALUE_PREFIX)}
    return Result(row["item_key"], whole_value(row), provenance, row["outcome"])


def _frames(name: str, needs: str) -> Any:
    """pandas or polars, or the one-line error that names what to install."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise UserError(f"{needs} needs {name}: pip install 'conveyor[dataframes]' (or {name} itself)") from None


class Collection(_Rows):
    """A collection of the built-in target (``conveyor.open().collection("manuals")``): its live published
    versions, one row per item key (rolled-back and retracted items have none), with ``collection``,
    ``version``, the version's fields as ``value.KEY`` columns and the provenance of the task that published it.
    """

    def __init__(self, workspace: Workspace, name: str) -> None:
        self.workspace, self.name = workspace, name

    def __repr__(self) -> str:
        return f"Collection({self.name!r})"

    def _export(self, store: SqlStore, blobs: Blobs, stage: str | None, outcome: str | None) -> Export:
        return collection_export(store, blobs, self.name)

    def results(self) -> Iterator[Result]:
        """Each live version as ``(item_key, value, provenance, "published")``, streamed in key order."""
        return self._results(None, None)

    def to_arrow(self) -> Any:
        """The live versions as one ``pyarrow.Table`` (needs the ``data`` extra)."""
        return self._arrow(None, None, "to_arrow()")

    def to_pandas(self) -> Any:
        """The live versions as a pandas DataFrame (needs pandas and pyarrow: the ``dataframes`` extra)."""
        return self._pandas(None, None)

    def to_polars(self) -> Any:
        """The live versions as a polars DataFrame (needs polars and pyarrow: the ``dataframes`` extra)."""
        return self._polars(None, None)

    def to_parquet(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Write the live versions to the Parquet file ``path`` (written whole, then renamed into place);
        ``{"rows", "path", ...}``."""
        return self._parquet(path, None, None)

    def search(self, query: str, *, mode: str = "words", limit: int = 10,
               pipeline: Pipeline | None = None) -> list[dict[str, Any]]:
        """The live versions that answer ``query``, best first, as ``conveyor search --json`` gives its
        ``results`` (``item_key``, ``version``, ``score`` or ``similarity``, ``snippet``, ``fields``, ...).
        ``mode``: ``"words"`` (every word occurs), ``"semantic"`` (by meaning: the query embedded with the model
        that made the collection's vectors, through ``pipeline``'s provider when given, else the local
        all-MiniLM-L6-v2) or ``"hybrid"`` (both rankings fused by reciprocal rank)::

            conveyor.open().collection("manuals").search("compress a file", mode="semantic")[0]["item_key"]
        """
        from conveyor.service.embedder import query_embedder
        from conveyor.service.publications import MODES, check_search
        from conveyor.service.publications import search as find

        check_search(query, limit, mode)
        assert mode in MODES  # check_search said so
        try:
            with self.workspace.opened(create=False) as store:
                found = find(store, query, self.name, limit, mode,
                             query_embedder(pipeline) if mode != "words" else None)
        except StoreMissing:
            if mode != "words":
                raise UserError("nothing has been published in this store yet: there are no vectors to "
                                "search") from None
            return []
        return list(found["results"])
