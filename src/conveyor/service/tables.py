"""Items from the rows of a table: a Parquet, CSV or JSONL file, or an Arrow table in memory.

``TableColumns`` names the column of item keys and exactly one column where each item's bytes come from:
``text`` (the text, UTF-8; a binary column's bytes as they are), ``path`` (a file, relative to the table's
folder as a manifest's paths are) or ``value`` (any JSON value: the bytes are its JSON with sorted keys, so
equal values are equal bytes whatever their keys' order); ``meta`` columns become the item's meta.

Rows stream a batch at a time (Parquet row batches, CSV blocks, JSONL lines) and the checks of a batch run
over whole columns, so a table costs no Python per row beyond making its items. The rules are the manifest's
(service/inputs.py): ``check_table`` refuses a bad row (a null or unusable key, a null source) and a key given
twice before a run is created, holding 8 bytes per key; with ``skip_bad_lines`` a bad row becomes a
``bad_input`` item keyed ``<table>:<row>`` (rows count from 1; a JSONL table counts lines, as manifests do).
A missing column, or one of a type its option cannot take, refuses the table whatever the options.

A run records its table and columns in one input label (``table_input``), so a resume, a replay or the same
command again reads the table the same way, and an unchanged table that passed its check is not checked again.
pyarrow (the ``data`` extra) is imported only when a table is read.
"""

from __future__ import annotations

import os
import shlex
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson

from conveyor.errors import InputError, UserError
from conveyor.service.inputs import (
    MAX_KEY_CHARS,
    TABLE_INPUT,
    SourceItem,
    _first_repeat,
    _lines,
    _repeated_hashes,
    file_signature,
    key_problem,
    printable_name,
    source_problem,
)
from conveyor.store import CHILD_MARK

TABLE_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
ROWS = 16_384  # rows per batch: large enough that a column operation dwarfs its call, small enough to stream
INSTALL = "pip install 'conveyor[data]'"
_OPTIONS = ("text", "path", "value")
# The rows a column check flags for a closer look (key_problem decides): RE2 syntax, code points.
_SUSPECT_KEY = "^group:|[\\x{0}-\\x{1f}\\x{7f}-\\x{9f}" + f"\\x{{{ord(CHILD_MARK):x}}}]"
_MAX_LISTED = 20


@dataclass(frozen=True)
class TableColumns:
    """Which columns of a table make an item: ``key``, exactly one of ``text``, ``path`` or ``value``, and
    ``meta`` (columns whose values become the item's meta, ``{column: value}``); for example
    ``TableColumns(key="id", text="body", meta=("lang",))``.
    """

    key: str
    text: str | None = None
    path: str | None = None
    value: str | None = None
    meta: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", tuple(self.meta))
        if not self.key:
            raise InputError("--key needs the name of the column that holds the item keys")
        if sum(getattr(self, option) is not None for option in _OPTIONS) != 1:
            raise InputError(f"--key {self.key} needs exactly one of --text COL, --path COL or --value COL: the "
                             "column each item's bytes come from")

    @property
    def source(self) -> tuple[str, str]:
        """(option, column) of the items' bytes, e.g. ("text", "body")."""
        return next((option, getattr(self, option)) for option in _OPTIONS if getattr(self, option) is not None)

    @property
    def names(self) -> list[str]:
        """Every column named, each once: key, source, meta."""
        return list(dict.fromkeys([self.key, self.source[1], *self.meta]))

    def option_of(self, name: str) -> str:
        """The option that names column ``name`` (--key, --text, ..., --meta)."""
        if name == self.key:
            return "--key"
        return "--meta" if name in self.meta and name != self.source[1] else f"--{self.source[0]}"

    def args(self) -> list[str]:
        """The command-line options that name these columns."""
        option, name = self.source
        return ["--key", self.key, f"--{option}", name, *(part for m in self.meta for part in ("--meta", m))]


# --- the run's input label ---------------------------------------------------------------------------

def input_spec(input_path: str, key: str | None = None, text: str | None = None, path: str | None = None,
               value: str | None = None, meta: list[str] | tuple[str, ...] = ()) -> str:
    """What a run records as its input: ``input_path`` as it is when no column is named, else the table and its
    columns (``table_input``); a one-line InputError for columns named without a table to read them from."""
    if key is None and text is None and path is None and value is None and not meta:
        return input_path
    named = " ".join(option for option, given in (("--text", text), ("--path", path), ("--value", value),
                                                  ("--meta", meta)) if given)
    if key is None:
        raise InputError(f"{named} reads a table's columns: name the column of item keys with --key COL too")
    return table_input(input_path, TableColumns(key, text, path, value, tuple(meta)))


