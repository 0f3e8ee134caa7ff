"""The publication target's search by meaning: the live versions nearest a query vector, by cosine similarity.

A version may hold several vectors (a document's chunks); it scores by its best one. Only vectors of the query's
dimension take part. Two ways, chosen per store:

SQLite with sqlite-vec (store/sqlitevec.py): one ``vec0`` table per dimension, ``publication_vec_<dim>``, holding
the vectors of live versions only, partitioned by collection, made by the first search at that dimension
(from the live vectors) and from then on kept in step by every publication and rollback, in the transaction
that changes what is live, as the full-text index is. Its row id is ``publication_id * 65536 + n`` (the first
65,536 vectors of a version are indexed). A process without sqlite-vec that changes what is live marks the
tables stale (``publication_vector_indexes``), and the next search makes them again. sqlite-vec compares every
vector of the collection (in C): the ranking is exact.

Elsewhere (PostgreSQL; SQLite without sqlite-vec): an exact scan. The collection's live vectors are read in
batches of SCAN_BATCH and scored in Python (no numpy), so a query costs time in proportion to the collection's
vectors (bench/search.py measures it). pgvector is not used yet, even where the server offers it.
"""

from __future__ import annotations

import heapq
import math
import operator
import sys
from array import array
from collections.abc import Sequence
from typing import Protocol

from conveyor.store.dialect import Dialect
from conveyor.store.sqlitevec import available

SLOTS = 65536  # row ids per version in a vec0 table: publication_id * SLOTS + n
MAX_K = 4096  # the most neighbours sqlite-vec returns for one query
SCAN_BATCH = 2000  # live versions per read of the exact scan
IN_CHUNK = 900  # ids per IN list (under SQLite's limit of bound parameters)

Scored = list[tuple[int, float]]  # (publication id, cosine similarity), best first


class VectorIndex(Protocol):
    name: str

    def changed(self, db: Dialect, removed: Sequence[int], added: Sequence[int]) -> None:
        """Publications ``removed`` are no longer live and ``added`` now are (their vectors written): inside the
        transaction that made it so."""
        ...

    def nearest(self, db: Dialect, collection: str, query: Sequence[float], limit: int,
                prefix: str | None) -> Scored:
        """The ``limit`` live versions of ``collection`` nearest ``query`` (with item keys that start with ``prefix``,
        when given)."""
        ...


class ExactScan:
    """Every live vector of the collection, read in batches and scored here."""

    name = "exact-scan"

    def changed(self, db: Dialect, removed: Sequence[int], added: Sequence[int]) -> None:
        """Nothing to keep: the scan reads the vectors themselves."""

    def nearest(self, db: Dialect, collection: str, query: Sequence[float], limit: int,
                prefix: str | None) -> Scored:
        unit = _unit(query)
        best: dict[int, float] = {}
        where, params = ("AND substr(item_key, 1, ?) = ?", [len(prefix), prefix]) if prefix else ("", [])
        after = 0
        while True:  # SCAN_BATCH live versions at a time, in id order, then their vectors by an id range
            ids = db.execute(f"SELECT id FROM publications WHERE live = 1 AND collection = ? AND id > ? {where} "
                             "ORDER BY id LIMIT ?", [collection, after, *params, SCAN_BATCH])
            if not ids:
                break
            first, after = int(ids[0][0]), int(ids[-1][0])
            for pid, blob in db.execute(
                    "SELECT v.publication_id, v.vector FROM publication_vectors v JOIN publications p "
                    "ON p.id = v.publication_id WHERE v.publication_id >= ? AND v.publication_id <= ? AND v.dim = ? "
                    f"AND p.live = 1 AND p.collection = ? {where.replace('item_key', 'p.item_key')}",
                    [first, after, len(unit), collection, *params]):
                score = _cosine(unit, _floats(blob))
                if score > best.get(pid, -2.0):
                    best[pid] = score
        return heapq.nlargest(limit, best.items(), key=lambda hit: (hit[1], -hit[0]))


