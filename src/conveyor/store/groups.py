"""Group stages: the groups a run still has to make, whether its items have settled, its members, group keys.

A group stage runs once per group of a run, once every item of the run has settled at its parent. Each run of a
pipeline with group stages gets a ``group_waits`` row per group stage when it is created; a worker with nothing to
claim asks which of its pipeline's waits are ready (``open_tasks_at``: the run's task totals, a few rows whatever
the run's size, not a scan of its items), takes one (``take_group_wait``: one process makes a run's groups) and
makes the groups in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.tasks import chunks

GROUP_KINDS = ("group", "reduce")
PAGE = 5_000


class Member(NamedTuple):
    """An item that succeeded at a group stage's parent: its key, its root's, and its output there."""

    item_key: str
    root_key: str
    task_key: str
    output_kind: str
    output_digest: str


class GroupQueries:
    db: Dialect

    def open_group_waits(self, run_id: str, pipeline: str, stages_json: str) -> None:
        """A new run's waits: one per group stage of its graph (``runs.stages``)."""
        stages = [s["name"] for s in json.loads(stages_json) if s.get("kind") in GROUP_KINDS]
        if stages:
            self.db.executemany("INSERT INTO group_waits (run_id, stage, pipeline) VALUES (?, ?, ?) "
                                "ON CONFLICT (run_id, stage) DO NOTHING", [(run_id, s, pipeline) for s in stages])

    def group_waits(self, pipeline: str, run_id: str | None = None) -> list[tuple[str, str]]:
        """(run id, stage) of the groups still to be made, of submitted runs of ``pipeline`` (or of one run)."""
        only = " AND g.run_id = ?" if run_id is not None else ""
        rows = self.db.execute(
            "SELECT g.run_id, g.stage FROM group_waits g JOIN runs r ON r.run_id = g.run_id "
            f"WHERE g.pipeline = ? AND g.made_at IS NULL AND r.status = 'submitted'{only} ORDER BY g.run_id, g.stage",
            (pipeline, *([run_id] if run_id is not None else [])))
        return [(str(r), str(s)) for r, s in rows]

    def open_tasks_at(self, run_id: str, stages: Sequence[str]) -> int:
        """Tasks of the run at ``stages`` that have not settled (open or awaiting review), from its totals."""
        marks = ",".join("?" * len(stages))
        rows = self.db.execute(
            f"SELECT SUM(value) FROM run_totals WHERE run_id = ? AND name = 'tasks' AND k1 IN ({marks}) "
            "AND k2 IN ('open', 'awaiting_review')", (run_id, *stages))
        return int(rows[0][0] or 0)

    def take_group_wait(self, run_id: str, stage: str, now: float) -> bool:
        """Mark the run's groups of ``stage`` made; False when another process made them first."""
        return self.db.executemany_count("UPDATE group_waits SET made_at = ? WHERE run_id = ? AND stage = ? "
                                         "AND made_at IS NULL", [(now, run_id, stage)]) == 1

    def reopen_group_waits(self, rows: Sequence[tuple[str, str]]) -> None:
        """The groups of these (run, stage) are to be made again (a replay changed what their members may be)."""
        self.db.executemany("UPDATE group_waits SET made_at = NULL WHERE run_id = ? AND stage = ?", rows)

    def group_item_keys(self, run_id: str) -> list[str]:
        """The run's group items (``group:KEY``)."""
        return [str(r[0]) for r in self.db.execute(
            "SELECT item_key FROM items WHERE run_id = ? AND item_key >= 'group:' AND item_key < 'group;' "
            "AND parent_key IS NULL ORDER BY item_key", (run_id,))]

    def group_members(self, run_id: str, stage: str) -> Iterator[Member]:
        """The items that succeeded at ``stage`` in the run, by item key, in pages."""
        after = ""
        while True:
            rows = self.db.execute(
                "SELECT item_key, root_key, task_key, output_kind, output_digest FROM tasks WHERE run_id = ? "
                "AND stage = ? AND status = 'succeeded' AND item_key > ? ORDER BY item_key LIMIT ?",
                (run_id, stage, after, PAGE))
            for row in rows:
                yield Member(*row)
            if len(rows) < PAGE:
                return
            after = rows[-1][0]

    def group_keys(self, declaration: str, digests: Sequence[str]) -> dict[str, str]:
        """Memoised group keys of outputs (by digest) under a group stage's declaration."""
        found: dict[str, str] = {}
        for part in chunks(sorted(set(digests)), self.db.in_chunk):
            where, params = self.db.one_of("digest", part, "text")
            for digest, key in self.db.execute(f"SELECT digest, group_key FROM group_keys WHERE declaration = ? "
                                               f"AND {where}", [declaration, *params]):
                found[str(digest)] = str(key)
        return found

    def keep_group_keys(self, declaration: str, keys: dict[str, str]) -> None:
        if keys:
            self.db.executemany("INSERT INTO group_keys (declaration, digest, group_key) VALUES (?, ?, ?) "
                                "ON CONFLICT (declaration, digest) DO NOTHING",
                                [(declaration, d, k) for d, k in sorted(keys.items())])

    def note_key_failures(self, run_id: str, stage: str, version: str, failed: int, first: str | None,
                          now: float) -> None:
        """How many members the last making of ``stage``'s groups left out because its ``by=`` failed on them, and
        the first one's error (a ``group_key_failed`` run notice, replaced each time the groups are made)."""
        self.db.execute("DELETE FROM run_notices WHERE run_id = ? AND kind = 'group_key_failed' AND stage = ?",
                        (run_id, stage))
        if failed:
            self.db.execute("INSERT INTO run_notices (run_id, kind, stage, version, code, count, created_at) "
                            "VALUES (?, 'group_key_failed', ?, ?, ?, ?, ?)",
                            (run_id, stage, version, first, failed, now))

    def key_failures(self, run_id: str) -> dict[str, tuple[int, str]]:
        """Group stage -> (members left out because its ``by=`` failed on them, the first one's error)."""
        return {str(stage): (int(count), str(first or "")) for stage, count, first in self.db.execute(
            "SELECT stage, count, code FROM run_notices WHERE run_id = ? AND kind = 'group_key_failed'", (run_id,))}
