"""The built-in publication target: versioned records with their full-text entries and vectors.

Each publication of an item into a collection is a version (1, 2, 3 ...) with its provenance. At most one
version of an item is live (a unique partial index says so); a new one supersedes it in the same
transaction that writes the new record, its vectors and its full-text entry, so a reader never sees half
of a version, nor two. A rollback is a version too: a copy of the content that the live version replaced
(action ``rollback``), or, when there was none, a ``retract`` version after which nothing is live.
"""

from __future__ import annotations

import sys
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from conveyor.errors import UserError
from conveyor.store.dialect import Dialect
from conveyor.store.fulltext import TextIndex, text_index, words
from conveyor.store.records import CHILD_MARK, NewPublication
from conveyor.store.vectors import maintained, vector_index

PUBLISHER = "conveyor"  # created_by of the versions a run publishes
CHUNK = 1000  # keys per IN list
VECTOR_COLUMNS = ("publication_id", "n", "dim", "vector")
_COLUMNS = ("collection, item_key, version, action, live, fields, text, digest, pipeline, run_id, task_id, "
            "replaces, restores, created_at, created_by, reason, vector_model")
_INSERT = f"INSERT INTO publications ({_COLUMNS}) VALUES ({', '.join('?' * 17)}) RETURNING id"
UNRECORDED = ""  # vector_model of a version whose vectors came from a model nobody named


class NewVersion(NamedTuple):
    """A version to insert, in the column order of ``publications``."""

    collection: str
    item_key: str
    version: int
    action: str  # publish | rollback | retract
    live: int
    fields: str | None
    text: str | None
    digest: str | None
    pipeline: str | None
    run_id: str | None
    task_id: int | None
    replaces: int | None  # the id that was live when this version came in
    restores: int | None  # a rollback's: the version whose content it copies
    created_at: float
    created_by: str
    reason: str | None
    vector_model: str | None  # None: no vectors; UNRECORDED: vectors from an unnamed model


class PublicationVersion(NamedTuple):
    """One version of an item in a collection, as listed (``vectors``: how many it has)."""

    id: int
    collection: str
    item_key: str
    version: int
    action: str
    live: bool
    fields: str | None
    digest: str | None
    pipeline: str | None
    run_id: str | None
    task_id: int | None
    replaces: int | None
    restores: int | None
    created_at: float
    created_by: str
    reason: str | None
    vectors: int


class PublicationContent(NamedTuple):
    fields: str | None
    text: str | None
    vectors: list[list[float]]


class SearchHit(NamedTuple):
    item_key: str
    collection: str
    version: int
    run_id: str | None
    score: float  # grows with relevance; words: the backend's (bm25 on SQLite, ts_rank on PostgreSQL); vectors:
    # the cosine similarity of the version's best vector
    snippet: str
    fields: str


class VectorModels(NamedTuple):
    """The live versions of a collection that have vectors, by the model that made them (UNRECORDED: unnamed)."""

    collection: str
    model: str
    versions: int | None  # None: not counted (the collection's only model, found by two index probes)


class RolledBack(NamedTuple):
    collection: str
    item_key: str
    from_version: int  # the version that was live
    to_version: int  # the version the rollback wrote
    action: str  # rollback | retract


class StageProvenance(NamedTuple):
    """What one stage ran as for an item (or one of its ancestors) in a run."""

    item_key: str
    stage: str
    stage_version: str
    config_hash: str


class _Live(NamedTuple):
    id: int
    version: int
    digest: str | None
    replaces: int | None
    run_id: str | None
    action: str
    pipeline: str | None


Key = tuple[str, str]  # (collection, item_key)


