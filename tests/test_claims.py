"""A claim of several stages takes, stage after stage, up to each stage's cap and what the stages before it left
of the limit; on PostgreSQL it is one statement (store/tasks.py ``_claim_stages``). Both backends."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from conveyor.store import open_store
from conveyor.store.dialect import PostgresDialect
from conveyor.store.tasks import INSERT_QUEUED, TASK_KEY

DECLARED = {"a": ("1", "h"), "b": ("1", "h"), "c": ("1", "h")}


def _queue(store: Any, run_id: str, stage: str, n: int, at: float, version: str = "1", lane: int = 0) -> None:
    rows = [(run_id, "p", stage, f"{run_id}-{stage}-{i:03d}", f"{run_id}-{stage}-{i:03d}", f"t-{run_id}{stage}{i}",
             version, "h", "d", "text", b"x", 1, 3, lane, at + i / 1000, at, 0) for i in range(n)]
    with store.db.transaction():
        store.db.insert_many(INSERT_QUEUED, rows, TASK_KEY)


def _count_claims(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The claim statements ``store`` sends from now on (until the test ends)."""
    statements: list[str] = []
    execute = store.db.execute

    def counted(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        if "UPDATE tasks SET status = 'running'" in " ".join(sql.split()):  # a claim, with its picks or not
            statements.append(sql)
        return execute(sql, params)

    monkeypatch.setattr(store.db, "execute", counted)
    return statements


@pytest.mark.parametrize("limit, caps, expected, one_by_one", [
    (12, {"c": 2, "b": 10, "a": 10}, {"c": 2, "b": 5, "a": 5}, 3),  # the limit cuts the last stage
    (40, None, {"c": 3, "b": 5, "a": 10}, 3),  # everything runnable
    (4, {"c": 0, "b": 10, "a": 10}, {"b": 4}, 1),  # a stage at its cap is skipped; the limit stops at the second
])
def test_a_claim_of_several_stages_takes_each_in_turn(store_url: str, limit: int, caps: dict[str, int] | None,
                                                      expected: dict[str, int], one_by_one: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``one_by_one``: the claim statements SQLite runs (a stage each, until the limit is met); PostgreSQL runs
    one."""
    store = open_store(store_url)
    try:
        now = time.time()
        for stage, n in (("a", 10), ("b", 5), ("c", 3)):
            _queue(store, "r1", stage, n, now - 10)
        _queue(store, "r1", "b", 4, now + 100, lane=0)  # not due yet
        _queue(store, "r2", "a", 4, now - 20)  # a paused run's tasks at the stage that calls models
        _queue(store, "r3", "c", 4, now - 20, version="0")  # made under another declaration of the stage
        statements = _count_claims(store, monkeypatch)
        claimed = store.claim("p", ["c", "b", "a"], limit, "w1", now, 60.0, caps=caps, paused=["r2"],
                              paused_stages={"a"}, declared=DECLARED)
        assert Counter(t.stage for t in claimed) == expected
        assert [t.stage for t in claimed] == sorted((t.stage for t in claimed), reverse=True)  # in stage order
        assert {t.run_id for t in claimed} == {"r1"} and len({t.id for t in claimed}) == len(claimed)
        # The oldest of each stage, each leased once and counted as an attempt.
        for stage, n in expected.items():
            keys = sorted(t.item_key for t in claimed if t.stage == stage)
            assert keys == [f"r1-{stage}-{i:03d}" for i in range(n)]
        leased = store.db.execute("SELECT COUNT(*) FROM tasks WHERE status = 'running' AND lease_owner = 'w1' "
                                  "AND attempts = 1 AND lease_token = 1")
        assert leased[0][0] == len(claimed)
        assert len(statements) == (1 if isinstance(store.db, PostgresDialect) else one_by_one), statements
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_two_claimers_of_several_stages_never_take_the_same_task(pg_url: str) -> None:
    """Each branch of the one-statement claim skips the rows another transaction holds."""
    first, second = open_store(pg_url), open_store(pg_url)
    try:
        now = time.time()
        for stage in ("a", "b", "c"):
            _queue(first, "r1", stage, 30, now - 10)
        with first.db.transaction():
            held = first.claim("p", ["c", "b", "a"], 45, "w1", now, 60.0, declared=DECLARED)
            other = second.claim("p", ["c", "b", "a"], 100, "w2", now, 60.0, declared=DECLARED)
        assert Counter(t.stage for t in held) == {"c": 30, "b": 15}
        assert Counter(t.stage for t in other) == {"b": 15, "a": 30}
        assert not {t.id for t in held} & {t.id for t in other}
        first.recount_open_task_seconds()
    finally:
        first.close()
        second.close()


def test_a_slow_claim_of_several_stages_sends_the_next_stage_by_stage(pg_url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Which stage made a one-statement claim slow is not known: the next claim runs a statement per stage, each
    timed on its own (a slow one engages its stage's floors, store/claimfloors.py), then claims are one statement
    again once no stage has floors."""
    from conveyor.store import claimfloors, tasks

    store = open_store(pg_url)
    try:
        now = time.time()
        for stage in ("a", "b", "c"):
            _queue(store, "r1", stage, 30, now - 10)
        statements = _count_claims(store, monkeypatch)
        monkeypatch.setattr(tasks, "SLOW_CLAIM_S", -1.0)  # every claim statement is slow
        assert len(store.claim("p", ["c", "b", "a"], 6, "w1", now, 60.0, declared=DECLARED)) == 6
        assert len(statements) == 1
        assert Counter(t.stage for t in store.claim("p", ["c", "b", "a"], 30, "w1", now, 60.0,
                                                    declared=DECLARED)) == {"c": 24, "b": 6}
        assert len(statements) == 3  # stage by stage: c, then b (the limit met)
        assert store.claim_floors.lanes("p", "c") is not None and store.claim_floors.lanes("p", "a") is None
        monkeypatch.setattr(tasks, "SLOW_CLAIM_S", claimfloors.SLOW_CLAIM_S)
        store.claim_floors.drop()
        assert Counter(t.stage for t in store.claim("p", ["c", "b", "a"], 50, "w1", now, 60.0,
                                                    declared=DECLARED)) == {"b": 24, "a": 26}
        assert len(statements) == 4
        store.recount_open_task_seconds()
    finally:
        store.close()


@pytest.mark.parametrize("limit", [13, 9, 30, 1])
def test_a_join_s_parents_share_the_room_left_in_equal_parts(store_url: str, limit: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``shares``: c and b (a join's parents) split what the claim has left when their turn comes; a takes the
    rest. PostgreSQL still sends one statement."""
    store = open_store(store_url)
    try:
        now = time.time()
        for stage, n in (("a", 10), ("b", 10), ("c", 10)):
            _queue(store, "r1", stage, n, now - 10)
        statements = _count_claims(store, monkeypatch)
        claimed = store.claim("p", ["c", "b", "a"], limit, "w1", now, 60.0, caps={"c": 10, "b": 10, "a": 3},
                              declared=DECLARED, shares=[frozenset({"b", "c"})])
        got = Counter(t.stage for t in claimed)
        assert got == _shared(limit)
        # The same tasks as the one-statement claim would take, stage after stage, in each stage's age order.
        for stage, n in got.items():
            assert sorted(t.item_key for t in claimed if t.stage == stage) == [f"r1-{stage}-{i:03d}" for i in range(n)]
        if isinstance(store.db, PostgresDialect):
            assert len(statements) == 1
        store.recount_open_task_seconds()
    finally:
        store.close()


def _shared(limit: int) -> Counter[str]:
    """What the shares give out of 10 c, 10 b and 10 a (a capped at 3): c half the room, b the rest, a what is left."""
    c = min(10, -(-limit // 2))
    b = min(10, limit - c)
    return Counter({k: v for k, v in {"c": c, "b": b, "a": min(3, limit - c - b)}.items() if v})
