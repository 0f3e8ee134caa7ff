"""Turn "this item now needs stage S with input X" into task rows.

Each new task is first looked up in the memo by its task key. A hit is
inserted as already succeeded (cached) and its own successors are expanded
in turn, so re-running a finished run walks the whole graph with one
indexed lookup per task: no stage call, no blob read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

from conveyor.pipeline import Pipeline, Stage
from conveyor.runtime.values import Ref, parse_failure_memo, parse_fanout
from conveyor.store import NewItem, NewTask, SqlStore


class Seed(NamedTuple):
    """An item that needs ``stage`` run on ``ref``."""

    run_id: str
    item_key: str
    root_key: str
    stage: str
    ref: Ref


def _key_prefix(stage: Stage) -> bytes:
    return f"{stage.name}\0{stage.version}\0{stage.config_hash}\0".encode()


def task_key(stage: Stage, ref: Ref, item_key: str) -> str:
    """hash(stage name, stage version, config hash, input kind and digest): the memo key.

    Two items with the same content share the work of a map or fan-out stage.
    A publish stage's effect belongs to its item, so its key names the item too.
    """
    return hashlib.sha256(_key_prefix(stage) + _key_suffix(stage.kind, ref, item_key)).hexdigest()


def _key_suffix(kind: str, ref: Ref, item_key: str) -> bytes:
    if kind == "publish":
        return f"{ref.kind}\0{ref.digest}\0{item_key}".encode()
    return f"{ref.kind}\0{ref.digest}".encode()


def child_key(parent_key: str, index: int) -> str:
    return f"{parent_key}#{index}"


class Expander:
    """Creates tasks (and fan-out child items) inside the caller's transaction."""

    def __init__(self, pipeline: Pipeline, store: SqlStore) -> None:
        self.pipeline = pipeline
        self.store = store
        self._stages = {s.name: s for s in pipeline}
        self._prefix = {s.name: _key_prefix(s) for s in pipeline}
        self._kinds = {s.name: s.kind for s in pipeline}
        self._next = {s.name: [c.name for c in pipeline.children(s.name)] for s in pipeline}
        self._roots = [s.name for s in pipeline.roots]

    def roots(self, run_id: str, item_key: str, source: Ref) -> list[Seed]:
        return [Seed(run_id, item_key, item_key, name, source) for name in self._roots]

    def successors(self, seed: Seed, output: Ref, now: float) -> tuple[list[Seed], list[NewItem]]:
        """The seeds that follow ``seed``'s stage having produced ``output``."""
        children = self._next[seed.stage]
        if self._stages[seed.stage].kind != "fanout":
            run_id, item_key, root_key = seed.run_id, seed.item_key, seed.root_key
            return [Seed(run_id, item_key, root_key, c, output) for c in children], []
        assert output.inline is not None, "fan-out reference lists are always stored inline"
        seeds: list[Seed] = []
        items: list[NewItem] = []
        for index, element in enumerate(parse_fanout(output.inline)):
            key = child_key(seed.item_key, index)
            items.append(NewItem(seed.run_id, key, seed.item_key, seed.root_key, element.digest, element.size, now))
            seeds.extend(Seed(seed.run_id, key, seed.root_key, c, element) for c in children)
        return seeds, items

    def expand(self, seeds: Sequence[Seed], now: float, items: Sequence[NewItem] = ()) -> int:
        """Insert tasks for ``seeds`` and, through memo hits, their successors; return cached count."""
        tasks, new_items, cached = self.plan(seeds, now, items)
        with self.store.transaction():
            if new_items:
                self.store.insert_items(new_items)
            if tasks:
                self.store.insert_tasks(tasks)
        return cached

    def plan(
        self, seeds: Sequence[Seed], now: float, items: Sequence[NewItem] = (),
    ) -> tuple[list[NewTask], list[NewItem], int]:
        """The task and item rows for ``seeds``, following memo hits; reads only, so it may run
        before the transaction that writes them. Returns (tasks, items, cached count)."""
        tasks: list[NewTask] = []
        new_items, frontier, cached = list(items), list(seeds), 0
        prefix, kinds, sha256 = self._prefix, self._kinds, hashlib.sha256
        while frontier:
            keys = [sha256(prefix[s.stage] + _key_suffix(kinds[s.stage], s.ref, s.item_key)).hexdigest()
                    for s in frontier]
            memo = self.store.lookup_outputs(keys)
            next_frontier: list[Seed] = []
            for seed, key in zip(frontier, keys, strict=True):
                hit = memo.get(key)
                tasks.append(self._task(seed, key, hit, now))
                if hit is not None:
                    cached += 1
                    if hit.kind == "failed":
                        continue
                    more, more_items = self.successors(seed, Ref(hit.kind, hit.digest, hit.size, hit.inline), now)
                    next_frontier += more
                    new_items += more_items
            frontier = next_frontier
        return tasks, new_items, cached

    def _task(self, seed: Seed, key: str, hit: tuple[str, str, str, str, bytes | None, int] | None,
              now: float) -> NewTask:
        stage, ref = self._stages[seed.stage], seed.ref
        if hit is None:
            return NewTask(seed.run_id, self.pipeline.name, stage.name, seed.item_key, seed.root_key, "queued", key,
                           stage.version, stage.config_hash, ref.digest, ref.kind, ref.inline, ref.size, None, None,
                           0, stage.retry.max_attempts, now, now, None)
        # A task answered from the memo never runs, so its row needs no copy of the input; a
        # memoised failure keeps it, since `conveyor requeue` may run it again.
        if hit[2] == "failed":
            error_class, message = parse_failure_memo(hit[4] or b"{}")
            return NewTask(seed.run_id, self.pipeline.name, stage.name, seed.item_key, seed.root_key, "failed", key,
                           stage.version, stage.config_hash, ref.digest, ref.kind, ref.inline, ref.size, None, None,
                           1, stage.retry.max_attempts, now, now, now, error_class, message)
        return NewTask(seed.run_id, self.pipeline.name, stage.name, seed.item_key, seed.root_key, "succeeded", key,
                       stage.version, stage.config_hash, ref.digest, ref.kind, None, ref.size, hit[3], hit[2],
                       1, stage.retry.max_attempts, now, now, now)
