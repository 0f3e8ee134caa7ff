"""Turn "this item now needs stage S with input X" into task rows.

Each new task is first looked up in the memo by its task key. A hit is
planned as already succeeded (cached) and its own successors are expanded
in turn, so re-running a finished run walks the whole graph with one
indexed lookup per task: no stage call, no blob read. Root items that
settled in an earlier run of the same graph skip even that: their rows are
copied (store/replay.py). Planning only reads; runtime/transitions.py writes.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from conveyor.pipeline import Pipeline, Stage
from conveyor.pipeline import params as run_params
from conveyor.runtime import provenance
from conveyor.runtime.lanes import LANE_RANKS
from conveyor.runtime.memo import StageMemo
from conveyor.runtime.values import Ref, parse_fanout
from conveyor.store import CHILD_MARK, NewItem, NewTasks, SqlStore
from conveyor.store.provenance import rows_for

# The input kind of a task whose item had no readable source: there is nothing to run again.
BAD_INPUT_KIND = "missing"


class Seed(NamedTuple):
    """An item that needs ``stage`` run on ``ref``."""

    run_id: str
    item_key: str
    root_key: str
    stage: str
    ref: Ref


def _key_prefix(pipeline: str, stage: Stage) -> bytes:
    return f"{pipeline}\0{stage.name}\0{stage.version}\0{stage.config_hash}\0".encode()


def task_key(pipeline: str, stage: Stage, ref: Ref, item_key: str, params: Mapping[str, Any] | None = None) -> str:
    """hash(pipeline, stage name, stage version, config hash, the run parameters it reads, input kind and
    digest): the memo key.

    Two items with the same content share the work of a map or fan-out stage; two pipelines never
    share anything, even a stage of the same name and version. A publish stage's effect belongs to
    its item, so its key names the item too. ``params``: the run's parameter values (conveyor.pipeline.params).
    """
    prefix = _key_prefix(pipeline, stage) + run_params.key_part(stage.params, params or {})
    return hashlib.sha256(prefix + _key_suffix(stage.kind == "publish", ref, item_key)).hexdigest()


def _key_suffix(publish: bool, ref: Ref, item_key: str) -> bytes:
    if publish:
        return f"{ref.kind}\0{ref.digest}\0{item_key}".encode()
    return f"{ref.kind}\0{ref.digest}".encode()


def child_key(parent_key: str, index: int) -> str:
    """``parent¶index``: root keys never contain the mark (service/inputs.py), so no root can take a
    child's key."""
    return f"{parent_key}{CHILD_MARK}{index}"


class _StagePlan(NamedTuple):
    """What planning needs of one stage, looked up once per pipeline instead of once per task."""

    prefix: bytes
    version: str
    config_hash: str
    fanout: bool
    publish: bool
    max_attempts: int
    children: tuple[str, ...]
    memo: StageMemo
    params: tuple[str, ...]  # the run parameters it reads: part of its key, so its prefix is per run


