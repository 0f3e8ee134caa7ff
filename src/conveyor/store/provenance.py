"""Provenance as indexed rows: what made each task's output, one row per (task, name, value).

A task's own columns say its stage version and config hash, its item the source digest. These rows add
what only the run knows: the model a stage asked for and the revision the provider reported, the prompt
version, and any version the stage declares (``provenance={"parser": "1.24.9"}``) or sets while it runs
(``ctx.provenance["parser"] = ...``). ``sort_key`` orders values as versions do, so a comparison such as
``parser < 1.24.10`` is a range over an index, and 1.24.10 sorts after 1.24.9 (text order says otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.records import CHILD_MARK, CHILD_RANGE_END
from conveyor.store.tasks import INSERT_PROVENANCE, chunks

_RUNS = re.compile(r"[0-9]+|[^0-9]+")
# A number's digits are written after their count, so that a longer number sorts after a shorter one; the
# count is two digits (numbers up to 99 digits long), marked so that a number sorts before any text.
_NUMBER_MARK = "\x01"


def sort_key(value: str) -> str:
    """``value`` written so that comparing the results as text compares the values as versions: runs of
    digits by their number (``9 < 10``, leading zeros ignored), other runs by their characters, and a value
    before any value it is the start of (``1.24 < 1.24.1``)::

        sort_key("1.24.9") < sort_key("1.24.10")   # True
    """
    parts = []
    for run in _RUNS.findall(value):
        if run[0] in "0123456789":
            digits = run.lstrip("0") or "0"
            parts.append(f"{_NUMBER_MARK}{min(len(digits), 99):02d}{digits}")
        else:
            parts.append(run)
    return "".join(parts)


class ProvenanceRow(NamedTuple):
    run_id: str
    root_key: str
    item_key: str
    stage: str
    name: str
    value: str
    sort_key: str


def rows_for(run_id: str, root_key: str, item_key: str, stage: str,
             document: dict[str, list[str]]) -> list[ProvenanceRow]:
    """The rows of one task's provenance ``document`` (name -> values)."""
    return [ProvenanceRow(run_id, root_key, item_key, stage, name, value, sort_key(value))
            for name, values in document.items() for value in values]


class ProvenanceQueries:
    db: Dialect

    def insert_provenance(self, rows: Sequence[ProvenanceRow]) -> None:
        if rows:
            self.db.executemany(INSERT_PROVENANCE, rows)

    def forget_provenance(self, tasks: Sequence[tuple[str, str, str, str]]) -> None:
        """Drop the rows of tasks (run, root key, item key, stage) that run again: they get new ones."""
        if tasks:
            self.db.executemany("DELETE FROM provenance WHERE run_id = ? AND root_key = ? AND item_key = ? "
                                "AND stage = ?", tasks)

    def copy_provenance(self, base: str, run_id: str, roots: Sequence[str]) -> None:
        """The rows of ``roots``' tasks in ``base``, for the same tasks copied into ``run_id``."""
        for part in chunks(list(roots), 900):
            marks = ",".join("?" * len(part))
            self.db.execute(
                "INSERT INTO provenance (run_id, root_key, item_key, stage, name, value, sort_key) "
                f"SELECT ?, root_key, item_key, stage, name, value, sort_key FROM provenance WHERE run_id = ? "
                f"AND root_key IN ({marks}) ON CONFLICT (run_id, root_key, item_key, stage, name, value) DO NOTHING",
                [run_id, base, *part])

    def has_provenance(self, run_id: str) -> bool:
        return bool(self.db.execute("SELECT 1 FROM provenance WHERE run_id = ? LIMIT 1", (run_id,)))

    def provenance_of(self, tasks: Iterable[tuple[str, str, str, str]]) -> dict[tuple[str, str, str], dict[str,
                                                                                                           list[str]]]:
        """The rows of these tasks (run, root key, item key, stage), by (run, item key, stage): name -> values.
        Read a few hundred root items at a time."""
        found: dict[tuple[str, str, str], dict[str, list[str]]] = {}
        wanted: dict[str, set[tuple[str, str, str]]] = {}
        for run_id, root_key, item_key, stage in tasks:
            wanted.setdefault(run_id, set()).add((root_key, item_key, stage))
        for run_id, keys in wanted.items():
            for part in chunks(sorted({root for root, _, _ in keys}), 500):
                for root_key, item_key, stage, name, value in self.db.execute(
                        "SELECT root_key, item_key, stage, name, value FROM provenance WHERE run_id = ? AND root_key "
                        f"IN ({','.join('?' * len(part))}) ORDER BY root_key, item_key, stage, name, sort_key",
                        (run_id, *part)):
                    if (root_key, item_key, stage) in keys:
                        found.setdefault((run_id, str(item_key), str(stage)), {}).setdefault(str(name), []).append(
                            str(value))
        return found

    def provenance_names(self, run_ids: Sequence[str]) -> list[str]:
        """The names recorded for these runs' tasks (what ``--where`` can compare)."""
        names: set[str] = set()
        for run_id in run_ids:
            names.update(str(r[0]) for r in self.db.execute(
                "SELECT DISTINCT name FROM provenance WHERE run_id = ?", (run_id,)))
        return sorted(names)


def descendants_range(item_key: str) -> tuple[str, str]:
    """The item keys of ``item_key``'s fan-out descendants lie strictly between these two."""
    return item_key + CHILD_MARK, item_key + CHILD_RANGE_END