def table_input(table: str | os.PathLike[str], columns: TableColumns) -> str:
    """The input label of ``table`` read by ``columns``: ``table:PATH --key K --text T ...`` (shell quoting), with
    the table's absolute path, so it is read the same way from anywhere. InputError for what is not a table."""
    named = str(table)
    if named.startswith("s3://") or Path(named).is_dir():
        raise InputError(f"--key and --{columns.source[0]} read the columns of a table; --input {named} is a "
                         "folder or prefix, whose files are the items: leave them out, or give a .parquet, .csv "
                         "or .jsonl file")
    if Path(named).suffix.lower() not in TABLE_FORMATS:
        raise InputError(f"--input {named} is not a table conveyor reads ({', '.join(sorted(TABLE_FORMATS))}); "
                         "convert it, or leave out --key to submit the file as one item")
    return TABLE_INPUT + shlex.join([str(Path(named).absolute()), *columns.args()])


def parse_table_input(label: str) -> tuple[Path, TableColumns]:
    """(table, columns) of an input label made by ``table_input``."""
    try:
        path, *args = shlex.split(label.removeprefix(TABLE_INPUT))
        pairs = dict(zip(args[0::2], args[1::2], strict=True))
        meta = tuple(args[i + 1] for i in range(0, len(args), 2) if args[i] == "--meta")
        columns = TableColumns(pairs["--key"], pairs.get("--text"), pairs.get("--path"), pairs.get("--value"), meta)
    except (ValueError, KeyError):
        raise InputError(f"input {label!r} is not a table and its columns; give --input TABLE --key COL "
                         "--text COL") from None
    return Path(path), columns


def unkeyed_note(input_path: str) -> str | None:
    """A note for a Parquet or CSV file given without --key: it is submitted as one item, as any file is."""
    if input_path.startswith(TABLE_INPUT) or Path(input_path).suffix.lower() not in (".parquet", ".pq", ".csv"):
        return None
    return (f"note: --input {input_path} is submitted as one item; to make an item of each row, name its columns "
            "with --key COL and --text, --path or --value COL")


def check_table_input(label: str, skip_bad_lines: bool = False) -> None:
    """``check_table`` of the table an input label names."""
    path, columns = parse_table_input(label)
    check_table(path, columns, skip_bad_lines)


def table_input_items(label: str, *, skip_bad_lines: bool = False, strict: bool = False) -> Iterator[SourceItem]:
    """``table_items`` of the table an input label names."""
    path, columns = parse_table_input(label)
    return table_items(path, columns, skip_bad_lines=skip_bad_lines, strict=strict)


def table_signature(label: str, skip_bad_lines: bool) -> tuple[str, str] | None:
    """(path, signature) of the table an input label names, as it is now, with its columns and options: a table
    with the signature of one that passed its check passes again."""
    path, columns = parse_table_input(label)
    if not path.is_file():
        return None
    return str(path.resolve()), file_signature(path, skip_bad_lines, shlex.join(columns.args()))


# --- reading ---------------------------------------------------------------------------------------------

def check_table(source: Any, columns: TableColumns, skip_bad_lines: bool = False) -> None:
    """Refuse, before anything is created, a table with a missing column, a column of the wrong type, a bad row
    (unless ``skip_bad_lines``) or a key given twice. ``source``: a path (.parquet, .csv, .jsonl), a
    ``pyarrow.Table`` or a ``pyarrow.RecordBatchReader`` (read once: give a Table to check it first and then read
    it). Streams the table, reading only the key and source columns; holds 8 bytes per key."""
    table = _open(source, columns)
    if table.once:
        raise InputError("a pyarrow RecordBatchReader can be read only once, so it cannot be checked first; "
                         "pass a pyarrow Table (reader.read_all()) or write it to a Parquet file")
    twice = _repeated_hashes(key for _, key in table.keys(skip_bad_lines))
    if not twice:
        return
    repeat_ = _first_repeat(table.keys(skip_bad_lines), twice)
    if repeat_ is not None:
        row, key, earlier = repeat_
        raise InputError(f"{table.where} {table.unit} {row}: key {key!r} is also on {table.unit} {earlier}; keys "
                         "must be unique within a table")


