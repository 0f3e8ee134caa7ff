"""Claim floors (store/claimfloors.py): with an old snapshot held, claims stop walking the dead queue entries of
every task claimed since, keep lane order, and still reach a task queued below a floor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from conveyor.store import claimfloors, open_store
from conveyor.store.claimfloors import FLOOR_MARGIN_S, ClaimFloors, ReclaimFloors
from conveyor.store.tasks import INSERT_QUEUED, TASK_KEY


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_floors_follow_what_claims_took_and_are_dropped_after_the_rescan_period() -> None:
    clock = Clock()
    floors = ClaimFloors(clock)
    assert floors.lanes("p", "a") is None
    floors.engage("p", "a", [(1, 10.0), (1, 12.0), (0, 3.0)], got_all=True, now=50.0)
    assert floors.lanes("p", "a") == {0: 3.0, 1: 12.0}
    floors.advance("p", "a", 1, [13.0, 15.0], got_all=True, now=50.0)
    assert floors.lanes("p", "a") == {0: 3.0, 1: 15.0}
    floors.advance("p", "a", 0, [], got_all=False, now=50.0)  # lane 0 exhausted up to the claim's clock
    assert floors.lanes("p", "a") == {0: 50.0 - FLOOR_MARGIN_S, 1: 15.0}
    floors.engage("p", "b", [], got_all=False, now=60.0)
    assert floors.lanes("p", "b") == {0: 60.0 - FLOOR_MARGIN_S, 1: 60.0 - FLOOR_MARGIN_S}
    clock.now += claimfloors.FLOOR_RESCAN_S + 1
    assert floors.lanes("p", "a") is None and floors.lanes("p", "b") is None


def test_reclaim_floors_follow_complete_scans_and_are_dropped_after_the_rescan_period() -> None:
    clock = Clock()
    floors = ReclaimFloors(clock)
    floors.scanned("p", [1.0, 2.0], limit=10, now=50.0, slow=False)
    assert floors.floor("p") is None  # a quick scan sets nothing
    floors.scanned("p", [1.0, 2.0, 3.0], limit=3, now=50.0, slow=True)
    assert floors.floor("p") == 3.0  # a full page: everything below its last expiry was returned
    floors.scanned("p", [4.0], limit=3, now=60.0, slow=False)
    assert floors.floor("p") == 60.0 - FLOOR_MARGIN_S  # a short page: everything below its clock
    floors.scanned("p", [], limit=3, now=20.0, slow=False)
    assert floors.floor("p") == 60.0 - FLOOR_MARGIN_S  # a floor never moves back
    clock.now += claimfloors.FLOOR_RESCAN_S + 1
    assert floors.floor("p") is None


def _queued(run_id: str, keys: list[str], lane: int, at: float) -> list[tuple[Any, ...]]:
    return [(run_id, "p", "a", key, key, f"t-{run_id}-{key}", "v1", "cfg", f"d-{key}", "text", b"x", 1, 3, lane,
             at + i / 1000, at, 0) for i, key in enumerate(keys)]


def _buffers(conn, sql: str, params: list[Any]) -> int:  # type: ignore[no-untyped-def]
    """Pages a statement touched (EXPLAIN ANALYZE, rolled back)."""
    with conn.transaction(force_rollback=True):
        plan = [r[0] for r in conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)]
    top = next(line for line in plan if line.strip().startswith("Buffers:"))  # the statement's, children included
    return sum(int(part.split("=")[1]) for part in top.split() if part.split("=")[0] in ("hit", "read"))


@contextmanager
def _held_snapshot(pg_url: str, count: int, now: float) -> Iterator[Any]:
    """A store with ``count`` tasks of stage a queued (lane 1, due 50 s ago), then a reader's snapshot taken and held
    until the block ends: every row version dead from then on stays. The tasks are settled afterwards."""
    import psycopg

    store = open_store(pg_url)
    reader = psycopg.connect(pg_url, autocommit=True)
    try:
        with store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r1", [f"k{i:05d}" for i in range(count)], 1, now - 50),
                                 TASK_KEY)
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT COUNT(*) FROM runs").fetchall()
        yield store
        store.db.execute("UPDATE tasks SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL")
        store.recount_open_task_seconds()
    finally:
        reader.close()
        store.close()


def test_with_an_old_snapshot_held_floored_claims_skip_the_dead_entries(pg_url: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    with _held_snapshot(pg_url, 20_000, now) as store:
        # The old queued versions of 19,000 claimed tasks stay in tasks_runnable, ahead of the live ones.
        monkeypatch.setattr("conveyor.store.tasks.SLOW_CLAIM_S", 0.0)  # every usual claim counts as slow
        first = store.claim("p", ["a"], 19_000, "w1", now, 60.0)
        assert len(first) == 19_000 and store.claim_floors.lanes("p", "a") is not None
        with store.db.transaction():  # an urgent task arrives in the interactive lane
            store.db.insert_many(INSERT_QUEUED, _queued("r2", ["urgent"], 0, now), TASK_KEY)
        taken = store.claim("p", ["a"], 10, "w1", now + 1, 60.0)
        assert [t.run_id for t in taken[:1]] == ["r2"] and len(taken) == 10  # lane order kept
        assert all(t.lane_rank == 1 for t in taken[1:])
        # A worker's backlog read counts from the same floors: the 991 runnable tasks, capped as asked.
        assert store.queued_depths("p", ["a"], 100_000) == {"a": 991}
        assert store.queued_depths("p", ["a"], 500) == {"a": 500}

        # What each claim's scan reads: the usual one walks the 19,000 dead entries, the floored one does not.
        conn = store.db.conn
        scan = ("SELECT id FROM tasks WHERE status = 'queued' AND crashes = 0 AND pipeline = 'p' AND stage = 'a' "
                "AND stage_version = 'v1' AND config_hash = 'cfg' {} AND available_at <= %s "
                "ORDER BY lane_rank, available_at LIMIT 10")
        floor = store.claim_floors.lanes("p", "a")[1]  # type: ignore[index]
        walked = _buffers(conn, scan.format(""), [now])
        skipped = _buffers(conn, scan.format("AND lane_rank = 1 AND available_at >= %s"), [floor, now])
        assert skipped * 20 < walked, (skipped, walked)

        # A task released below the floor (a worker drained) is claimed again once the floors are dropped.
        store.db.execute("UPDATE tasks SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL "
                         "WHERE id = ?", (first[0].id,))
        monkeypatch.setattr(claimfloors, "FLOOR_RESCAN_S", 0.0)
        rest = store.claim("p", ["a"], 5_000, "w1", now + 2, 60.0)
        assert first[0].id in {t.id for t in rest}


def test_with_an_old_snapshot_held_the_reclaim_scan_starts_from_its_floor(pg_url: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    with _held_snapshot(pg_url, 6_000, now) as store:
        leased = store.claim("p", ["a"], 6_000, "w1", now - 40, 10.0)  # leases that expired 30 s ago
        # 5,990 finish: their entries in tasks_leased stay, dead, below the 10 whose worker died.
        done = [t.id for t in leased[:5_990]]
        store.db.executemany("UPDATE tasks SET status = 'succeeded', lease_expires_at = NULL WHERE id = ?",
                             [(i,) for i in done])
        monkeypatch.setattr("conveyor.store.tasks.SLOW_CLAIM_S", 0.0)  # every scan counts as slow
        expired = store.expired_leases("p", now, limit=1000)
        assert sorted(e.id for e in expired) == sorted(t.id for t in leased[5_990:])
        assert store.reclaim_floors.floor("p") == now - FLOOR_MARGIN_S
        store.db.executemany("UPDATE tasks SET status = 'succeeded', lease_expires_at = NULL WHERE id = ?",
                             [(e.id,) for e in expired])
        # A lease taken after that scan expires above the floor and is found from it.
        with store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r2", ["late"], 1, now), TASK_KEY)
        late = store.claim("p", ["a"], 1, "w2", now, 5.0)
        assert [e.id for e in store.expired_leases("p", now + 10, limit=1000)] == [late[0].id]
        # A lease below the floor (written by a worker whose clock is far behind) waits for the rescan.
        store.db.execute("UPDATE tasks SET lease_expires_at = ? WHERE id = ?", (now - 60, late[0].id))
        assert store.expired_leases("p", now + 10, limit=1000) == []
        monkeypatch.setattr(claimfloors, "FLOOR_RESCAN_S", 0.0)
        assert [e.id for e in store.expired_leases("p", now + 10, limit=1000)] == [late[0].id]


def test_sqlite_claims_never_set_floors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"sqlite:///{tmp_path}/conveyor.db")
    try:
        now = time.time()
        with store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r1", ["a", "b"], 1, now - 1), TASK_KEY)
        monkeypatch.setattr("conveyor.store.tasks.SLOW_CLAIM_S", 0.0)
        assert len(store.claim("p", ["a"], 5, "w1", now, 60.0)) == 2
        assert store.claim_floors.lanes("p", "a") is None
        store.db.execute("UPDATE tasks SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL")
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_an_idle_worker_waits_for_the_next_task_due_later_not_one_due_already(store_url: str) -> None:
    """next_due: tasks due already wait on something else (a cap, backpressure); the answer is the first later."""
    store = open_store(store_url)
    try:
        now = time.time()
        with store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r1", ["due"], 1, now - 10), TASK_KEY)
        assert store.next_due("p", ["a"], now) is None
        with store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r1", ["later"], 0, now + 20), TASK_KEY)
            store.db.insert_many(INSERT_QUEUED, _queued("r2", ["retry"], 1, now + 30), TASK_KEY)
        store.db.execute("UPDATE tasks SET crashes = 1 WHERE item_key = 'retry'")
        assert store.next_due("p", ["a"], now) == pytest.approx(now + 20)
        assert store.next_due("p", ["a"], now, run_id="r2") == pytest.approx(now + 30)
        assert store.next_due("p", ["b"], now, run_id="r1") is None
        store.db.execute("UPDATE tasks SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL")
        store.recount_open_task_seconds()
    finally:
        store.close()
