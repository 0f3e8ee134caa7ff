"""The publication target's per-backend parts: the full-text index of live versions, its search, and
the item locks that keep two publishers of one item from numbering the same version.

SQLite: an FTS5 table over ``publications.text`` (external content, so the text is stored once) that
holds an entry for every live version and for no other; entries are added and removed in the transaction
that changes what is live. Ranked by bm25. Writers are serialised by the database, so no lock is needed.

PostgreSQL: a ``tsvector`` generated from the text, under a GIN index restricted to live versions, so it
follows the ``live`` flag by itself. Ranked by ``ts_rank``. Publishers of one item queue on advisory
locks taken in a fixed order.

A user's query never becomes query syntax: on SQLite every word is quoted (``-``, ``"``, ``OR`` and ``*``
are taken literally), on PostgreSQL it goes through ``plainto_tsquery``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from conveyor.errors import UserError

if TYPE_CHECKING:
    from conveyor.store.dialect import Dialect

SNIPPET_WORDS = 16
MAX_ITEM_LOCKS = 1000  # item locks one transaction takes on PostgreSQL; past it, whole collections


class TextIndex(Protocol):
    def lock(self, db: Dialect, items: Iterable[tuple[str, str]]) -> None:
        """Hold a lock on each (collection, item_key) until the transaction ends."""
        ...

    def add(self, db: Dialect, ids: Sequence[int]) -> None:
        """Index these publications (they just became live)."""
        ...

    def remove(self, db: Dialect, ids: Sequence[int]) -> None:
        """Unindex these publications (they are no longer live); call before their text could change."""
        ...

    def search(self, db: Dialect, query: str, collection: str | None, limit: int,
               prefix: str | None = None) -> list[tuple[Any, ...]]:
        """Rows (item_key, collection, version, run_id, score, snippet, fields), best first; the score
        grows with relevance. ``prefix``: only item keys that start with it (a tenant's)."""
        ...


class SqliteText:
    def lock(self, db: Dialect, items: Iterable[tuple[str, str]]) -> None:
        """Nothing to take: a write transaction holds the store's one writer lock."""

    def add(self, db: Dialect, ids: Sequence[int]) -> None:
        db.executemany("INSERT INTO publication_fts (rowid, text) SELECT id, text FROM publications "
                       "WHERE id = ? AND text IS NOT NULL", [(i,) for i in ids])

    def remove(self, db: Dialect, ids: Sequence[int]) -> None:
        # An external-content index forgets an entry when told the text it was made from.
        db.executemany("INSERT INTO publication_fts (publication_fts, rowid, text) SELECT 'delete', id, text "
                       "FROM publications WHERE id = ? AND text IS NOT NULL", [(i,) for i in ids])

    def search(self, db: Dialect, query: str, collection: str | None, limit: int,
               prefix: str | None = None) -> list[tuple[Any, ...]]:
        # The index holds live versions only, so the join needs no filter on `live`.
        where, params = _filters(collection, prefix)
        return db.execute(
            "SELECT p.item_key, p.collection, p.version, p.run_id, -bm25(publication_fts), "
            f"snippet(publication_fts, 0, '[', ']', '…', {SNIPPET_WORDS}), p.fields "
            "FROM publication_fts JOIN publications p ON p.id = publication_fts.rowid "
            f"WHERE publication_fts MATCH ? {where} ORDER BY bm25(publication_fts), p.id LIMIT ?",
            [fts5_query(query), *params, limit])


class PostgresText:
    def lock(self, db: Dialect, items: Iterable[tuple[str, str]]) -> None:
        """A lock per item, under a shared lock on its collection; past MAX_ITEM_LOCKS items (the server's
        lock table is finite: a rollback of a 100,000-item run must not fill it), the collections whole.
        Everyone takes collection locks first and each kind in one order, so no two wait in a circle."""
        wanted = set(items)
        collections = [f"conveyor.collection\n{c}" for c in {c for c, _ in wanted}]
        if len(wanted) > MAX_ITEM_LOCKS:
            _take(db, "pg_advisory_xact_lock", collections)
            return
        _take(db, "pg_advisory_xact_lock_shared", collections)
        _take(db, "pg_advisory_xact_lock", [f"conveyor.publication\n{c}\n{item}" for c, item in wanted])

    def add(self, db: Dialect, ids: Sequence[int]) -> None:
        """Nothing to write: the index follows the live flag."""

    def remove(self, db: Dialect, ids: Sequence[int]) -> None:
        """Nothing to write: the index follows the live flag."""

    def search(self, db: Dialect, query: str, collection: str | None, limit: int,
               prefix: str | None = None) -> list[tuple[Any, ...]]:
        where, params = _filters(collection, prefix)
        # The headline is made for the rows that are shown, not for every match.
        return db.execute(
            "SELECT item_key, collection, version, run_id, score, ts_headline('simple', text, query, "
            f"'StartSel=[, StopSel=], MaxWords={SNIPPET_WORDS}, MinWords={SNIPPET_WORDS // 2}'), fields FROM ("
            "SELECT p.id, p.item_key, p.collection, p.version, p.run_id, ts_rank(p.text_index, q.query) AS score, "
            "p.text, q.query, p.fields FROM (SELECT plainto_tsquery('simple', ?) AS query) AS q "
            f"JOIN publications p ON p.text_index @@ q.query WHERE p.live = 1 {where} "
            "ORDER BY score DESC, p.id LIMIT ?) AS hits ORDER BY score DESC, id",
            [query, *params, limit])


def _filters(collection: str | None, prefix: str | None) -> tuple[str, list[Any]]:
    where, params = ("AND p.collection = ?", [collection]) if collection is not None else ("", list[Any]())
    if prefix is not None:
        where, params = f"{where} AND substr(p.item_key, 1, ?) = ?", [*params, len(prefix), prefix]
    return where, params


def _take(db: Dialect, function: str, keys: Sequence[str]) -> None:
    if keys:
        db.execute(f"SELECT {function}(h) FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(CAST(? AS TEXT[])) AS k "
                   "ORDER BY h OFFSET 0) AS locks", [list(keys)])


def text_index(db: Dialect) -> TextIndex:
    return PostgresText() if db.name == "postgres" else SqliteText()


def fts5_query(query: str) -> str:
    """Every word of ``query`` as a quoted FTS5 string (all must match): no word is an operator."""
    return " ".join('"' + word.replace('"', '""') + '"' for word in words(query))


def words(query: str) -> list[str]:
    """The words of a search query; none is a user error."""
    found = query.split()
    if not found:
        raise UserError("the search query is empty; give some words, e.g. conveyor search \"error budget\"")
    return found