def table_items(source: Any, columns: TableColumns, *, skip_bad_lines: bool = False,
                strict: bool = False) -> Iterator[SourceItem]:
    """The items of a table's rows, streamed, in the table's order. ``source`` as for ``check_table`` (which
    finds keys given twice: run it first). A bad row is an InputError, or with ``skip_bad_lines`` a ``bad_input``
    item keyed ``<table>:<row>``; a ``path`` that cannot be read is a ``bad_input`` item (``strict``: an
    InputError), as in a manifest. Paths are relative to the table's folder (a table in memory: the working
    directory)."""
    return _open(source, columns).items(skip_bad_lines, strict)


def _open(source: Any, columns: TableColumns) -> _Table:
    """The reader of ``source``: a path or a pyarrow Table or RecordBatchReader."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise InputError(f"--input {str(path)!r} does not exist; give a .parquet, .csv or .jsonl table")
        problem = source_problem(path)
        if problem is not None:
            raise InputError(f"table {str(path)!r} {problem}")
        kind = TABLE_FORMATS.get(path.suffix.lower())
        if kind is None:
            raise InputError(f"{str(path)!r} is not a table conveyor reads ({', '.join(sorted(TABLE_FORMATS))})")
        if kind == "jsonl":
            return _JsonLines(path, columns)
        return _ArrowTable(path, columns, kind)
    return _ArrowTable(source, columns, "memory")


def pyarrow_modules() -> tuple[Any, Any]:
    """(pyarrow, pyarrow.compute), or the one-line error that names the extra to install."""
    try:
        import pyarrow
        import pyarrow.compute
    except ImportError:
        raise UserError(f"reading a table by its columns needs pyarrow: {INSTALL}") from None
    return pyarrow, pyarrow.compute


class _Table(ABC):
    """What the two readers share: where the table is (for messages and paths) and how a bad row is told."""

    once = False
    unit = "row"

    def __init__(self, where: str, name: str, base: Path, columns: TableColumns) -> None:
        self.where, self.name, self.base, self.columns = where, name, base, columns

    @abstractmethod
    def keys(self, skip_bad_lines: bool) -> Iterator[tuple[int, str]]:
        """(row, key) of each row with a usable key, for the check of keys given twice."""

    @abstractmethod
    def items(self, skip_bad_lines: bool, strict: bool) -> Iterator[SourceItem]:
        """The table's items, streamed."""

    def bad(self, row: int, why: str, skip_bad_lines: bool) -> SourceItem:
        """A bad row's ``bad_input`` item (``skip_bad_lines``), else its InputError."""
        if not skip_bad_lines:
            raise InputError(f"{self.where} {self.unit} {row}: {why} (or pass --skip-bad-lines)")
        return SourceItem(f"{self.name}:{row}", problem=f"{self.name} {self.unit} {row}: {why}")

    def path_item(self, key: str, given: str, row: int, strict: bool) -> SourceItem:
        """A ``path`` row's item: the file, relative to the table's folder, or why it cannot be read."""
        full = Path(given) if os.path.isabs(given) else self.base / given
        problem = source_problem(full)
        if problem is None:
            return SourceItem(key, path=full)
        if strict:
            raise InputError(f"{self.where} {self.unit} {row}: path {given!r} {problem}; fix it (or leave out "
                             "--strict-inputs)")
        return SourceItem(key, problem=f"path {given!r} ({self.unit} {row}) {problem}")

    def missing(self, name: str, have: list[str]) -> InputError:
        shown = ", ".join(repr(n) for n in have[:_MAX_LISTED]) + (
            f" and {len(have) - _MAX_LISTED:,} more" if len(have) > _MAX_LISTED else "")
        return InputError(f"{self.where} has no column {name!r} (named by {self.columns.option_of(name)}); its "
                          f"columns are {shown or 'none'}: name one of them")


