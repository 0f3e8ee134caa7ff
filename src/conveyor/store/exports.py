"""What `conveyor export` reads, a batch of root items (or live publications) at a time, in key order.

Every query takes one key range of a primary or unique index ((run, root, item, stage) for tasks, (run, item)
for items, the live publications' (collection, item)), so a batch costs the same at the start of a run of a
million items as at its end, and memory holds one batch, never a run. Which rows to read and what they mean
(outcomes, records, the nesting of values) is service/export.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.memokey import key64_sql
from conveyor.store.tasks import chunks


class ExportTask(NamedTuple):
    """One task of a root item in a batch: enough to find the item's record and why it did not make it; a
    root item's own task at the export's stage, succeeded, comes with its memo row (``memo_*``: its output's
    digest, its bytes when inline, and the provenance document the output was made with)."""

    root_key: str
    item_key: str
    stage: str
    status: str
    task_key: str
    output_kind: str | None
    output_digest: str | None
    stage_version: str
    config_hash: str
    error_class: str | None
    error: str | None
    memo_digest: str | None
    memo_inline: bytes | None
    memo_provenance: str | None


class ItemUsage(NamedTuple):
    """The model usage of every attempt of an item's tasks (its fan-out children's included)."""

    tokens: int
    cost: float
    provider_calls: int
    unpriced_calls: int


class LivePublication(NamedTuple):
    """A live version of an item in a collection, and the task (of ``run_id``) that published it."""

    item_key: str
    version: int
    fields: str | None
    run_id: str | None
    task_id: int | None
    created_at: float


class PublishingTask(NamedTuple):
    """The task behind a publication: its item, stage and the declaration it ran under."""

    id: int
    run_id: str
    root_key: str
    item_key: str
    stage: str
    stage_version: str
    config_hash: str


_TASK_COLUMNS = ("t.root_key, t.item_key, t.stage, t.status, t.task_key, t.output_kind, t.output_digest, "
                 "t.stage_version, t.config_hash, t.error_class, t.last_error, o.digest, o.inline, o.provenance")


class ExportQueries:
    db: Dialect

    def export_tasks(self, run_id: str, stage: str | None, first: str, last: str) -> list[ExportTask]:
        """Every task of the root items from ``first`` to ``last`` (in key order) and of their fan-out
        descendants (one range of the (run, root, item, stage) index), the succeeded root tasks at ``stage``
        with their memo rows (one lookup of the memo's key each)."""
        rows = self.db.execute(
            f"SELECT {_TASK_COLUMNS} FROM tasks t LEFT JOIN outputs o ON t.stage = ? AND t.item_key = t.root_key "
            f"AND t.status = 'succeeded' AND o.key64 = {key64_sql(self.db.name, 't.task_key')} "
            "AND o.task_key = t.task_key WHERE t.run_id = ? AND t.root_key >= ? AND t.root_key <= ? "
            "ORDER BY t.root_key, t.item_key, t.stage", (stage, run_id, first, last))
        return [ExportTask(*r) for r in rows]

    def roots_after(self, run_id: str, after: str | None, limit: int) -> list[tuple[str, str | None]]:
        """(key, source digest) of the next ``limit`` root items of the run after ``after``, in key order (a walk
        of the items' primary key)."""
        rows = self.db.execute(
            "SELECT item_key, source_digest FROM items WHERE run_id = ? AND parent_key IS NULL "
            f"{'AND item_key > ?' if after is not None else ''} ORDER BY item_key LIMIT ?",
            (run_id, *([after] if after is not None else []), limit))
        return [(str(k), d) for k, d in rows]

    def export_sources(self, run_id: str, first: str, last: str) -> dict[str, str | None]:
        """Root item key -> its source digest, for the root items from ``first`` to ``last``."""
        rows = self.db.execute(
            "SELECT item_key, source_digest FROM items WHERE run_id = ? AND item_key >= ? AND item_key <= ? "
            "AND parent_key IS NULL", (run_id, first, last))
        return {str(k): d for k, d in rows}

    def export_usage(self, run_id: str, first: str, last: str) -> dict[str, ItemUsage]:
        """Root item key -> the usage of every attempt of its tasks and its descendants' (retries, failures and
        review decisions included), for the root items from ``first`` to ``last`` that have attempts."""
        rows = self.db.execute(
            "SELECT t.root_key, SUM(a.prompt_tokens + a.completion_tokens), SUM(a.cost), SUM(a.provider_calls), "
            "SUM(a.unpriced_calls) FROM tasks t JOIN attempts a ON a.run_id = t.run_id AND a.task_id = t.id "
            "WHERE t.run_id = ? AND t.root_key >= ? AND t.root_key <= ? GROUP BY t.root_key",
            (run_id, first, last))
        return {str(k): ItemUsage(int(tok or 0), float(cost or 0.0), int(calls or 0), int(unpriced or 0))
                for k, tok, cost, calls, unpriced in rows}

    def export_provenance(self, run_id: str, stage: str, first: str,
                          last: str) -> dict[tuple[str, str], dict[str, list[str]]]:
        """(root key, item key) -> the provenance rows (name -> values, in version order) of the tasks at
        ``stage`` of the root items from ``first`` to ``last`` and their descendants."""
        found: dict[tuple[str, str], dict[str, list[str]]] = {}
        for root, item, name, value in self.db.execute(
                "SELECT root_key, item_key, name, value FROM provenance WHERE run_id = ? AND root_key >= ? "
                "AND root_key <= ? AND stage = ? ORDER BY root_key, item_key, name, sort_key",
                (run_id, first, last, stage)):
            found.setdefault((str(root), str(item)), {}).setdefault(str(name), []).append(str(value))
        return found

    def live_publications_after(self, collection: str, after: str | None, limit: int) -> list[LivePublication]:
        """The next ``limit`` live versions of ``collection`` after item key ``after``, in key order (a walk of
        the live index)."""
        rows = self.db.execute(
            "SELECT item_key, version, fields, run_id, task_id, created_at FROM publications WHERE collection = ? "
            f"AND live = 1 {'AND item_key > ?' if after is not None else ''} ORDER BY item_key LIMIT ?",
            (collection, *([after] if after is not None else []), limit))
        return [LivePublication(str(k), int(v), f, r, None if t is None else int(t), float(c))
                for k, v, f, r, t, c in rows]

    def has_collection(self, collection: str) -> bool:
        """Whether any version was ever published into ``collection``."""
        return bool(self.db.execute("SELECT 1 FROM publications WHERE collection = ? LIMIT 1", (collection,)))

    def publishing_tasks(self, task_ids: Sequence[int]) -> dict[int, PublishingTask]:
        """Task id -> the task, for these tasks (those of a batch of publications)."""
        found: dict[int, PublishingTask] = {}
        for part in chunks(sorted(set(task_ids)), self.db.in_chunk):
            where, params = self.db.one_of("id", part, "bigint")
            for row in self.db.execute("SELECT id, run_id, root_key, item_key, stage, stage_version, config_hash "
                                       f"FROM tasks WHERE {where}", params):
                found[int(row[0])] = PublishingTask(int(row[0]), *(str(v) for v in row[1:]))
        return found

    def export_roots_usage(self, run_id: str, roots: Sequence[str]) -> dict[str, ItemUsage]:
        """``export_usage`` of these root items of a run (a batch of publications)."""
        found: dict[str, ItemUsage] = {}
        for part in chunks(sorted(set(roots)), self.db.in_chunk):
            where, params = self.db.one_of("t.root_key", part, "text")
            for k, tok, cost, calls, unpriced in self.db.execute(
                    "SELECT t.root_key, SUM(a.prompt_tokens + a.completion_tokens), SUM(a.cost), "
                    "SUM(a.provider_calls), SUM(a.unpriced_calls) FROM tasks t JOIN attempts a ON a.run_id = t.run_id "
                    f"AND a.task_id = t.id WHERE t.run_id = ? AND {where} GROUP BY t.root_key", [run_id, *params]):
                found[str(k)] = ItemUsage(int(tok or 0), float(cost or 0.0), int(calls or 0), int(unpriced or 0))
        return found

    def export_roots_sources(self, run_id: str, roots: Sequence[str]) -> dict[str, str | None]:
        """Root item key -> source digest, for these root items of a run."""
        found: dict[str, str | None] = {}
        for part in chunks(sorted(set(roots)), self.db.in_chunk):
            where, params = self.db.one_of("item_key", part, "text")
            found.update((str(k), d) for k, d in self.db.execute(
                f"SELECT item_key, source_digest FROM items WHERE run_id = ? AND {where}", [run_id, *params]))
        return found

    def export_tasks_provenance(self, tasks: Sequence[PublishingTask]) -> dict[int, dict[str, list[str]]]:
        """Task id -> its provenance rows (name -> values), for these tasks (a batch of publications)."""
        wanted = {(t.run_id, t.root_key, t.item_key, t.stage): t.id for t in tasks}
        found: dict[int, dict[str, list[str]]] = {}
        for run_id in sorted({t.run_id for t in tasks}):
            roots = sorted({t.root_key for t in tasks if t.run_id == run_id})
            for part in chunks(roots, self.db.in_chunk):
                where, params = self.db.one_of("root_key", part, "text")
                for root, item, stage, name, value in self.db.execute(
                        f"SELECT root_key, item_key, stage, name, value FROM provenance WHERE run_id = ? AND {where} "
                        "ORDER BY root_key, item_key, stage, name, sort_key", [run_id, *params]):
                    task_id = wanted.get((run_id, str(root), str(item), str(stage)))
                    if task_id is not None:
                        found.setdefault(task_id, {}).setdefault(str(name), []).append(str(value))
        return found
