"""What ``Pipeline.run(inputs)`` takes, as what a submission reads: a path, or items made from Python objects.

``_items_of`` is the one dispatch on the kind of ``inputs``. A table (a pandas or polars DataFrame, a pyarrow
Table or RecordBatchReader, or a .parquet/.csv/.jsonl file named with ``key=``) is read by the command line's
table reader (service/tables.py) by the columns ``key=`` and one of ``text=``, ``path=`` or ``value=`` name
(``meta=`` columns become the item's meta): a DataFrame is handed to it as the Arrow table it converts to.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from conveyor.errors import UserError
from conveyor.service.inputs import MEMORY_INPUT, SourceItem, check_input, iter_items, memory_items
from conveyor.service.tables import TableColumns, check_table, input_spec, table_items

Inputs = str | os.PathLike[str] | Iterable[tuple[str, bytes | str | dict[str, Any]]] | Iterable[Mapping[str, Any]]
"""A folder, a file or a JSONL manifest (what ``--input`` takes); ``(key, value)`` pairs (bytes, str or a dict,
which becomes its JSON text with sorted keys); or dicts shaped like manifest lines."""

_TABLE_MODULES = ("pandas", "polars", "pyarrow")


class Source(NamedTuple):
    """What a submission reads: ``path`` (the run's recorded input, read by the submission, and again by a resume
    of it), or ``items`` read already, with ``path`` only a label (``python:TYPE``)."""

    path: str
    items: list[SourceItem] | None = None


@dataclass(frozen=True)
class Columns:
    """The columns ``Pipeline.run`` was told to read a table by (``key=``, ``text=``...): none named, or a key
    and exactly one source column."""

    key: str | None = None
    text: str | None = None
    path: str | None = None
    value: str | None = None
    meta: tuple[str, ...] = ()

    @property
    def named(self) -> bool:
        return any(c is not None for c in (self.key, self.text, self.path, self.value)) or bool(self.meta)

    def table(self) -> TableColumns:
        if self.key is None:
            raise UserError("a table's items need key=COLUMN (the column of item keys) and one of text=, path= or "
                            "value=")
        return TableColumns(self.key, self.text, self.path, self.value, self.meta)


def _items_of(inputs: Inputs, columns: Columns | None = None) -> Source:
    """The source of ``inputs``: a path as the command line's ``--input``; a table by ``columns``; Python objects
    checked as a manifest is (a bad entry or a key given twice: one-line InputError) before any run exists."""
    columns = columns or Columns()
    if isinstance(inputs, str | os.PathLike):
        if not columns.named:
            return Source(os.fspath(inputs))
        return Source(input_spec(os.fspath(inputs), columns.key, columns.text, columns.path, columns.value,
                                 columns.meta))
    if _is_table(inputs):
        if not columns.named:
            raise UserError(f"a {type(inputs).__name__} is a table: name its columns, key=COLUMN and one of "
                            "text=, path= or value= (meta=[COLUMN, ...] for the item's meta)")
        table = arrow_of(inputs)
        wanted = columns.table()
        check_table(table, wanted)
        return Source(MEMORY_INPUT + type(inputs).__name__, list(table_items(table, wanted)))
    if columns.named:
        raise UserError(f"key=, text=, path=, value= and meta= name a table's columns; a {type(inputs).__name__} "
                        "is not a table: leave them out")
    if isinstance(inputs, bytes | Mapping) or not isinstance(inputs, Iterable):
        raise UserError(f"inputs: a {type(inputs).__name__} is not an input; give a folder, file or manifest path, "
                        "(key, value) pairs, or dicts like manifest lines")
    return Source(MEMORY_INPUT + type(inputs).__name__, memory_items(inputs))


def _is_table(inputs: object) -> bool:
    return type(inputs).__module__.split(".")[0] in _TABLE_MODULES


def arrow_of(table: Any) -> Any:
    """A pandas or polars DataFrame as the pyarrow Table it converts to (a pandas index is left out: name a
    column); a pyarrow Table or RecordBatchReader as it is."""
    kind = type(table).__module__.split(".")[0]
    if kind == "pandas":
        pa = _pyarrow()
        return pa.Table.from_pandas(table, preserve_index=False)
    if kind == "polars":
        _pyarrow()
        return table.to_arrow()
    return table


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise UserError("reading a DataFrame's rows needs pyarrow: pip install 'conveyor[dataframes]'") from None
    return pyarrow


def resume_items(inputs: Inputs | None,
                 columns: Columns | None = None) -> list[SourceItem] | Iterable[SourceItem] | None:
    """The items a resumed submission reads again: None to read the run's recorded input."""
    if inputs is None:
        return None
    source = _items_of(inputs, columns)
    if source.items is not None:
        return source.items
    check_input(source.path)
    return iter_items(source.path)