def _row_problem(key: Any, source_null: bool, columns: TableColumns) -> str | None:
    """Why a row cannot be an item (its key as text or None, whether its source is null), or None."""
    if key is None:
        return f"column {columns.key!r} (--key) is null; every row needs a key"
    if not key:
        return f"column {columns.key!r} (--key) is empty; every row needs a key"
    problem = key_problem(key)
    if problem is not None:
        return problem
    if source_null:
        option, name = columns.source
        return f"column {name!r} (--{option}) is null; every row needs one"
    return None


# --- Arrow: Parquet, CSV, tables in memory --------------------------------------------------------------

class _ArrowTable(_Table):
    """A table pyarrow reads a batch at a time: Parquet (ParquetFile.iter_batches), CSV (csv.open_csv, streamed),
    or a Table or RecordBatchReader in memory."""

    def __init__(self, source: Any, columns: TableColumns, kind: str) -> None:
        self.pa, self.pc = pyarrow_modules()
        self.source, self.kind = source, kind
        if kind == "memory":
            if not isinstance(source, (self.pa.Table, self.pa.RecordBatchReader)):
                raise InputError(f"a table is a path, a pyarrow Table or a RecordBatchReader, not "
                                 f"{type(source).__name__}; convert it (pyarrow.Table.from_pandas, DataFrame.to_arrow)")
            super().__init__("the table", "table", Path.cwd(), columns)
            self.once = isinstance(source, self.pa.RecordBatchReader)
        else:
            super().__init__(str(source), printable_name(os.fsencode(Path(source).name)), Path(source).parent, columns)
        self.schema = self._schema()
        self._check_schema()

    # reading

    def _schema(self) -> Any:
        if self.kind == "parquet":
            import pyarrow.parquet

            try:
                return pyarrow.parquet.ParquetFile(self.source).schema_arrow
            except (self.pa.ArrowException, OSError) as exc:
                raise InputError(f"{self.where} is not a Parquet file pyarrow can read ({_line(exc)})") from None
        if self.kind == "csv":
            with self._csv(None) as reader:
                return reader.schema
        return self.source.schema

    def _csv(self, names: list[str] | None) -> Any:
        """A streaming CSV reader. The columns that must hold text are read as text ("007" stays "007"); the
        others' types are pyarrow's guess from the first block."""
        import pyarrow.csv

        option, name = self.columns.source
        strings = {self.columns.key: self.pa.string(), **({name: self.pa.string()} if option != "value" else {})}
        convert = pyarrow.csv.ConvertOptions(column_types=strings, include_columns=names)
        try:
            return pyarrow.csv.open_csv(self.source, convert_options=convert)
        except (self.pa.ArrowException, OSError) as exc:
            raise InputError(f"{self.where} is not a CSV file pyarrow can read ({_line(exc)})") from None

    def batches(self, names: list[str]) -> Iterator[Any]:
        """The table's record batches, with only the columns ``names``."""
        try:
            if self.kind == "parquet":
                import pyarrow.parquet

                yield from pyarrow.parquet.ParquetFile(self.source).iter_batches(batch_size=ROWS, columns=names)
            elif self.kind == "csv":
                with self._csv(names) as reader:
                    yield from reader
            elif self.once:
                for batch in self.source:
                    yield batch.select(names)
            else:
                yield from self.source.select(names).to_batches(max_chunksize=ROWS)
        except self.pa.ArrowInvalid as exc:
            hint = ("pyarrow guesses a CSV column's type from its first rows: make each column hold one type"
                    if self.kind == "csv" else "fix or rewrite the table")
            raise InputError(f"{self.where}: {_line(exc)}; {hint}") from None

    # checks of the whole table

    def _check_schema(self) -> None:
        have = list(self.schema.names)
        for name in self.columns.names:
            if name not in have:
                raise self.missing(name, have)
        types = {name: self.schema.field(name).type for name in self.columns.names}
        option, source = self.columns.source
        checks = [(self.columns.key, "--key", _key_type, "keys must be strings or integers: cast the column")]
        if option == "text":
            checks.append((source, "--text", _text_type, "--text takes strings or bytes (--value takes any JSON "
                           "value)"))
        elif option == "path":
            checks.append((source, "--path", _string_type, "--path takes strings: file paths"))
        for name in ([source] if option == "value" else []) + list(self.columns.meta):
            checks.append((name, self.columns.option_of(name), _json_type, "JSON cannot hold it: cast the column "
                           "(to double, string or a timestamp)"))
        for name, option_name, fits, hint in checks:
            if not fits(self.pa, types[name]):
                raise InputError(f"{self.where}: column {name!r} ({option_name}) holds {types[name]} values; {hint}")

    # rows

    def keys(self, skip_bad_lines: bool) -> Iterator[tuple[int, str]]:
        first = 1
        for batch in self.batches([self.columns.key, self.columns.source[1]]):
            keys, problems = self._keys(batch)
            if not problems:
                yield from zip(range(first, first + len(keys)), keys, strict=True)
            else:
                for index, key in enumerate(keys):
                    why = problems.get(index)
                    yield (first + index, key if why is None else self.bad(first + index, why, skip_bad_lines).key)
            first += batch.num_rows

    def items(self, skip_bad_lines: bool, strict: bool) -> Iterator[SourceItem]:
        first = 1
        for batch in self.batches(self.columns.names):
            yield from self._items(batch, first, skip_bad_lines, strict)
            first += batch.num_rows

    def _items(self, batch: Any, first: int, skip_bad_lines: bool, strict: bool) -> Iterator[SourceItem]:
        keys, problems = self._keys(batch)
        option, name = self.columns.source
        column = batch.column(name)
        metas = [(m, _json_values(self.pa, batch.column(m))) for m in self.columns.meta]
        if option == "text":
            texts = _as_bytes(self.pa, self.pc, column).to_pylist()
            if not problems and not metas:  # the usual table: no Python per row but the item itself
                yield from map(SourceItem, keys, repeat(None), texts)
                return
        given = column.to_pylist() if option != "text" else texts
        for index, key in enumerate(keys):
            row = first + index
            why = problems.get(index)
            if why is not None:
                yield self.bad(row, why, skip_bad_lines)
                continue
            if option == "text":
                item = SourceItem(key, None, given[index])
            elif option == "path":
                item = self.path_item(key, given[index], row, strict)
            else:
                item = SourceItem(key, None, orjson.dumps(given[index], option=orjson.OPT_SORT_KEYS))
            yield item._replace(meta={m: values[index] for m, values in metas}) if metas else item

    def _keys(self, batch: Any) -> tuple[list[Any], dict[int, str]]:
        """A batch's keys as text, and the rows (by index) that cannot be items, with why. The column checks
        find the batches that need a closer look; key_problem decides."""
        pa, pc = self.pa, self.pc
        keys = batch.column(self.columns.key)
        if not pa.types.is_string(keys.type):
            keys = pc.cast(keys, pa.string())
        source = batch.column(self.columns.source[1])
        suspect = bool(keys.null_count or source.null_count)
        if not suspect and len(keys):
            lengths = pc.utf8_length(keys)
            suspect = (pc.min(lengths).as_py() == 0 or pc.max(lengths).as_py() > MAX_KEY_CHARS
                       or pc.any(pc.match_substring_regex(keys, _SUSPECT_KEY)).as_py())
        listed = keys.to_pylist()
        if not suspect:
            return listed, {}
        nulls = source.is_null().to_pylist()
        problems = {index: why for index, key in enumerate(listed)
                    if (why := _row_problem(key, nulls[index], self.columns)) is not None}
        return listed, problems


