"""Turn "this item now needs stage S with input X" into task rows.

Each new task is first looked up in the memo by its task key. A hit is
inserted as already succeeded (cached) and its own successors are expanded
in turn, so re-running a finished run walks the whole graph with one
indexed lookup per task: no stage call, no blob read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.pipeline import Pipeline, Stage
from conveyor.runtime.values import Ref, parse_fanout
from conveyor.store import NewItem, NewTask, SqlStore, StoredOutput


@dataclass(frozen=True, slots=True)
class Seed:
    """An item that needs ``stage`` run on ``ref``."""

    run_id: str
    item_key: str
    root_key: str
    stage: str
    ref: Ref


def task_key(stage: Stage, ref: Ref) -> str:
    """hash(stage name, stage version, config hash, input kind and digest): the memo key."""
    text = f"{stage.name}\0{stage.version}\0{stage.config_hash}\0{ref.kind}\0{ref.digest}"
    return hashlib.sha256(text.encode()).hexdigest()


def idempotency_key(pipeline: str, item_key: str, stage: str, input_digest: str) -> str:
    """Stable for this item, stage and input across every redelivery and restart."""
    return hashlib.sha256(f"{pipeline}\0{item_key}\0{stage}\0{input_digest}".encode()).hexdigest()[:32]


def child_key(parent_key: str, index: int) -> str:
    return f"{parent_key}#{index}"


class Expander:
    """Creates tasks (and fan-out child items) inside the caller's transaction."""

    def __init__(self, pipeline: Pipeline, store: SqlStore) -> None:
        self.pipeline = pipeline
        self.store = store

    def roots(self, run_id: str, item_key: str, source: Ref) -> list[Seed]:
        return [Seed(run_id, item_key, item_key, s.name, source) for s in self.pipeline.roots]

    def successors(self, seed: Seed, output: Ref) -> tuple[list[Seed], list[NewItem]]:
        """The seeds that follow ``seed``'s stage having produced ``output``."""
        stage = self.pipeline[seed.stage]
        children = self.pipeline.children(stage.name)
        if stage.kind != "fanout":
            return [Seed(seed.run_id, seed.item_key, seed.root_key, c.name, output) for c in children], []
        assert output.inline is not None, "fan-out reference lists are always stored inline"
        seeds, items = [], []
        for index, element in enumerate(parse_fanout(output.inline)):
            key = child_key(seed.item_key, index)
            items.append(NewItem(seed.run_id, key, seed.item_key, seed.root_key, element.digest, element.size))
            seeds.extend(Seed(seed.run_id, key, seed.root_key, c.name, element) for c in children)
        return seeds, items

    def expand(self, seeds: Sequence[Seed], now: float, items: Sequence[NewItem] = ()) -> int:
        """Insert tasks for ``seeds`` and, through memo hits, their successors; return cached count."""
        cached = 0
        frontier, pending_items = list(seeds), list(items)
        while frontier or pending_items:
            keys = [task_key(self.pipeline[s.stage], s.ref) for s in frontier]
            memo = self.store.lookup_outputs(keys) if frontier else {}
            tasks, next_frontier = [], []
            for seed, key in zip(frontier, keys, strict=True):
                hit = memo.get(key)
                tasks.append(self._task(seed, key, hit))
                if hit is not None:
                    cached += 1
                    more, new_items = self.successors(seed, _ref(hit))
                    next_frontier.extend(more)
                    pending_items.extend(new_items)
            if pending_items:
                self.store.insert_items(pending_items, now)
                pending_items = []
            if tasks:
                self.store.insert_tasks(tasks, now)
            frontier = next_frontier
        return cached

    def _task(self, seed: Seed, key: str, hit: StoredOutput | None) -> NewTask:
        stage = self.pipeline[seed.stage]
        return NewTask(
            run_id=seed.run_id, pipeline=self.pipeline.name, stage=stage.name, item_key=seed.item_key,
            root_key=seed.root_key, task_key=key, stage_version=stage.version, config_hash=stage.config_hash,
            input_digest=seed.ref.digest, input_kind=seed.ref.kind, input_inline=seed.ref.inline,
            input_size=seed.ref.size, max_attempts=stage.retry.max_attempts,
            status="succeeded" if hit else "queued", cached=hit is not None,
            output_digest=hit.digest if hit else None, output_kind=hit.kind if hit else None,
        )


def _ref(output: StoredOutput) -> Ref:
    return Ref(output.kind, output.digest, output.size, output.inline)