class PublicationQueries:
    db: Dialect

    # --- publishing: inside the caller's transaction -----------------------------------------------

    def publish(self, rows: Sequence[NewPublication]) -> int:
        """Publish each row as its item's new live version, inside the caller's transaction; a row whose
        digest is the live version's changes nothing. Returns how many versions were written."""
        if not rows:
            return 0
        index = text_index(self.db)
        index.lock(self.db, [(r.collection, r.item_key) for r in rows])
        return sum(self._publish_wave(wave, index) for wave in _waves(rows))

    def _publish_wave(self, rows: Sequence[NewPublication], index: TextIndex) -> int:
        keys = [(r.collection, r.item_key) for r in rows]
        live, last = self._live(keys), self._last_versions(keys)
        fresh = [r for r in rows if (old := live.get((r.collection, r.item_key))) is None or old.digest != r.digest]
        olds = [live.get((r.collection, r.item_key)) for r in fresh]
        versions = [NewVersion(r.collection, r.item_key, last.get((r.collection, r.item_key), 0) + 1, "publish", 1,
                               r.fields, _clean(r.text), r.digest, r.pipeline, r.run_id, r.task_id,
                               old.id if old else None, None, r.created_at, PUBLISHER, None, _model_of(r))
                    for r, old in zip(fresh, olds, strict=True)]
        superseded = [old.id for old in olds if old]
        ids = self._replace(superseded, versions, index)
        self.db.append("publication_vectors", VECTOR_COLUMNS, [
            (pid, n, len(vector), _pack(vector)) for pid, r in zip(ids, fresh, strict=True)
            for n, vector in enumerate(r.vectors)])
        maintained(self.db).changed(self.db, superseded, ids)
        return len(fresh)

    def _replace(self, superseded: Sequence[int], versions: Sequence[NewVersion], index: TextIndex) -> list[int]:
        """Supersede the live versions, insert the new ones and index those that are live; their ids."""
        index.remove(self.db, superseded)
        self.db.executemany("UPDATE publications SET live = 0 WHERE id = ?", [(i,) for i in superseded])
        ids = [int(row[0]) for row in self.db.executemany_returning(_INSERT, versions)]
        index.add(self.db, [i for i, v in zip(ids, versions, strict=True) if v.live])
        return ids

    # --- rollback ----------------------------------------------------------------------------------

    def rollback_item(self, collection: str, item_key: str, by: str, reason: str | None, now: float) -> RolledBack:
        """Roll one item back to the content its live version replaced (or retract it); one transaction."""
        with self.db.transaction():
            done = self._roll_back([(collection, item_key)], by, reason, now)
        if not done:
            raise UserError(f"item {item_key!r} has no live version in collection {collection!r} to roll back; "
                            f"`conveyor publications {item_key}` lists its versions")
        return done[0]

    def rollback_run(self, run_id: str, by: str, reason: str | None, now: float) -> list[RolledBack]:
        """Roll back every item whose live version run ``run_id`` published, in one transaction."""
        with self.db.transaction():
            keys = [(str(c), str(k)) for c, k in self.db.execute(
                "SELECT collection, item_key FROM publications WHERE run_id = ? AND live = 1 AND action = 'publish' "
                "ORDER BY collection, item_key", [run_id])]
            return self._roll_back(keys, by, reason, now, run_id)

    def _roll_back(self, keys: Sequence[Key], by: str, reason: str | None, now: float,
                   run_id: str | None = None) -> list[RolledBack]:
        index = text_index(self.db)
        index.lock(self.db, keys)
        live = self._live(keys)  # read under the lock: what is live now
        targets = [(k, old) for k in keys if (old := live.get(k)) is not None
                   and (run_id is None or (old.run_id == run_id and old.action == "publish"))]
        last = self._last_versions([k for k, _ in targets])
        sources = self._sources([old.replaces for _, old in targets if old.replaces is not None])
        versions = [_undo(k, old, last[k] + 1, sources.get(old.replaces) if old.replaces else None, by, reason, now)
                    for k, old in targets]
        ids = self._replace([old.id for _, old in targets], versions, index)
        self.db.executemany(
            "INSERT INTO publication_vectors (publication_id, n, dim, vector) "
            "SELECT ?, n, dim, vector FROM publication_vectors WHERE publication_id = ?",
            [(new, old.replaces) for new, (_, old), v in zip(ids, targets, versions, strict=True) if v.live])
        maintained(self.db).changed(self.db, [old.id for _, old in targets],
                                    [new for new, v in zip(ids, versions, strict=True) if v.live])
        return [RolledBack(k[0], k[1], old.version, v.version, v.action)
                for (k, old), v in zip(targets, versions, strict=True)]

    # --- what is there -------------------------------------------------------------------------------

    def _live(self, keys: Sequence[Key]) -> dict[Key, _Live]:
        wanted, found = set(keys), {}
        for chunk in _chunks(sorted({k for _, k in keys})):
            for c, k, *rest in self.db.execute(
                    "SELECT collection, item_key, id, version, digest, replaces, run_id, action, pipeline "
                    f"FROM publications WHERE live = 1 AND item_key IN ({_marks(chunk)})", chunk):
                if (c, k) in wanted:
                    found[(c, k)] = _Live(*rest)
        return found

    def _last_versions(self, keys: Sequence[Key]) -> dict[Key, int]:
        wanted, found = set(keys), {}
        for chunk in _chunks(sorted({k for _, k in keys})):
            for c, k, version in self.db.execute(
                    "SELECT collection, item_key, MAX(version) FROM publications "
                    f"WHERE item_key IN ({_marks(chunk)}) GROUP BY collection, item_key", chunk):
                if (c, k) in wanted:
                    found[(c, k)] = int(version)
        return found

    def _sources(self, ids: Sequence[int]) -> dict[int, tuple[Any, ...]]:
        """The versions a rollback copies: id -> (version, fields, text, digest, pipeline, run_id, task_id,
        vector_model)."""
        found: dict[int, tuple[Any, ...]] = {}
        for chunk in _chunks(sorted(set(ids))):
            for pid, *content in self.db.execute(
                    "SELECT id, version, fields, text, digest, pipeline, run_id, task_id, vector_model "
                    f"FROM publications WHERE id IN ({_marks(chunk)})", chunk):
                found[int(pid)] = tuple(content)
        return found

    def publication_collections(self, item_key: str) -> list[str]:
        """The collections that hold a version of ``item_key``."""
        return [str(r[0]) for r in self.db.execute(
            "SELECT DISTINCT collection FROM publications WHERE item_key = ? ORDER BY collection", [item_key])]

    def publication_versions(self, collection: str | None, item_key: str) -> list[PublicationVersion]:
        """Every version of an item (in every collection when ``collection`` is None), newest first."""
        where, params = ("AND p.collection = ?", [item_key, collection]) if collection else ("", [item_key])
        return [PublicationVersion._make((*row[:5], bool(row[5]), *row[6:])) for row in self.db.execute(
            f"SELECT {_listed('p')}, (SELECT COUNT(*) FROM publication_vectors v WHERE v.publication_id = p.id) "
            f"FROM publications p WHERE p.item_key = ? {where} ORDER BY p.collection, p.version DESC", params)]

    def publication_content(self, collection: str, item_key: str, version: int) -> PublicationContent | None:
        """One version's fields (JSON), text and vectors."""
        rows = self.db.execute("SELECT id, fields, text FROM publications "
                               "WHERE item_key = ? AND collection = ? AND version = ?", [item_key, collection, version])
        if not rows:
            return None
        pid, fields, text = rows[0]
        vectors = self.db.execute("SELECT vector FROM publication_vectors WHERE publication_id = ? ORDER BY n", [pid])
        return PublicationContent(fields, text, [_unpack(bytes(v[0])) for v in vectors])

    def search_publications(self, query: str, collection: str | None, limit: int,
                            prefix: str | None = None) -> list[SearchHit]:
        """Live versions whose text matches every word of ``query`` (taken literally), best first (with item keys
        that start with ``prefix``, when given)."""
        words(query)
        rows = text_index(self.db).search(self.db, query, collection, limit, prefix)
        return [SearchHit(k, c, int(v), run, float(score), snippet or "", fields)
                for k, c, v, run, score, snippet, fields in rows]

    def vector_models(self, collection: str | None, prefix: str | None = None) -> list[VectorModels]:
        """Which models made the vectors of the live versions (of ``collection``, or of every collection; with
        item keys that start with ``prefix``, when given)."""
        if collection is not None and prefix is None:  # the common case: one named model, seen from both ends
            lo, hi = (self.db.execute(f"SELECT {end}(vector_model) FROM publications WHERE live = 1 AND collection = ? "
                                      "AND vector_model IS NOT NULL", [collection])[0][0] for end in ("MIN", "MAX"))
            if lo is None:
                return []
            if lo == hi and lo != UNRECORDED:
                return [VectorModels(collection, str(lo), None)]
        where, params = ("AND collection = ?", list[Any]([collection])) if collection is not None else ("", [])
        if prefix is not None:
            where, params = f"{where} AND substr(item_key, 1, ?) = ?", [*params, len(prefix), prefix]
        return [VectorModels(str(c), str(m), int(n)) for c, m, n in self.db.execute(
            "SELECT collection, vector_model, COUNT(*) FROM publications WHERE live = 1 AND vector_model IS NOT NULL "
            f"{where} GROUP BY collection, vector_model ORDER BY collection, vector_model", params)]

    def nearest_publications(self, collection: str, query: Sequence[float], limit: int,
                             prefix: str | None = None) -> tuple[str, list[SearchHit]]:
        """The live versions of ``collection`` nearest the query vector by cosine similarity (a version with
        several vectors at its best one), best first; and the index that ranked them."""
        index = vector_index(self.db)
        scored = index.nearest(self.db, collection, query, limit, prefix)
        rows = {int(r[0]): r[1:] for r in self.db.execute(
            f"SELECT id, item_key, collection, version, run_id, text, fields FROM publications "
            f"WHERE id IN ({_marks(scored)})", [pid for pid, _ in scored])} if scored else {}
        return index.name, [SearchHit(k, c, int(v), run, score, _opening(text), fields)
                            for pid, score in scored for k, c, v, run, text, fields in [rows[pid]]]

    def item_provenance(self, run_id: str, item_key: str) -> list[StageProvenance]:
        """Each stage's version and config hash for an item and its fan-out ancestors in a run, in task order."""
        parts = item_key.split(CHILD_MARK)
        lineage = [CHILD_MARK.join(parts[:n]) for n in range(1, len(parts) + 1)]
        return [StageProvenance(*row) for row in self.db.execute(
            "SELECT item_key, stage, stage_version, config_hash FROM tasks "
            f"WHERE run_id = ? AND root_key = ? AND item_key IN ({_marks(lineage)}) ORDER BY id",
            [run_id, parts[0], *lineage])]