def _key_type(pa: Any, kind: Any) -> bool:
    return bool(_string_type(pa, kind) or pa.types.is_integer(kind))


def _string_type(pa: Any, kind: Any) -> bool:
    if pa.types.is_dictionary(kind):
        return _string_type(pa, kind.value_type)
    return bool(pa.types.is_null(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_string_view(kind))


def _text_type(pa: Any, kind: Any) -> bool:
    return bool(_string_type(pa, kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_binary_view(kind) or pa.types.is_fixed_size_binary(kind))


def _json_type(pa: Any, kind: Any) -> bool:
    """Whether every value of the type has a JSON form (timestamps and dates as RFC 3339 text)."""
    t = pa.types
    if t.is_dictionary(kind):
        return _json_type(pa, kind.value_type)
    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind) or t.is_list_view(kind) \
            or t.is_large_list_view(kind):
        return _json_type(pa, kind.value_type)
    if t.is_struct(kind):
        return all(_json_type(pa, kind.field(i).type) for i in range(kind.num_fields))
    if t.is_map(kind):
        return _json_type(pa, kind.key_type) and _json_type(pa, kind.item_type)
    return bool(_string_type(pa, kind) or t.is_boolean(kind) or t.is_integer(kind) or t.is_floating(kind)
                or t.is_timestamp(kind) or t.is_date(kind) or t.is_time(kind))


def _as_bytes(pa: Any, pc: Any, column: Any) -> Any:
    """A text column as binary (the same buffers: its values' UTF-8 bytes, no copy)."""
    kind = column.type
    if pa.types.is_dictionary(kind) or pa.types.is_string_view(kind):
        column = pc.cast(column, pa.string())
        kind = column.type
    if pa.types.is_string(kind) or pa.types.is_null(kind):
        return column.cast(pa.binary())
    if pa.types.is_large_string(kind):
        return column.cast(pa.large_binary())
    return column


def _json_values(pa: Any, column: Any) -> list[Any]:
    """A column's values as the JSON values meta holds (timestamps and dates as RFC 3339 text)."""
    values: list[Any] = column.to_pylist()
    kind = column.type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if _string_type(pa, kind) or pa.types.is_boolean(kind) or pa.types.is_integer(kind) \
            or pa.types.is_floating(kind):
        return values
    return [None if v is None else orjson.loads(orjson.dumps(v)) for v in values]


# --- JSONL -------------------------------------------------------------------------------------------

class _JsonLines(_Table):
    """A table of JSON objects, one per line; the first object stands for a header (it must hold every column
    named), later rows may leave out a meta column (null)."""

    unit = "line"

    def __init__(self, path: Path, columns: TableColumns) -> None:
        super().__init__(str(path), printable_name(os.fsencode(path.name)), path.parent, columns)
        self.path = path

    def rows(self, skip_bad_lines: bool) -> Iterator[tuple[int, dict[str, Any] | None, SourceItem | None]]:
        """(line, row, None) of each usable line, (line, None, its bad_input item) of a bad one."""
        headed = False
        for number, raw in _lines(self.path):
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield number, None, self.bad(number, f"not valid JSON ({exc}); each line must be a JSON object",
                                             skip_bad_lines)
                continue
            if type(row) is not dict:
                yield number, None, self.bad(number, "not a JSON object", skip_bad_lines)
                continue
            if not headed:
                headed = True
                for name in self.columns.names:
                    if name not in row:
                        raise self.missing(name, list(row))
            why = self._problem(row)
            yield (number, None, self.bad(number, why, skip_bad_lines)) if why else (number, row, None)

    def _problem(self, row: dict[str, Any]) -> str | None:
        columns = self.columns
        key, (option, name) = row.get(columns.key), columns.source
        if columns.key not in row or name not in row:
            missing = columns.key if columns.key not in row else name
            return f"no {missing!r} ({columns.option_of(missing)}); every row needs one"
        if key is not None and type(key) is not str:
            if type(key) is not int:
                return f"{columns.key!r} (--key) is {_json_kind(key)}; keys must be strings or integers"
            key = str(key)
        source = row[name]
        if source is not None and option in ("text", "path") and type(source) is not str:
            return f"{name!r} (--{option}) is {_json_kind(source)}; --{option} takes a string (--value takes any)"
        return _row_problem(key, source is None, columns)

    def keys(self, skip_bad_lines: bool) -> Iterator[tuple[int, str]]:
        key_column = self.columns.key
        for number, row, bad in self.rows(skip_bad_lines):
            if row is not None:
                yield number, str(row[key_column])
            elif bad is not None:
                yield number, bad.key

    def items(self, skip_bad_lines: bool, strict: bool) -> Iterator[SourceItem]:
        option, name = self.columns.source
        key_column, meta = self.columns.key, self.columns.meta
        for number, row, bad in self.rows(skip_bad_lines):
            if row is None:
                assert bad is not None
                yield bad
                continue
            key = str(row[key_column])
            if option == "text":
                item = SourceItem(key, None, row[name].encode())
            elif option == "path":
                item = self.path_item(key, row[name], number, strict)
            else:
                item = SourceItem(key, None, orjson.dumps(row[name], option=orjson.OPT_SORT_KEYS))
            yield item._replace(meta={m: row.get(m) for m in meta}) if meta else item


def _json_kind(value: Any) -> str:
    kinds = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}
    return kinds.get(type(value), "a value")


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
