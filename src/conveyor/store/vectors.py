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

sqlite-vec's scan reads every vector of the table, so a connection that searches by meaning maps the database
file into memory (``PRAGMA mmap_size``) from its first such search on: the pages are read in place instead of
copied through SQLite's page cache, which halves the query's CPU time (bench/search.py). The mapped pages are the
operating system's file cache, which it can drop at will, not the process's heap; the store's other connections
(workers, exports) keep their bounded page cache and no mapping.

PostgreSQL with pgvector (``CREATE EXTENSION vector`` in the store's database; store/vectors.py asks
``pg_extension`` on each search): one table per dimension, ``publication_pgvec_<dim>``, holding the vectors of
live versions only, made by the first search at that dimension and kept in step by every publication and
rollback in their transactions, as on SQLite. pgvector compares every vector of the collection (in C, ``<=>``):
the ranking is exact. The first search makes the table while holding ``publications`` in SHARE mode, so a
publication under way finishes first and the next one waits for it: none is left out. ``CONVEYOR_PGVECTOR=0``
says not to search with it (the tables that exist are still kept in step).

Elsewhere (PostgreSQL without pgvector; SQLite without sqlite-vec): an exact scan. The collection's live vectors
are read in batches of SCAN_BATCH and scored here (with numpy where it is installed, in pure Python otherwise),
so a query costs time in proportion to the collection's vectors (bench/search.py measures it).
"""

from __future__ import annotations

import heapq
import math
import operator
import os
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from conveyor.store.dialect import Dialect, PostgresDialect
from conveyor.store.sqlitevec import available

SLOTS = 65536  # row ids per version in a vec0 table: publication_id * SLOTS + n
MAX_K = 4096  # the most neighbours sqlite-vec returns for one query
SCAN_BATCH = 2000  # live versions per read of the exact scan
IN_CHUNK = 900  # ids per IN list (under SQLite's limit of bound parameters)
FILL_BATCH = 2000  # vectors per statement when a pgvector table is made
MMAP_BYTES = 1 << 40  # the most of the database file a sqlite-vec query maps (all of it, in practice)
ENV_PGVECTOR = "CONVEYOR_PGVECTOR"

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
        db.refresh_statistics(["publications", "publication_vectors"])  # a fresh store's plans scan otherwise
        best: dict[int, float] = {}
        where, params = ("AND substr(item_key, 1, ?) = ?", [len(prefix), prefix]) if prefix else ("", [])
        after = 0
        while True:  # SCAN_BATCH live versions at a time, in id order, then their vectors by an id range
            ids = db.execute(f"SELECT id FROM publications WHERE live = 1 AND collection = ? AND id > ? {where} "
                             "ORDER BY id LIMIT ?", [collection, after, *params, SCAN_BATCH])
            if not ids:
                break
            first, after = int(ids[0][0]), int(ids[-1][0])
            rows = db.execute_binary(
                "SELECT v.publication_id, v.vector FROM publication_vectors v JOIN publications p "
                "ON p.id = v.publication_id WHERE v.publication_id >= ? AND v.publication_id <= ? AND v.dim = ? "
                "AND p.id >= ? AND p.id <= ? AND p.live = 1 AND p.collection = ? "
                f"{where.replace('item_key', 'p.item_key')}",
                [first, after, len(unit), first, after, collection, *params])
            for pid, score in _scores(unit, rows):
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
        probe = _pack(_unit(query))

        def rows(k: int) -> Sequence[tuple[int, float]]:
            db.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")  # read the vectors in place (no remap when already so)
            return db.execute(f"SELECT rowid, distance FROM {_table(dim)} WHERE embedding MATCH ? AND k = ? "
                              "AND collection = ? ORDER BY distance", [probe, k, collection])

        return _nearest_versions(db, rows, collection, query, limit, prefix)

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


class PgVector:
    """pgvector tables of the live vectors on PostgreSQL, one per dimension (see the module's docstring)."""

    name = "pgvector"

    def changed(self, db: Dialect, removed: Sequence[int], added: Sequence[int]) -> None:
        if not (removed or added):
            return
        for (dim,) in db.execute("SELECT dim FROM publication_vector_indexes"):
            if removed:
                db.execute(f"DELETE FROM {_pg_table(int(dim))} WHERE publication_id = ANY(CAST(? AS BIGINT[]))",
                           [list(removed)])
            if added:
                _pg_fill(db, int(dim), db.execute_binary(
                    "SELECT v.publication_id, v.n, p.collection, v.vector FROM publication_vectors v "
                    "JOIN publications p ON p.id = v.publication_id "
                    f"WHERE v.publication_id = ANY(CAST(? AS BIGINT[])) AND v.dim = ? AND v.n < {SLOTS}",
                    [list(added), int(dim)]))

    def nearest(self, db: Dialect, collection: str, query: Sequence[float], limit: int,
                prefix: str | None) -> Scored:
        dim = len(query)
        self._ready(db, dim)
        probe = _literal(_unit(query))

        def rows(k: int) -> Sequence[tuple[int, float]]:
            return db.execute(f"SELECT publication_id * {SLOTS} + n, embedding <=> CAST(? AS vector) AS distance "
                              f"FROM {_pg_table(dim)} WHERE collection = ? ORDER BY distance LIMIT ?",
                              [probe, collection, k])

        return _nearest_versions(db, rows, collection, query, limit, prefix)

    @staticmethod
    def _ready(db: Dialect, dim: int) -> None:
        """Make the table for ``dim`` from the live vectors when there is none."""
        made = "SELECT COUNT(*) FROM publication_vector_indexes WHERE dim = ? AND stale = 0"
        if db.execute(made, [dim])[0][0]:
            return
        db.refresh_statistics(["publications", "publication_vectors"])  # a fresh store's plans scan otherwise
        with db.transaction():
            # Publications under way finish first (they hold ROW EXCLUSIVE); those after wait, then see the table.
            db.execute("LOCK TABLE publications IN SHARE MODE")
            if db.execute(made, [dim])[0][0]:
                return
            table = _pg_table(dim)
            db.execute(f"DROP TABLE IF EXISTS {table}")
            db.execute(f"CREATE TABLE {table} (publication_id BIGINT NOT NULL, n INTEGER NOT NULL, "
                       f"collection TEXT NOT NULL, embedding vector({dim}) NOT NULL, PRIMARY KEY (publication_id, n))")
            db.execute(f"CREATE INDEX {table}_collection ON {table} (collection)")
            after = 0
            while ids := db.execute("SELECT id FROM publications WHERE live = 1 AND id > ? "
                                    "AND vector_model IS NOT NULL ORDER BY id LIMIT ?", [after, FILL_BATCH]):
                first, after = int(ids[0][0]), int(ids[-1][0])
                _pg_fill(db, dim, db.execute_binary(
                    "SELECT v.publication_id, v.n, p.collection, v.vector FROM publication_vectors v "
                    "JOIN publications p ON p.id = v.publication_id WHERE v.publication_id >= ? "
                    "AND v.publication_id <= ? AND p.id >= ? AND p.id <= ? AND p.live = 1 AND v.dim = ? "
                    f"AND v.n < {SLOTS}", [first, after, first, after, dim]))
            db.execute("DELETE FROM publication_vector_indexes WHERE dim = ?", [dim])
            db.execute("INSERT INTO publication_vector_indexes (dim, stale) VALUES (?, 0)", [dim])
            db.execute(f"ANALYZE {table}")


def vector_index(db: Dialect) -> VectorIndex:
    """The store's way: sqlite-vec where this process has it on SQLite, pgvector where the store's PostgreSQL
    database has the extension, otherwise the exact scan. Publishers always go through ``maintained``, which keeps
    the tables that exist in step (or, on SQLite, marks them stale)."""
    if db.name == "sqlite":
        return SqliteVec() if available() else ExactScan()
    if os.environ.get(ENV_PGVECTOR, "1") != "0" and db.execute(
            "SELECT COUNT(*) FROM pg_extension WHERE extname = 'vector'")[0][0]:
        return PgVector()
    return ExactScan()


def maintained(db: Dialect) -> VectorIndex:
    """What publication and rollback tell about changes: the vec0 tables on SQLite (whether this process can
    write them or not), the pgvector tables on PostgreSQL (where a search made them)."""
    return SqliteVec() if db.name == "sqlite" else PgVector()


def _pg_fill(db: Dialect, dim: int, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert (publication id, n, collection, float32 blob) rows into the pgvector table of ``dim`` by one binary
    COPY, each vector in pgvector's binary form (int16 dimension, int16 zero, big-endian float4s): no text of
    the floats is made or parsed on either side."""
    if not rows:
        return
    assert isinstance(db, PostgresDialect), "pgvector tables live on PostgreSQL"
    parts = [b"PGCOPY\n\xff\r\n\x00", struct.pack("!ii", 0, 0)]
    for pid, n, collection, blob in rows:
        name, vector = str(collection).encode(), array("f")
        vector.frombytes(bytes(blob))
        if sys.byteorder == "little":
            vector.byteswap()
        parts += [struct.pack("!hiqiii", 4, 8, int(pid), 4, int(n), len(name)), name,
                  struct.pack("!ihh", 4 + 4 * dim, dim, 0), vector.tobytes()]
    parts.append(struct.pack("!h", -1))
    with db.conn.cursor() as cur, cur.copy(f"COPY {_pg_table(dim)} (publication_id, n, collection, embedding) "
                                           "FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(b"".join(parts))


def _nearest_versions(db: Dialect, rows: Callable[[int], Sequence[tuple[int, float]]], collection: str,
                      query: Sequence[float], limit: int, prefix: str | None) -> Scored:
    """The ``limit`` versions nearest the query from an index's ``rows(k)``: its k nearest vectors as (row id,
    cosine distance), nearest first. Asks for more (up to MAX_K) while its best chunks, within ``prefix``, are too
    few; past MAX_K, the exact scan."""
    fetch = min(MAX_K, max(limit * 4, 40))
    while True:
        found = rows(fetch)
        best = _best_chunks(found)
        if prefix is not None:
            best = _within(db, best, prefix)
        if len(best) >= limit or len(found) < fetch:
            return best[:limit]
        if fetch >= MAX_K:  # past what one query returns: the few that match the keys, scanned
            return ExactScan().nearest(db, collection, query, limit, prefix)
        fetch = min(MAX_K, fetch * 4)


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


def _pg_table(dim: int) -> str:
    return f"publication_pgvec_{int(dim)}"


def _literal(vector: Sequence[float]) -> str:
    """pgvector's text form of a vector: ``[x,y,...]``, each float32 to the digits that keep it exact."""
    return "[" + ",".join(map(repr, vector)) + "]"


def _scores(unit: Sequence[float], rows: Sequence[tuple[Any, ...]]) -> list[tuple[int, float]]:
    """(publication id, cosine with ``unit``) for (publication id, float32 blob) rows: one matrix product where
    numpy is installed, a loop in C per vector otherwise."""
    if not rows:
        return []
    try:
        import numpy as np
    except ImportError:
        return [(int(pid), _cosine(unit, _floats(blob))) for pid, blob in rows]
    matrix = np.frombuffer(b"".join(bytes(blob) for _, blob in rows), dtype="<f4").reshape(len(rows), len(unit))
    norms = np.linalg.norm(matrix, axis=1)
    dots = matrix @ np.asarray(unit, dtype=np.float32)
    scores = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    return [(int(pid), float(score)) for (pid, _), score in zip(rows, scores.tolist(), strict=True)]


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
