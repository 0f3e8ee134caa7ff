"""What ``Pipeline.run(inputs)`` takes, as what a submission reads: a path, or items made from Python objects.

``_items_of`` is the one dispatch on the kind of ``inputs``; table inputs (pandas and polars DataFrames, pyarrow
Tables) join it there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from conveyor.errors import UserError
from conveyor.service.inputs import MEMORY_INPUT, SourceItem, check_input, iter_items, memory_items

Inputs = str | os.PathLike[str] | Iterable[tuple[str, bytes | str | dict[str, Any]]] | Iterable[Mapping[str, Any]]
"""A folder, a file or a JSONL manifest (what ``--input`` takes); ``(key, value)`` pairs (bytes, str or a dict,
which becomes its JSON text with sorted keys); or dicts shaped like manifest lines."""

_TABLE_MODULES = ("pandas", "polars", "pyarrow")


class Source(NamedTuple):
    """What a submission reads: ``path`` (the run's recorded input, read by the submission, and again by a resume
    of it), or ``items`` read already, with ``path`` only a label (``python:TYPE``)."""

    path: str
    items: list[SourceItem] | None = None


def _items_of(inputs: Inputs) -> Source:
    """The source of ``inputs``: a path as the command line's ``--input``; Python objects checked as a manifest is
    (a bad entry or a key given twice: one-line InputError) before any run exists."""
    if isinstance(inputs, str | os.PathLike):
        return Source(os.fspath(inputs))
    if _is_table(inputs):
        # Tables (DataFrames, pyarrow Tables) are read by service/tables.py, which this dispatch will call.
        raise UserError(f"a {type(inputs).__name__} is a table: table inputs are not read yet; give (key, value) "
                        "pairs, dicts like manifest lines, or write it as a JSONL manifest")
    if isinstance(inputs, bytes | Mapping) or not isinstance(inputs, Iterable):
        raise UserError(f"inputs: a {type(inputs).__name__} is not an input; give a folder, file or manifest path, "
                        "(key, value) pairs, or dicts like manifest lines")
    return Source(MEMORY_INPUT + type(inputs).__name__, memory_items(inputs))


def _is_table(inputs: object) -> bool:
    return type(inputs).__module__.split(".")[0] in _TABLE_MODULES


def resume_items(inputs: Inputs | None) -> list[SourceItem] | Iterable[SourceItem] | None:
    """The items a resumed submission reads again: None to read the run's recorded input."""
    if inputs is None:
        return None
    source = _items_of(inputs)
    if source.items is not None:
        return source.items
    check_input(source.path)
    return iter_items(Path(source.path))
