"""Writing an export's rows (service/export.py) as Parquet, JSON lines or CSV, a batch at a time.

The columns: the export's leading ones (``item_key``, ``outcome`` ...), the value's columns in the order they
were first seen (``value.KEY`` ..., ``value``), then provenance (``run_id`` ... ``cost``). JSON lines need no
fixed columns: each line is one row's object, nested values nested, bytes as base64. CSV and Parquet fix
their columns (and Parquet its types) from the first batch of rows; nested values are JSON text in CSV and
structs and lists in Parquet, bytes base64 in CSV and binary in Parquet. When a later batch brings a value
column the first did not have, or a Parquet value column whose type it cannot hold (a string where numbers
were; a float where integers were; a struct with a new field), the file is written again from the start with
the wider columns: a new column added, integers widened to floats, structs to the union of their fields,
and what does not unify becomes JSON text. After MAX_RESTARTS such restarts every value is one JSON-text
column ``value``, which fits any row. The file is written under a temporary name and renamed at the end,
so a failed export leaves no half file; ``-`` (stdout) gets JSON lines as they are read, and CSV or Parquet
once the file is complete.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from conveyor.errors import UserError
from conveyor.service.export import VALUE, VALUE_PREFIX, Export, Row

FORMATS = ("parquet", "jsonl", "csv")
MAX_RESTARTS = 4
STDOUT = "-"


class Widened(Exception):
    """A batch did not fit the columns written so far; ``layout`` is the wider one to write again with."""

    def __init__(self, layout: Layout) -> None:
        super().__init__("columns widened")
        self.layout = layout


@dataclass
class Layout:
    """The value columns of a file, in order, with their Arrow types for Parquet (None: not fixed yet);
    ``whole``: every value is one JSON-text column (the last resort)."""

    values: list[str] = field(default_factory=list)
    types: dict[str, Any] = field(default_factory=dict)
    text: set[str] = field(default_factory=set)  # value columns written as JSON text
    whole: bool = False
    fixed: bool = False


def write_export(export: Export, fmt: str, out: str) -> dict[str, Any]:
    """Write every row of ``export`` to ``out`` (a path, or ``-``) as ``fmt``; ``{"rows", "path", "format"}``."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        arrow()
    try:
        return _write(export, fmt, out)
    except BrokenPipeError:
        raise
    except OSError as exc:  # a full disk, a folder gone: the part file is gone too
        raise UserError(f"--out {out}: cannot write ({exc.strerror or exc}); nothing was left there") from None


def _write(export: Export, fmt: str, out: str) -> dict[str, Any]:
    target = None if out == STDOUT else checked_path(out)
    if fmt == "jsonl" and target is None:
        rows = _jsonl(export, sys.stdout)
        sys.stdout.flush()
        return {"rows": rows, "path": STDOUT, "format": fmt} | export.head
    name = _part_file(target, fmt)
    try:
        rows = _write_file(export, fmt, name)
        if target is None:
            with open(name, "rb") as f:
                shutil.copyfileobj(f, sys.stdout.buffer)
            sys.stdout.flush()
        else:
            os.replace(name, target)
    finally:
        if os.path.exists(name):
            os.unlink(name)
    return {"rows": rows, "path": STDOUT if target is None else str(target), "format": fmt} | export.head


def _part_file(target: Path | None, fmt: str) -> str:
    """A new, empty temporary file beside ``target`` (in the temporary folder for stdout), made with the
    process's umask as the file it becomes will be; a folder that cannot be written is a one-line error."""
    folder = target.parent if target is not None else Path(tempfile.gettempdir())
    name = folder / f".{target.name if target is not None else 'conveyor-export'}.{secrets.token_hex(6)}.{fmt}.part"
    try:
        with open(name, "xb"):
            pass
    except OSError as exc:
        raise UserError(f"--out {target or STDOUT}: cannot write in {str(folder)!r} ({exc.strerror}); write "
                        "elsewhere") from None
    return str(name)


def checked_path(out: str) -> Path:
    """``--out PATH`` whose folder exists (a one-line error otherwise)."""
    path = Path(out).expanduser()
    if path.is_dir():
        raise UserError(f"--out {out}: is a folder; name the file to write")
    if not path.parent.is_dir():
        raise UserError(f"--out {out}: no folder {str(path.parent)!r}; create it first or write elsewhere")
    return path