class SqliteVec:
    """vec0 tables of the live vectors, one per dimension (see the module's docstring)."""

    name = "sqlite-vec"

    def changed(self, db: Dialect, removed: Sequence[int], added: Sequence[int]) -> None:
        indexes = db.execute("SELECT dim, stale FROM publication_vector_indexes")
        if not indexes or not (removed or added):
            return
        if not available():  # this process cannot write them: the next search makes them again
            db.execute("UPDATE publication_vector_indexes SET stale = 1")
            return
        for dim, stale in indexes:
            if not stale:
                self._remove(db, int(dim), removed)
                self._add(db, int(dim), added)

    def nearest(self, db: Dialect, collection: str, query: Sequence[float], limit: int,
                prefix: str | None) -> Scored:
        dim = len(query)
        self._ready(db, dim)
        probe, fetch = _pack(_unit(query)), min(MAX_K, max(limit * 4, 40))
        while True:
            rows = db.execute(f"SELECT rowid, distance FROM {_table(dim)} WHERE embedding MATCH ? AND k = ? "
                              "AND collection = ? ORDER BY distance", [probe, fetch, collection])
            best = _best_chunks(rows)
            if prefix is not None:
                best = _within(db, best, prefix)
            if len(best) >= limit or len(rows) < fetch:
                return best[:limit]
            if fetch >= MAX_K:  # past what one query returns: the few that match the keys, scanned
                return ExactScan().nearest(db, collection, query, limit, prefix)
            fetch = min(MAX_K, fetch * 4)

    def _ready(self, db: Dialect, dim: int) -> None:
        """Make the table for ``dim`` from the live vectors when there is none, or it is stale."""
        made = "SELECT COUNT(*) FROM publication_vector_indexes WHERE dim = ? AND stale = 0"
        if db.execute(made, [dim])[0][0]:
            return
        with db.transaction():
            if db.execute(made, [dim])[0][0]:  # another search made it while this one waited to write
                return
            db.execute(f"DROP TABLE IF EXISTS {_table(dim)}")
            db.execute(f"CREATE VIRTUAL TABLE {_table(dim)} USING vec0(collection TEXT PARTITION KEY, "
                       f"embedding FLOAT[{dim}] distance_metric=cosine)")
            db.execute(f"INSERT INTO {_table(dim)} (rowid, collection, embedding) "
                       f"SELECT v.publication_id * {SLOTS} + v.n, p.collection, v.vector FROM publication_vectors v "
                       f"JOIN publications p ON p.id = v.publication_id WHERE p.live = 1 AND v.dim = ? "
                       f"AND v.n < {SLOTS}", [dim])
            db.execute("DELETE FROM publication_vector_indexes WHERE dim = ?", [dim])
            db.execute("INSERT INTO publication_vector_indexes (dim, stale) VALUES (?, 0)", [dim])

    @staticmethod
    def _remove(db: Dialect, dim: int, ids: Sequence[int]) -> None:
        rows: list[tuple[int]] = []
        for start in range(0, len(ids), IN_CHUNK):
            chunk = list(ids[start:start + IN_CHUNK])
            rows += [(int(pid) * SLOTS + int(n),) for pid, n in db.execute(
                f"SELECT publication_id, n FROM publication_vectors WHERE publication_id IN ({_marks(chunk)}) "
                f"AND dim = ? AND n < {SLOTS}", [*chunk, dim])]
        db.executemany(f"DELETE FROM {_table(dim)} WHERE rowid = ?", rows)

    @staticmethod
    def _add(db: Dialect, dim: int, ids: Sequence[int]) -> None:
        db.executemany(f"INSERT INTO {_table(dim)} (rowid, collection, embedding) "
                       f"SELECT v.publication_id * {SLOTS} + v.n, p.collection, v.vector FROM publication_vectors v "
                       f"JOIN publications p ON p.id = v.publication_id WHERE v.publication_id = ? AND v.dim = ? "
                       f"AND v.n < {SLOTS}", [(pid, dim) for pid in ids])


def vector_index(db: Dialect) -> VectorIndex:
    """The store's way: sqlite-vec where this process has it on SQLite, otherwise the exact scan. Publishers on
    SQLite always go through SqliteVec, which keeps the tables that exist in step (or marks them stale)."""
    if db.name == "sqlite" and available():
        return SqliteVec()
    return ExactScan()


def maintained(db: Dialect) -> VectorIndex:
    """What publication and rollback tell about changes: the vec0 tables on SQLite (whether this process can
    write them or not), nothing on PostgreSQL."""
    return SqliteVec() if db.name == "sqlite" else ExactScan()


def _best_chunks(rows: Sequence[tuple[int, float]]) -> Scored:
    """(row id, cosine distance) nearest first -> each version once, at its best chunk, best first."""
    best: dict[int, float] = {}
    for rowid, distance in rows:
        best.setdefault(int(rowid) // SLOTS, 1.0 - float(distance))
    return list(best.items())


def _within(db: Dialect, scored: Scored, prefix: str) -> Scored:
    if not scored:
        return scored
    ids = [pid for pid, _ in scored]
    inside = {int(r[0]) for r in db.execute(
        f"SELECT id FROM publications WHERE id IN ({_marks(ids)}) AND substr(item_key, 1, ?) = ?",
        [*ids, len(prefix), prefix])}
    return [hit for hit in scored if hit[0] in inside]


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))


def _table(dim: int) -> str:
    return f"publication_vec_{int(dim)}"


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(_dot(vector, vector))
    return [x / norm for x in vector] if norm else [float(x) for x in vector]


def _cosine(unit: Sequence[float], vector: Sequence[float]) -> float:
    """cos(unit, vector) for a unit vector ``unit``, from two loops in C (math.dist, math.hypot) instead of
    one in Python: |v - u|² = |v|² + 1 - 2 u·v."""
    norm = math.hypot(*vector)
    if not norm:
        return 0.0
    return (norm * norm + 1.0 - math.dist(vector, unit) ** 2) / (2.0 * norm)


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(map(operator.mul, a, b)))


def _floats(blob: bytes | memoryview) -> Sequence[float]:
    """A stored vector (little-endian float32) as floats, without a copy where the machine is little-endian."""
    if sys.byteorder == "little":
        return memoryview(blob).cast("f")
    values = array("f")
    values.frombytes(bytes(blob))
    values.byteswap()
    return values


def _pack(vector: Sequence[float]) -> bytes:
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()
