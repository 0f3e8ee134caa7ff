"""Many rows in one PostgreSQL statement: a one-row ``INSERT ... VALUES (?, ...)`` or ``UPDATE ... SET c = ?
WHERE k = ?`` fed by ``COPY``.

psycopg's ``executemany`` pipelines one Bind/Execute per row: the server runs the statement once per row and
the client builds a message per row. Instead the rows are copied (psycopg's COPY writes a row in C) into a
temporary table of the statement's bound columns, and one ``INSERT ... SELECT`` moves them, its conflict clause
unchanged: 20,000 new task rows in 0.84 s instead of 1.74 s (arrays through ``unnest`` took 1.29 s: psycopg
builds an array parameter element by element in Python).

A batch of new rows that meets no row already there (a new run's items and tasks, a commit's next tasks and
outputs) skips the temporary table: it is copied straight into its table inside a savepoint (``direct``), and
only when that meets a unique key (a resumed submission, a memo race) is it rolled back to the savepoint and
moved as above, its conflict clause deciding. `conveyor submit` of 100,000 items went from 3.4 to 2.1 s, two
workers through 20,000 items x 3 no-op stages from 3.2 to 2.8 s.

The temporary table lives as long as the connection (``ON COMMIT DELETE ROWS``: no catalog rows are written
per batch, which matters on a server that never vacuums); the statement that reads it also empties it.

One difference from the row-at-a-time form, which the caller settles: a later row of the batch meeting an
earlier one under ``ON CONFLICT DO UPDATE`` is refused by one statement ("cannot affect row a second time").
``first_per_key`` keeps the first row of each key, which is what the row-at-a-time form did for conveyor's
statements (an insert that meets its own batch's row does nothing: that row is not superseded).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, NamedTuple

_INSERT = re.compile(r"^\s*INSERT INTO (\w+) \(([^()]*)\)\s*VALUES\s*\(([^()]*)\)\s*(.*)$", re.DOTALL)
_UPDATE = re.compile(r"^\s*UPDATE (\w+) SET ([^()]*?)\s+WHERE ([^()]*?)\s*$", re.DOTALL)
_BOUND = re.compile(r"^(\w+)\s*=\s*\?$")
_CONSTANT = re.compile(r"^(\w+)\s*=\s*('[^']*')$")
_LITERAL = re.compile(r"^(?:'([^']*)'|(-?\d+)|(NULL))$")


class CopiedRows(NamedTuple):
    """A one-row statement fed from a temporary table: create it once per connection (``create``), ``COPY`` the
    rows into ``staging`` (``bound`` columns, in the order of the statement's ?), then run ``move``."""

    staging: str
    bound: tuple[str, ...]
    create: str
    move: str
    match: tuple[int, ...] = ()  # an update's: the positions in a row of the values its WHERE matches
    direct: str | None = None  # an insert's COPY straight into its table: bound columns, then the constant ones
    constants: tuple[Any, ...] = ()  # the values of those constant columns, appended to every copied row
    update: str = ""  # an update's statement over the staged rows (v), the move's second half
    fixed: str = ""  # ... and the constants of its WHERE as columns of v (", CAST('running' AS TEXT) AS is_status")


def _staging(sql: str, table: str, columns: str) -> tuple[str, str]:
    """The temporary table of ``sql`` (named after it) and the statement that makes it with ``columns``."""
    staging = f"conveyor_rows_{table}_{hashlib.sha256(sql.encode()).hexdigest()[:10]}"
    return staging, (f"CREATE TEMPORARY TABLE IF NOT EXISTS {staging} ON COMMIT DELETE ROWS AS "
                     f"SELECT {columns} FROM {table} WITH NO DATA")


def copied_insert(sql: str) -> CopiedRows | None:
    """``sql`` (``INSERT INTO t (c, ...) VALUES (?, 'literal', ...) [ON CONFLICT ...]``) fed by COPY; None when
    it is not of that shape."""
    match = _INSERT.match(sql)
    if match is None:
        return None
    table, columns_sql, values_sql, tail = match.groups()
    columns = [c.strip() for c in columns_sql.split(",")]
    values = [v.strip() for v in values_sql.split(",")]
    if len(columns) != len(values) or "?" in tail or any("?" in v and v != "?" for v in values):
        return None
    bound = tuple(c for c, v in zip(columns, values, strict=True) if v == "?")
    staging, create = _staging(sql, table, ", ".join(bound))
    select = ", ".join(f"v.{c}" if v == "?" else v for c, v in zip(columns, values, strict=True))
    move = (f"WITH v AS (DELETE FROM {staging} RETURNING *) "
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM v {tail}")
    fixed = {c: _literal(v) for c, v in zip(columns, values, strict=True) if v != "?"}
    direct = None
    if None not in fixed.values() and (not tail or tail.lstrip().startswith("ON CONFLICT")):
        direct = f"COPY {table} ({', '.join((*bound, *fixed))}) FROM STDIN"
    constants = tuple(value[0] for value in fixed.values() if value is not None)
    return CopiedRows(staging, bound, create, move, direct=direct, constants=constants)


def _literal(sql: str) -> tuple[Any] | None:
    """A constant of an INSERT's VALUES as (its Python value,), or None when it is not a plain literal."""
    match = _LITERAL.match(sql)
    if match is None:
        return None
    text, number, _null = match.groups()
    return (text,) if text is not None else (int(number),) if number is not None else (None,)


def copied_update(sql: str) -> CopiedRows | None:
    """``sql`` (``UPDATE t SET c = ?, d = 'literal', ... WHERE k = ? AND e = 'literal' ...``, every ? alone on
    the right of its column's ``=``) fed by COPY; None when it is not of that shape. Staging columns are named
    ``set_c`` and ``key_k`` (a column may be both set and matched)."""
    match = _UPDATE.match(sql)
    if match is None:
        return None
    table, sets_sql, where_sql = match.groups()
    sets = [a.strip() for a in sets_sql.split(",")]
    where = [c.strip() for c in where_sql.split(" AND ")]
    if any("?" in part and not _BOUND.match(part) for part in (*sets, *where)):
        return None
    bound_set = [m.group(1) for m in map(_BOUND.match, sets) if m]
    bound_key = [m.group(1) for m in map(_BOUND.match, where) if m]
    if not bound_key:
        return None
    names = tuple([f"set_{c}" for c in bound_set] + [f"key_{c}" for c in bound_key])
    staging, create = _staging(sql, table, ", ".join(
        [f"{c} AS set_{c}" for c in bound_set] + [f"{c} AS key_{c}" for c in bound_key]))
    assign = ", ".join(f"{m.group(1)} = v.set_{m.group(1)}" if (m := _BOUND.match(a)) else a for a in sets)
    # Every condition is a join condition: a constant one (status = 'running') comes through v too. Left as a
    # filter on the table, a stale statistic could make the planner think almost no row passes it and scan the
    # whole table once per batch instead of looking each row up by its key (tests/test_plans.py).
    constants = [m.groups() for m in map(_CONSTANT.match, where) if m]
    if len(constants) + len(bound_key) != len(where):
        return None
    match_on = " AND ".join([f"{table}.{c} = v.key_{c}" for c in bound_key]
                            + [f"{table}.{c} = v.is_{c}" for c, _ in constants])
    # Matched by id (every fenced update of a task), the rows are also named as one array of ids: the planner then
    # reads just them through the primary key (a bitmap scan in id order) and joins the few rows it found. Left to
    # the join alone, it weighed the staged rows (no statistics: 700 estimated) against the whole table and chose
    # a hash join over every row of a table under a few hundred thousand rows: half the success updates of two
    # workers through 20,000 items read all of ``tasks``, 44 against 25 ms a batch (bench/RESULTS.md, issue 32).
    if "id" in bound_key:
        match_on += f" AND {table}.id = ANY(ARRAY(SELECT key_id FROM v))"
    fixed = "".join(f", CAST({value} AS TEXT) AS is_{c}" for c, value in constants)
    update = f"UPDATE {table} SET {assign} FROM v WHERE {match_on}"
    move = f"WITH v AS (DELETE FROM {staging} RETURNING *{fixed}) {update}"
    return CopiedRows(staging, names, create, move, tuple(range(len(bound_set), len(names))), update=update,
                      fixed=fixed)


def json_update(plan: CopiedRows, types: dict[str, str]) -> tuple[str, tuple[int, ...]] | None:
    """An update's ``plan`` (``copied_update``) as one statement over a JSON array of its rows (one parameter), and
    the positions in a row of the values that are floats; None when a bound column is neither text nor a number
    (``types``: the table's column types, as PostgreSQL names them).

    The rows travel in the statement: no temporary table to fill by COPY (two round trips) and empty by the move,
    and the client writes them with one ``orjson.dumps``: 500 successes in 19.5 against 23.9 ms, the client's CPU
    1.2 against 2.3 us a row, the server's no more. ``jsonb``: each ``->>`` of a ``json`` value parses its text
    again (the server's time a row went up by half). A float that is not finite has no JSON spelling (orjson
    writes null): the caller sends such a batch by COPY."""
    kinds = [types.get(name.split("_", 1)[1], "") for name in plan.bound]
    if not plan.update or not all(k in _JSON_TYPES for k in kinds):
        return None
    columns = ", ".join(f"CAST(r->>{i} AS {kind}) AS {name}"
                        for i, (name, kind) in enumerate(zip(plan.bound, kinds, strict=True)))
    move = (f"WITH v AS MATERIALIZED (SELECT {columns}{plan.fixed} FROM jsonb_array_elements(CAST(? AS jsonb)) AS r) "
            f"{plan.update}")
    return move, tuple(i for i, k in enumerate(kinds) if k in ("double precision", "real"))


# Column types a JSON value is read back into exactly (text as given; numbers by their decimal spelling, a float's
# being the shortest that reads back to it).
_JSON_TYPES = frozenset(("text", "integer", "bigint", "smallint", "double precision", "real"))


def first_per_key(rows: Sequence[Sequence[Any]], key: Sequence[int]) -> Sequence[Sequence[Any]]:
    """The first row of each key (the values at positions ``key``), in order."""
    keys = list(map(itemgetter(*key), rows))
    if len(set(keys)) == len(rows):
        return rows  # the usual case, found at C speed
    seen: set[Any] = set()
    kept = []
    for k, row in zip(keys, rows, strict=True):
        if k not in seen:
            seen.add(k)
            kept.append(row)
    return kept