def arrow(needs: str = "--format parquet", instead: str = " (or use --format jsonl or csv)") -> Any:
    """pyarrow, or the one-line error that names the extra to install (``needs``: what asked for it)."""
    try:
        import pyarrow
    except ImportError:
        raise UserError(f"{needs} needs pyarrow: pip install 'conveyor[data]'{instead}") from None
    return pyarrow


def arrow_table(export: Export, needs: str = "to_arrow()") -> Any:
    """Every row of ``export`` as one Arrow table, with the columns and types its Parquet file has (the same
    widening as the file's, batch by batch; ``needs``: what asked, for the error when pyarrow is missing)."""
    pa = arrow(needs, "")
    layout = Layout()
    for _ in range(MAX_RESTARTS + 1):
        try:
            return _arrow_tables(pa, export, layout)
        except Widened as exc:
            layout = exc.layout
    return _arrow_tables(pa, export, Layout(values=[VALUE], whole=True, fixed=True))


def _arrow_tables(pa: Any, export: Export, layout: Layout) -> Any:
    tables = [_table(pa, export, batch, layout) for batch in export.batches()]
    return pa.concat_tables(tables) if tables else _schema(pa, export, layout).empty_table()


def _write_file(export: Export, fmt: str, name: str) -> int:
    layout = Layout()
    for _ in range(MAX_RESTARTS + 1):
        try:
            if fmt == "parquet":
                with open(name, "wb") as data:
                    return _parquet(export, data, layout)
            with open(name, "w", newline="", encoding="utf-8") as text:
                return _jsonl(export, text) if fmt == "jsonl" else _csv(export, text, layout)
        except Widened as exc:
            layout = exc.layout
    return _write_file_whole(export, fmt, name)


def _write_file_whole(export: Export, fmt: str, name: str) -> int:
    layout = Layout(values=[VALUE], whole=True, fixed=True)
    if fmt == "csv":
        with open(name, "w", newline="", encoding="utf-8") as text:
            return _csv(export, text, layout)
    with open(name, "wb") as data:
        return _parquet(export, data, layout)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _jsonl(export: Export, f: IO[str]) -> int:
    rows = 0
    for batch in export.batches():
        f.write("".join(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n" for row in batch))
        rows += len(batch)
    return rows


def _value_columns(export: Export, batch: list[Row], layout: Layout) -> list[str]:
    """The value columns of ``batch`` not in ``layout`` yet, in the order first seen."""
    known = {*export.lead, *export.trail, *layout.values}
    new: dict[str, None] = {}
    for row in batch:
        if row.keys() - known:
            for name in row:
                if name not in known and name not in new and (name == VALUE or name.startswith(VALUE_PREFIX)):
                    new[name] = None
    return list(new)


def whole_value(row: Row) -> Any:
    """A row's value as one JSON object again (what ``Layout.whole`` writes)."""
    if VALUE in row:
        return row[VALUE]
    fields = {k[len(VALUE_PREFIX):]: v for k, v in row.items() if k.startswith(VALUE_PREFIX)}
    return fields or None


# --- CSV -----------------------------------------------------------------------------------------------------------

def _csv(export: Export, f: IO[str], layout: Layout) -> int:
    writer = csv.writer(f)
    rows = 0
    for batch in export.batches():
        if not layout.fixed:
            layout.values += _value_columns(export, batch, layout)
            layout.fixed = True
            writer.writerow([*export.lead, *layout.values, *export.trail])
        elif not layout.whole and (new := _value_columns(export, batch, layout)):
            raise Widened(Layout(values=layout.values + new, fixed=False))
        columns = [*export.lead, *layout.values, *export.trail]
        for row in batch:
            if layout.whole:
                row = row | {VALUE: _text(whole_value(row))}
            writer.writerow([_cell(row.get(name)) for name in columns])
        rows += len(batch)
    if not layout.fixed:
        writer.writerow([*export.lead, *export.trail])
    return rows


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float)):
        return "" if value is None else value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return json.dumps(value, ensure_ascii=False)


def _text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=_json_default)


# --- Parquet -------------------------------------------------------------------------------------------------------

def _parquet(export: Export, f: IO[bytes], layout: Layout) -> int:
    pa = arrow()
    import pyarrow.parquet as pq

    writer = None
    rows = 0
    try:
        for batch in export.batches():
            table = _table(pa, export, batch, layout)
            if writer is None:
                writer = pq.ParquetWriter(f, table.schema)
            writer.write_table(table)
            rows += len(batch)
        if writer is None:
            writer = pq.ParquetWriter(f, _schema(pa, export, layout))
    finally:
        if writer is not None:
            writer.close()
    return rows