class Expander:
    """Creates tasks (and fan-out child items) inside the caller's transaction."""

    def __init__(self, pipeline: Pipeline, store: SqlStore) -> None:
        self.pipeline = pipeline
        self.store = store
        self._plans = {
            s.name: _StagePlan(_key_prefix(pipeline.name, s), s.version, s.config_hash, s.kind == "fanout",
                               s.kind == "publish", s.retry.max_attempts,
                               tuple(c.name for c in pipeline.children(s.name)), StageMemo(s), s.params)
            for s in pipeline
        }
        # run -> its parameter values, and stage -> key prefix with the values it reads (read once per run)
        self._run_params: dict[str, tuple[dict[str, Any], dict[str, bytes]]] = {}
        # (run, stage) -> tasks answered from outputs that other code made under the same stage version
        self.stale: Counter[tuple[str, str]] = Counter()
        self._roots = [s.name for s in pipeline.roots]
        self._lane_ranks: dict[str, int] = {}
        self._bases: dict[str, str | None] = {}  # run -> the earlier run its settled items are copied from
        self.has_fanout = any(s.kind == "fanout" for s in pipeline)
        self._provenance_bases: dict[str, bool] = {}

    @property
    def memos(self) -> dict[str, StageMemo]:
        """Each stage's view of memo hits (code fingerprint, guards), by stage name."""
        return {name: plan.memo for name, plan in self._plans.items()}

    def take_stale(self) -> Counter[tuple[str, str]]:
        """The stale memo answers planned since the last call, by (run, stage)."""
        stale, self.stale = self.stale, Counter()
        return stale

    def set_lane(self, run_id: str, lane: str) -> None:
        """Tasks of ``run_id`` are claimed in ``lane`` (interactive before bulk)."""
        _bound(self._lane_ranks, self._bases, self._provenance_bases, self._run_params)
        self._lane_ranks[run_id] = LANE_RANKS[lane]

    def lane_rank(self, run_id: str) -> int:
        rank = self._lane_ranks.get(run_id)
        if rank is None:
            _bound(self._lane_ranks, self._bases, self._provenance_bases, self._run_params)
            run = self.store.get_run(run_id)
            rank = self._lane_ranks[run_id] = LANE_RANKS.get(run.lane if run else "bulk", 1)
        return rank

    def set_params(self, run_id: str, values: Mapping[str, Any]) -> None:
        """``run_id``'s parameter values, known already (its submission, a dry run): not read from the store."""
        _bound(self._lane_ranks, self._bases, self._provenance_bases, self._run_params)
        self._run_params[run_id] = (dict(values), {name: p.prefix + run_params.key_part(p.params, values)
                                                   for name, p in self._plans.items()})

    def run_params(self, run_id: str) -> dict[str, Any]:
        """The parameter values ``run_id`` was submitted with (as recorded: never this process's environment)."""
        if run_id not in self._run_params:
            run = self.store.get_run(run_id)
            self.set_params(run_id, run_params.decode(run.params if run else None))
        return self._run_params[run_id][0]

    def prefix(self, run_id: str, stage: str) -> bytes:
        """The key prefix of ``stage``'s tasks in ``run_id``: with the values of the parameters it reads."""
        plan = self._plans[stage]
        if not plan.params:
            return plan.prefix
        if run_id not in self._run_params:
            self.run_params(run_id)
        return self._run_params[run_id][1][stage]

    def key_of(self, run_id: str, stage: str, ref: Ref, item_key: str) -> str:
        """The task key this declaration makes for ``stage`` on ``ref`` in ``run_id``."""
        return hashlib.sha256(self.prefix(run_id, stage) + _key_suffix(self._plans[stage].publish, ref, item_key)
                              ).hexdigest()

    def roots(self, run_id: str, item_key: str, source: Ref) -> list[Seed]:
        return [Seed(run_id, item_key, item_key, name, source) for name in self._roots]

    def successors(self, seed: Seed, output: Ref, now: float) -> tuple[list[Seed], list[NewItem]]:
        """The seeds that follow ``seed``'s stage having produced ``output``."""
        plan = self._plans[seed.stage]
        if not plan.fanout:
            run_id, item_key, root_key = seed.run_id, seed.item_key, seed.root_key
            return [Seed(run_id, item_key, root_key, c, output) for c in plan.children], []
        assert output.inline is not None, "fan-out reference lists are always stored inline"
        seeds: list[Seed] = []
        items: list[NewItem] = []
        for index, element in enumerate(parse_fanout(output.inline)):
            key = child_key(seed.item_key, index)
            items.append(NewItem(seed.run_id, key, seed.item_key, seed.root_key, element.digest, element.size, now))
            seeds.extend(Seed(seed.run_id, key, seed.root_key, c, element) for c in plan.children)
        return seeds, items

    def refuse_bad(self, tasks: NewTasks, run_id: str, bad: Sequence[tuple[str, str]], now: float) -> None:
        """Root task rows, failed with ``bad_input``, for items (key, why) whose source could not be read."""
        rank = self.lane_rank(run_id)
        for key, why in bad:
            digest = hashlib.sha256(f"bad_input\0{key}\0{why}".encode()).hexdigest()
            for name in self._roots:
                p = self._plans[name]
                tasks.bad.append((run_id, self.pipeline.name, name, key, key, digest, p.version, p.config_hash,
                                  digest, BAD_INPUT_KIND, 0, "bad_input", why, p.max_attempts, rank, now, now, now))

    def without_base(self, run_id: str) -> None:
        """``run_id`` copies no settled items from an earlier run (an API job: its memo lookups answer instead,
        and finding the base would cost its creation three round trips)."""
        _bound(self._lane_ranks, self._bases, self._provenance_bases, self._run_params)
        self._bases[run_id] = None

    def replay_base(self, run_id: str) -> str | None:
        """The earlier run whose settled items a run may copy (store/replay.py), looked up once per run."""
        if run_id not in self._bases:
            _bound(self._lane_ranks, self._bases, self._provenance_bases, self._run_params)
            run = self.store.get_run(run_id)
            self._bases[run_id] = self.store.replay_base(run.pipeline, run.stages, run_id) if run else None
        return self._bases[run_id]

    def base_has_provenance(self, base: str) -> bool:
        """Whether a run copied from holds provenance rows to copy with its tasks (asked once per base run)."""
        if base not in self._provenance_bases:
            self._provenance_bases[base] = self.store.has_provenance(base)
        return self._provenance_bases[base]

    def plan(
        self, seeds: Sequence[Seed], now: float, items: Sequence[NewItem] = (),
    ) -> tuple[NewTasks, list[NewItem], int]:
        """The task and item rows for ``seeds``, following memo hits; reads only, so it may run
        before the transaction that writes them. Returns (tasks, items, cached count).

        This runs once per task of a run (and of every cached re-run), so per-stage constants
        come from ``_plans`` and each row is one plain tuple in its shape's column order (NewTasks).
        """
        tasks = NewTasks()
        queued, answered, refused = tasks.queued, tasks.cached, tasks.failed
        new_items, frontier, cached = list(items), list(seeds), 0
        plans, pipeline, sha256, ranks = self._plans, self.pipeline.name, hashlib.sha256, self._lane_ranks
        while frontier:
            keys = []
            for run_id, item_key, _, stage, ref in frontier:
                p = plans[stage]
                prefix = self.prefix(run_id, stage) if p.params else p.prefix
                keys.append(sha256(prefix + _key_suffix(p.publish, ref, item_key)).hexdigest())
            memo = self.store.memo_rows(keys)
            next_frontier: list[Seed] = []
            for seed, key in zip(frontier, keys, strict=True):
                run_id, item_key, root_key, stage, ref = seed
                p = plans[stage]
                rank = ranks[run_id] if run_id in ranks else self.lane_rank(run_id)
                hit = memo.get(key)
                failure = None
                if hit is not None and hit[1] == "failed" and (failure := p.memo.failure(hit[3])) is None:
                    hit = None  # a refusal whose guard changed is no answer: run it again
                if hit is None:
                    queued.append((run_id, pipeline, stage, item_key, root_key, key, p.version, p.config_hash,
                                   ref.digest, ref.kind, ref.inline, ref.size, p.max_attempts, rank, now, now))
                    continue
                cached += 1
                _, kind, digest, inline, size, code, made_by = hit
                if code is not None and code != p.memo.code:
                    self.stale[run_id, stage] += 1
                if made_by is not None:  # the answer is the output of a call with a provenance: the task has it
                    tasks.provenance += rows_for(run_id, root_key, item_key, stage, provenance.decode(made_by) or {})
                if failure is not None:
                    # A memoised refusal keeps its input: `conveyor requeue` may run it again.
                    refused.append((run_id, pipeline, stage, item_key, root_key, key, p.version, p.config_hash,
                                    ref.digest, ref.kind, ref.inline, ref.size, failure.error_class, failure.message,
                                    p.max_attempts, rank, now, now, now))
                    continue
                # A task answered from the memo never runs, so its row needs no copy of the input.
                answered.append((run_id, pipeline, stage, item_key, root_key, key, p.version, p.config_hash,
                                 ref.digest, ref.kind, ref.size, digest, kind, p.max_attempts, rank, now, now, now))
                if not p.children:
                    continue
                output = Ref(kind, digest, size, inline)
                if p.fanout:
                    more, more_items = self.successors(seed, output, now)
                    next_frontier += more
                    new_items += more_items
                else:
                    next_frontier += [Seed(run_id, item_key, root_key, c, output) for c in p.children]
            frontier = next_frontier
        return tasks, new_items, cached


RUNS_REMEMBERED = 10_000  # per-run facts a long-lived worker keeps; the API makes a run per job


def _bound(*caches: dict[str, Any]) -> None:
    """Forget what is kept per run once a cache holds RUNS_REMEMBERED of them: each fact is read again from the
    store when a run comes back, so a worker that serves millions of jobs keeps its memory bounded."""
    for cache in caches:
        if len(cache) >= RUNS_REMEMBERED:
            cache.clear()
