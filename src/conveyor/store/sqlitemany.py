"""Many rows in one SQLite statement, so that sqlite3 binds and steps one statement for many rows:

- a one-row ``INSERT ... VALUES (?, ...) [tail]`` as ``INSERT ... VALUES (?, ...), (?, ...), ... [tail]``;
- a one-row ``UPDATE t SET c = ?, d = NULL ... WHERE k = ? AND e = 'x' ...`` (every ? alone on the right of its
  column's ``=``) as ``UPDATE t SET c = v.column1, ... FROM (VALUES (?, ...), ...) AS v WHERE t.k = v.column2
  ...``: each row of ``v`` finds its row of ``t`` by the key (a task's id: its primary key).

sqlite3's ``executemany`` steps the one-row statement once per row, with a reset and a fresh binding each time. In
statements of 64 rows a commit's new tasks took 2.5 against 3.0 us a row, its successes 2.5 against 3.1
(bench/RESULTS.md, issue 32 point 2 on SQLite). SQLite inserts the rows of a ``VALUES`` list one after the other,
each meeting the rows before it as a row at a time would (its conflict clause deciding), so the rows changed are
what ``executemany`` counts. An update's rows must name distinct rows (a row named twice would be changed once);
a batch that does not goes row by row. A batch goes in statements of ``ROWS`` rows and the rest in statements of
32, 16, ... 1 rows: a few statement texts per statement, each compiled once and kept in sqlite3's cache.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

ROWS = 64  # rows per statement (16: 2.9 us a row, 64: 2.5, 256: 2.8, in bench/fleetprofile.py's insert)
_INSERT = re.compile(r"^(\s*INSERT INTO \w+ \([^()]*\)\s*VALUES\s*)(\([^()]*\))(.*)$", re.DOTALL)
_UPDATE = re.compile(r"^\s*UPDATE (\w+) SET ([^()]*?)\s+WHERE ([^()]*?)\s*$", re.DOTALL)
_BOUND = re.compile(r"^(\w+)\s*=\s*\?$")
Shape = tuple[str, str, str, int, tuple[int, ...]]  # before the rows, one row, after them, its ?, an update's keys


class ManyRows:
    """The many-row forms of one connection's insert statements, made once per statement and size."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.max_params = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self._shapes: dict[str, Shape | None] = {}
        self._texts: dict[tuple[str, int], str] = {}

    def run(self, sql: str, rows: Sequence[Sequence[Any]]) -> int | None:
        """``rows`` of ``sql`` in many-row statements: the rows changed; None (nothing run) when ``sql`` is of
        neither shape, or an update's rows name a row twice."""
        if sql not in self._shapes:
            self._shapes[sql] = _insert_shape(sql) or _update_shape(sql)
        shape = self._shapes[sql]
        if shape is None:
            return None
        head, one, tail, marks, keys = shape
        if keys and len(set(map(itemgetter(*keys), rows))) < len(rows):
            return None
        per = max(1, min(ROWS, self.max_params // max(1, marks)))
        changed, start, execute = 0, 0, self.conn.execute
        while start < len(rows):
            left = len(rows) - start
            size = per if left >= per else 1 << (left.bit_length() - 1)
            text = self._texts.get((sql, size))
            if text is None:
                text = self._texts[sql, size] = f"{head}{', '.join([one] * size)}{tail}"
            changed += execute(text, list(chain.from_iterable(rows[start:start + size]))).rowcount
            start += size
        return changed


def _insert_shape(sql: str) -> Shape | None:
    match = _INSERT.match(sql)
    if match is None or "?" in match.group(3) or "RETURNING" in match.group(3).upper():
        return None
    head, one, tail = match.groups()
    return head, one, tail, one.count("?"), ()


def _update_shape(sql: str) -> Shape | None:
    match = _UPDATE.match(sql)
    if match is None:
        return None
    table, sets_sql, where_sql = match.groups()
    sets, where = [a.strip() for a in sets_sql.split(",")], [c.strip() for c in where_sql.split(" AND ")]
    if any("?" in part and not _BOUND.match(part) for part in (*sets, *where)):
        return None
    column = 0

    def bound(part: str, qualify: str) -> str:
        nonlocal column
        found = _BOUND.match(part)
        if found is None:
            return part
        column += 1
        return f"{qualify}{found.group(1)} = v.column{column}"

    assign = ", ".join(bound(part, "") for part in sets)
    first_key = column
    match_on = " AND ".join(bound(part, f"{table}.") for part in where)
    if column == first_key:
        return None  # no key: not one row per row given
    return (f"UPDATE {table} SET {assign} FROM (VALUES ", f"({', '.join('?' * column)})",
            f") AS v WHERE {match_on}", column, tuple(range(first_key, column)))