def _schema(pa: Any, export: Export, layout: Layout) -> Any:
    fixed = _fixed_types(pa)
    return pa.schema([(n, fixed.get(n, pa.string())) for n in export.lead]
                     + [(n, layout.types.get(n) or pa.null()) for n in layout.values]
                     + [(n, fixed.get(n, pa.string())) for n in export.trail])


def _fixed_types(pa: Any) -> dict[str, Any]:
    return {"version": pa.int64(), "tokens": pa.int64(), "cost": pa.float64()}


def _table(pa: Any, export: Export, batch: list[Row], layout: Layout) -> Any:
    """``batch`` as an Arrow table of the layout's columns; Widened when it does not fit them."""
    first = not layout.fixed
    if first:
        layout.values += _value_columns(export, batch, layout)
    elif not layout.whole and (new := _value_columns(export, batch, layout)):
        wider = Layout(values=layout.values + new, types=dict(layout.types), text=set(layout.text))
        for name in new:
            found, _ = _inferred(pa, [row.get(name) for row in batch])
            wider.types[name] = pa.string() if found == "json" else found
            if found == "json":
                wider.text.add(name)
        raise Widened(wider)
    arrays = {}
    for name in layout.values:
        values = [_text(whole_value(row)) for row in batch] if layout.whole else [row.get(name) for row in batch]
        arrays[name] = _column(pa, name, values, layout, first)
    layout.fixed = True
    fixed = _fixed_types(pa)
    columns = {n: pa.array([row[n] for row in batch], type=fixed.get(n, pa.string()))
               for n in (*export.lead, *export.trail)}
    names = [*export.lead, *layout.values, *export.trail]
    return pa.table({n: columns[n] if n in columns else arrays[n] for n in names})


def _column(pa: Any, name: str, values: list[Any], layout: Layout, first: bool) -> Any:
    """One value column of a batch, in its layout type (which the first batch sets)."""
    if layout.whole:
        return pa.array(values, type=pa.string())
    if name in layout.text:
        return pa.array([_text(v) for v in values], type=pa.string())
    want = layout.types.get(name)
    found, array = _inferred(pa, values)
    if first and want is None:
        if found == "json":
            layout.types[name] = pa.string()
            layout.text.add(name)
            return pa.array([_text(v) for v in values], type=pa.string())
        layout.types[name] = found
        return array
    if want is None or found == "json":
        raise Widened(_widen(layout, name, pa.string() if found == "json" else found, json_text=found == "json"))
    if found == want:
        return array
    if found == pa.null():
        return pa.nulls(len(values), type=want)
    unified = _unify(pa, want, found)
    if unified == want:
        return array.cast(want)
    raise Widened(_widen(layout, name, unified or pa.string(), json_text=unified is None))


def _widen(layout: Layout, name: str, type_: Any, json_text: bool) -> Layout:
    wider = Layout(values=list(layout.values), types=dict(layout.types), text=set(layout.text))
    wider.types[name] = type_
    if json_text:
        wider.text.add(name)
    return wider


def _inferred(pa: Any, values: list[Any]) -> tuple[Any, Any]:
    """The Arrow type of these values and their array, or ``"json"`` (and None) when they have none that
    Parquet can write (mixed types, integers past 64 bits, an empty object)."""
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return "json", None
    return (array.type, array) if _writable(pa, array.type) else ("json", None)


def _writable(pa: Any, type_: Any) -> bool:
    if pa.types.is_struct(type_):
        return type_.num_fields > 0 and all(_writable(pa, type_.field(i).type) for i in range(type_.num_fields))
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return bool(_writable(pa, type_.value_type))
    return True


def _unify(pa: Any, a: Any, b: Any) -> Any:
    """The type that holds both (integers and floats: floats; structs: the union of their fields), or None."""
    try:
        merged = pa.unify_schemas([pa.schema([("x", a)]), pa.schema([("x", b)])], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    type_ = merged.field("x").type
    return type_ if _writable(pa, type_) else None


def iter_rows(export: Export) -> Iterator[Row]:
    """Every row of ``export``, one at a time (for a caller that wants rows, not files)."""
    for batch in export.batches():
        yield from batch