def _undo(key: Key, old: _Live, version: int, source: tuple[Any, ...] | None, by: str, reason: str | None,
          now: float) -> NewVersion:
    """The version a rollback writes: a copy of what ``old`` replaced, or a retraction."""
    if source is None:
        return NewVersion(*key, version, "retract", 0, None, None, None, old.pipeline, None, None, old.id, None,
                          now, by, reason, None)
    restores, fields, text, digest, pipeline, run_id, task_id, vector_model = source
    return NewVersion(*key, version, "rollback", 1, fields, text, digest, pipeline, run_id, task_id, old.id,
                      restores, now, by, reason, vector_model)


def _waves(rows: Sequence[NewPublication]) -> list[list[NewPublication]]:
    """Split rows so that no item is twice in one wave: two publications of one item in one commit are
    two versions, the later one live."""
    waves: list[list[NewPublication]] = []
    seen: Counter[Key] = Counter()
    for row in rows:
        key = (row.collection, row.item_key)
        if seen[key] == len(waves):
            waves.append([])
        waves[seen[key]].append(row)
        seen[key] += 1
    return waves


def _listed(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in ("id", "collection", "item_key", "version", "action", "live", "fields",
                                              "digest", "pipeline", "run_id", "task_id", "replaces", "restores",
                                              "created_at", "created_by", "reason"))


def _model_of(row: NewPublication) -> str | None:
    if not row.vectors:
        return None
    return row.vector_model or UNRECORDED


def _opening(text: str | None, count: int = 16) -> str:
    """A vector hit's snippet: the first words of its text (no word matched, so nothing to mark)."""
    found = (text or "").split()
    return " ".join(found[:count]) + (" …" if len(found) > count else "")


def _clean(text: str | None) -> str | None:
    # PostgreSQL's text cannot hold NUL; an extraction that left one in must not fail the commit.
    return text.replace("\x00", " ") if text and "\x00" in text else text


def _pack(vector: Sequence[float]) -> bytes:
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unpack(data: bytes) -> list[float]:
    values = array("f")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def _chunks(values: Sequence[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(values), CHUNK):
        yield list(values[start:start + CHUNK])


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))
