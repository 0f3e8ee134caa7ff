"""Turn "this item now needs stage S with input X" into task rows.

Each new task is first looked up in the memo by its task key. A hit is
planned as already succeeded (cached) and its own successors are expanded
in turn, so re-running a finished run walks the whole graph with one
indexed lookup per task: no stage call, no blob read. Root items that
settled in an earlier run of the same graph skip even that: their rows are
copied (store/replay.py). Planning only reads; runtime/transitions.py writes.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from conveyor.pipeline import Pipeline, Stage
from conveyor.pipeline import params as run_params
from conveyor.pipeline.graph import GROUP_KINDS
from conveyor.runtime import provenance
from conveyor.runtime.lanes import LANE_RANKS
from conveyor.runtime.memo import StageMemo
from conveyor.runtime.values import PARTS, Ref, parse_fanout, parts_bytes, parts_ref
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
    siblings: int = 0  # on a fan-out child's item: how many children its parent's fan-out made (0: none known)


class Arrival(NamedTuple):
    """A stage that a join or a gather waits on settled: ``parent`` of ``item_key`` (a join's item, or for a
    gather the child ``child``) succeeded with ``ref``, or ended without an output (``ended``: its error class).
    ``stage`` is the join or gather, ``item_key`` the item it runs on. ``siblings``: how many children the fan-out
    of the item the parent ran on made (a gather's: how many children it waits for; 0: not known here)."""

    run_id: str
    item_key: str
    root_key: str
    stage: str
    parent: str
    ref: Ref | None
    child: str | None = None
    ended: str | None = None
    siblings: int = 0


class Fanned(NamedTuple):
    """A fan-out stage made no child of ``item_key``: its gathers are ready at once (when it made some, their
    arrivals carry the count)."""

    run_id: str
    item_key: str
    root_key: str
    fanout: str


Planned = Seed | Arrival | Fanned
QUEUED = "queued"  # a task planned to run: what waits on it is not ready


class Pending(NamedTuple):
    """A join or gather whose readiness depends on tasks settled before this plan: decided in the transaction
    that writes the plan (runtime/transitions/readiness.py), with the item locked."""

    run_id: str
    item_key: str
    root_key: str
    stage: str


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
    children: tuple[str, ...]  # the stages that run on its output alone (joins and gathers wait: see below)
    memo: StageMemo
    params: tuple[str, ...]  # the run parameters it reads: part of its key, so its prefix is per run
    joins: tuple[str, ...] = ()  # joins it is a parent of
    gathers: tuple[str, ...] = ()  # gathers it is the gathered stage of (its success settles a child)
    settles: tuple[str, ...] = ()  # gathers on whose path it lies (its ending settles a child)
    fanned: tuple[str, ...] = ()  # a fan-out: the gathers of its children


class Expander:
    """Creates tasks (and fan-out child items) inside the caller's transaction."""

    def __init__(self, pipeline: Pipeline, store: SqlStore) -> None:
        self.pipeline = pipeline
        self.store = store
        graph = pipeline.graph
        self.gathers = dict(graph.gathers)
        self._plans = {s.name: _stage_plan(pipeline, s) for s in pipeline}
        self.has_barriers = bool(graph.joins or graph.gathers)
        # The parents of each join, in declared order
        self.join_parents = {j: tuple(pipeline[j].parents) for j in graph.joins}
        # Parents of a join at the same depth, made together: a claim gives them equal shares of the room it has
        # left when their turn comes (SqlStore.claim's shares). A claim takes a stage's tasks in age order, so
        # they are claimed for the same items, settle in one commit, and its plan decides their join with no
        # read in the transaction (claimed one stage after the other, the first took the whole room).
        self.join_shares = tuple(frozenset(ps) for ps in {
            tuple(sorted(p for p in parents if pipeline.depth(p) == depth))
            for parents in self.join_parents.values() for depth in {pipeline.depth(p) for p in parents}}
            if len(ps) > 1)
        self._pending: list[Pending] = []
        # run -> its parameter values, and stage -> key prefix with the values it reads (read once per run)
        self._run_params: dict[str, tuple[dict[str, Any], dict[str, bytes]]] = {}
        # (run, stage) -> tasks answered from outputs that other code made under the same stage version
        self.stale: Counter[tuple[str, str]] = Counter()
        self._roots = [s.name for s in pipeline.roots]
        self._lane_ranks: dict[str, int] = {}
        self._bases: dict[str, str | None] = {}  # run -> the earlier run its settled items are copied from
        self.has_fanout = any(s.kind == "fanout" for s in pipeline)
        # stage -> the stages that run on its output, for a stage whose output goes nowhere else (no fan-out, join
        # or gather): what ``successors`` would plan, as a commit's hot loop asks it once per success.
        self.children: dict[str, tuple[str, ...]] = {
            name: p.children for name, p in self._plans.items() if not (p.fanout or p.joins or p.gathers)}
        self.fanouts = frozenset(name for name, p in self._plans.items() if p.fanout)
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

    def successors(self, seed: Seed, output: Ref, now: float) -> tuple[list[Planned], list[NewItem]]:
        """What follows ``seed``'s stage having produced ``output``: seeds of the stages that run on it, and
        arrivals at the joins and gathers that wait on it (``plan`` decides whether they are ready)."""
        plan = self._plans[seed.stage]
        run_id, item_key, root_key = seed.run_id, seed.item_key, seed.root_key
        if not plan.fanout:
            return self.follow(run_id, item_key, root_key, seed.stage, output, seed.siblings), []
        assert output.inline is not None, "fan-out reference lists are always stored inline"
        seeds: list[Planned] = []
        items: list[NewItem] = []
        elements = parse_fanout(output.inline)
        count = len(elements)  # each child's tasks carry it: a gather is decided from it (see _decide)
        for index, element in enumerate(elements):
            key = child_key(item_key, index)
            items.append(NewItem(run_id, key, item_key, root_key, element.digest, element.size, now))
            seeds.extend(Seed(run_id, key, root_key, c, element, count) for c in plan.children)
            seeds.extend(Arrival(run_id, key, root_key, j, seed.stage, element, siblings=count) for j in plan.joins)
        if not elements and plan.fanned:  # no child will arrive at its gathers: they are ready now
            seeds.append(Fanned(run_id, item_key, root_key, seed.stage))
        return seeds, items

    def follow(self, run_id: str, item_key: str, root_key: str, stage: str, output: Ref, siblings: int
               ) -> list[Planned]:
        """``successors`` of a stage that is not a fan-out (a commit's hot loop calls it once per such success)."""
        plan = self._plans[stage]
        seeds: list[Planned] = ([Seed(run_id, item_key, root_key, c, output, siblings) for c in plan.children]
                                if plan.children else [])
        for j in plan.joins:  # inline: once per parent's success
            seeds.append(Arrival(run_id, item_key, root_key, j, stage, output, None, None, siblings))
        if plan.gathers:
            parent = item_key.rpartition(CHILD_MARK)[0]
            for g in plan.gathers:
                seeds.append(Arrival(run_id, parent, root_key, g, stage, output, item_key, None, siblings))
        return seeds

    def ended(self, run_id: str, item_key: str, root_key: str, stage: str, error_class: str,
              siblings: int = 0) -> list[Planned]:
        """Arrivals at the gathers whose children ``stage`` ending on ``item_key`` settles (a task that failed,
        was rejected or dead-lettered there); nothing for a stage on no gather's path. ``siblings``: the task's
        (see Seed)."""
        gathers = self._plans[stage].settles if stage in self._plans else ()
        if not gathers:
            return []
        parent = item_key.rpartition(CHILD_MARK)[0]
        return [Arrival(run_id, parent, root_key, g, stage, None, item_key, error_class, siblings) for g in gathers]

    def take_pending(self) -> list[Pending]:
        """The joins and gathers the last plans could not decide alone (see Pending)."""
        pending, self._pending = self._pending, []
        return pending

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
        self, seeds: Sequence[Planned], now: float, items: Sequence[NewItem] = (),
    ) -> tuple[NewTasks, list[NewItem], int]:
        """The task and item rows for ``seeds``, following memo hits; reads only, so it may run
        before the transaction that writes them. Returns (tasks, items, cached count).

        Arrivals at joins and gathers (from ``successors`` and ``ended``) are decided here when this plan
        knows every task they wait on; the others are left for the writing transaction (``take_pending``).

        This runs once per task of a run (and of every cached re-run), so per-stage constants
        come from ``_plans`` and each row is one plain tuple in its shape's column order (NewTasks).
        """
        tasks = NewTasks()
        new_items, cached = list(items), 0
        frontier = [s for s in seeds if type(s) is Seed]
        barriers: list[Planned] = [s for s in seeds if type(s) is not Seed]
        known: dict[tuple[str, str, str], Any] | None = {} if self.has_barriers else None
        while frontier or barriers:
            while frontier:
                frontier, more = self._plan_round(frontier, tasks, new_items, now)
                cached += more[0]
                barriers += more[1]
            if barriers:
                assert known is not None
                frontier = self._decide(barriers, known, tasks, now)
                barriers = []
        return tasks, new_items, cached

    def _plan_round(self, frontier: list[Seed], tasks: NewTasks, new_items: list[NewItem], now: float
                    ) -> tuple[list[Seed], tuple[int, list[Planned]]]:
        """One breadth of the plan: the memo lookups of ``frontier``, its rows, and what follows its hits."""
        queued, answered, refused = tasks.queued, tasks.cached, tasks.failed
        plans, pipeline, sha256, ranks = self._plans, self.pipeline.name, hashlib.sha256, self._lane_ranks
        cached = 0
        barriers: list[Planned] = []
        keys = []
        for run_id, item_key, _, stage, ref, _ in frontier:
            p = plans[stage]
            prefix = self.prefix(run_id, stage) if p.params else p.prefix
            keys.append(sha256(prefix + _key_suffix(p.publish, ref, item_key)).hexdigest())
        memo = self.store.memo_rows(keys)
        next_frontier: list[Seed] = []
        for seed, key in zip(frontier, keys, strict=True):
            run_id, item_key, root_key, stage, ref, siblings = seed
            p = plans[stage]
            rank = ranks[run_id] if run_id in ranks else self.lane_rank(run_id)
            hit = memo.get(key)
            failure = None
            if hit is not None and hit[1] == "failed" and (failure := p.memo.failure(hit[3])) is None:
                hit = None  # a refusal whose guard changed is no answer: run it again
            if hit is None:
                queued.append((run_id, pipeline, stage, item_key, root_key, key, p.version, p.config_hash,
                               ref.digest, ref.kind, ref.inline, ref.size, p.max_attempts, rank, now, now, siblings))
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
                                p.max_attempts, rank, now, now, now, siblings))
                if p.settles:
                    barriers += self.ended(run_id, item_key, root_key, stage, failure.error_class, siblings)
                continue
            # A task answered from the memo never runs, so its row needs no copy of the input.
            answered.append((run_id, pipeline, stage, item_key, root_key, key, p.version, p.config_hash,
                             ref.digest, ref.kind, ref.size, digest, kind, p.max_attempts, rank, now, now, now,
                             siblings))
            if not (p.children or p.joins or p.gathers or p.fanned):
                continue
            output = Ref(kind, digest, size, inline)
            if p.fanout or p.joins or p.gathers:
                more, more_items = self.successors(seed, output, now)
                for planned in more:
                    if type(planned) is Seed:
                        next_frontier.append(planned)
                    else:
                        barriers.append(planned)
                new_items += more_items
            else:
                next_frontier += [Seed(run_id, item_key, root_key, c, output, siblings) for c in p.children]
        return next_frontier, (cached, barriers)

    def _decide(self, barriers: list[Planned], known: dict[tuple[str, str, str], Any],
                tasks: NewTasks, now: float) -> list[Seed]:
        """The joins and gathers ``barriers`` arrived at that this plan can decide: seeds of those ready, a failed
        row for a gather that fails on its children; the rest are pending (decided in the transaction).

        A gather knows how many children it waits for from its arrivals: every task of a child carries the count
        (Seed.siblings), so a commit that settles every child of a parent (siblings are claimed and committed
        together, mostly) decides its gather without reading the run; a fan-out that made no child says so
        (Fanned), and its gathers are ready at once.

        This runs once per arrival of every join and gather, so the common case (every parent or child succeeded,
        and this plan knows it) is inline: the parts' bytes formatted straight from their references."""
        targets: dict[tuple[str, str, str], tuple[str, int]] = {}  # -> (root key, siblings), in arrival order
        counts: dict[tuple[str, str, str], int] = {}  # a gather -> its children, as its arrivals say (-1: disagree)
        childless: set[tuple[str, str, str]] = set()  # gathers whose fan-out made no child (Fanned)
        for b in barriers:
            if type(b) is Arrival:
                run_id, item_key, root_key, stage, parent, ref, child, ended, siblings = b
                if child is None:  # a join runs on the item its parents ran on: its task carries their count
                    known[run_id, item_key, parent] = ref if ended is None else Ended(ended)
                    targets[run_id, item_key, stage] = (root_key, siblings)
                    continue
                known[run_id, child, parent] = ref if ended is None else Ended(ended)
                target = (run_id, item_key, stage)
                targets[target] = (root_key, 0)  # a gather's own item: its count is not its children's
                counts[target] = siblings if counts.get(target, siblings) == siblings else -1
                continue
            assert type(b) is Fanned  # no child will ever arrive: its gathers are ready now
            for g in self._plans[b.fanout].fanned:
                targets[b.run_id, b.item_key, g] = (b.root_key, 0)
                childless.add((b.run_id, b.item_key, g))
        ready: list[Seed] = []
        joins, get, sha256 = self.join_parents, known.get, hashlib.sha256
        queued: set[tuple[str, str, str]] | None = None

        def state(run_id: str, item: str, at: str) -> Any:
            """What this plan knows of ``item``'s task at ``at``: its output, Ended, QUEUED (planned to run by this
            plan), or None (settled or open before it: the transaction reads it)."""
            nonlocal queued
            known_here = get((run_id, item, at))
            if known_here is None:
                if queued is None:  # asked only when the inline cases below cannot decide: the plan's rows, once
                    queued = {(row[0], row[3], row[2]) for row in tasks.queued}
                if (run_id, item, at) in queued:
                    return QUEUED
            return known_here

        for target, (root_key, siblings) in targets.items():
            run_id, item_key, stage = target
            parents, count = joins.get(stage), None
            parts: list[Any] | None = None
            if parents is not None:  # a join: its parents' outputs, in declared order
                parts = [get((run_id, item_key, parent)) for parent in parents]
            else:  # a gather: its children's, in child order, once their count is known
                gather = self.gathers[stage]
                count = 0 if target in childless else counts[target] if counts.get(target, 0) > 0 else None
                if count is not None:
                    at = gather.stage
                    parts = [get((run_id, f"{item_key}{CHILD_MARK}{i}", at)) for i in range(count)]
            if parts is not None:
                for r in parts:  # every one succeeded, the common case, inline (see joined and gathered)
                    if type(r) is not Ref:
                        break
                else:
                    data = parts_bytes(parts)
                    ready.append(Seed(run_id, item_key, root_key, stage,
                                      Ref(PARTS, sha256(data).hexdigest(), len(data), data), siblings))
                    continue
            verdict: Verdict | None = None
            if parents is not None:
                verdict = self.joined(stage, functools.partial(state, run_id, item_key))
            elif count is not None:
                verdict = self.gathered(stage, item_key, count, functools.partial(state, run_id))
            if verdict is None:
                self._pending.append(Pending(run_id, item_key, root_key, stage))
            elif verdict is not WAIT:
                self.barrier_rows(Pending(run_id, item_key, root_key, stage), verdict, tasks, ready, now, siblings)
        return ready

    def joined(self, stage: str, state: Callable[[str], Any]) -> Verdict | None:
        """A join's verdict from its parents' states (a Ref: succeeded; QUEUED or an Ended: not to run now;
        None: not known here): its input, WAIT, or None when some state is not known."""
        refs = [state(parent) for parent in self.join_parents[stage]]
        if all(isinstance(r, Ref) for r in refs):
            return Verdict(refs, [], None)
        if any(r is not None for r in refs if not isinstance(r, Ref)):
            return WAIT
        return None

    def gathered(self, stage: str, parent_key: str, count: int, state: Callable[[str, str], Any]
                 ) -> Verdict | None:
        """A gather's verdict from its ``count`` children's states at the stages of its path (as ``joined``)."""
        gather = self.gathers[stage]
        parts: list[Ref] = []
        lost: list[tuple[str, str]] = []
        unknown = False
        for index in range(count):
            child = child_key(parent_key, index)
            at = state(child, gather.stage)
            if isinstance(at, Ref):
                parts.append(at)
                continue
            states = [at, *(state(child, s) for s in gather.path if s != gather.stage)]
            ended = next((e for e in states if isinstance(e, Ended)), None)
            if ended is not None:
                lost.append((child, ended.error_class))
            elif any(e is QUEUED for e in states):
                return WAIT
            else:
                unknown = True
        if unknown:
            return None
        if lost and self.pipeline[stage].on_child_failure == "fail":
            shown = ", ".join(f"{k} ({c})" for k, c in lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5
                                                                    else "")
            why = (f"{len(lost)} of {count} children did not succeed at {gather.stage}: {shown} "
                   "(on_child_failure=\"skip\" gathers the others)")
            return Verdict(parts, lost, why)
        return Verdict(parts, lost, None)

    def barrier_rows(self, target: Pending, verdict: Verdict, tasks: NewTasks, ready: list[Seed], now: float,
                     siblings: int = 0) -> None:
        """A ready join or gather: its seed, or (a gather failing on its children) its failed row. ``siblings``:
        its item's (see Seed), when known."""
        kind, data = parts_ref(verdict.parts, verdict.lost)
        ref = Ref(kind, hashlib.sha256(data).hexdigest(), len(data), data)
        if verdict.failure is None:
            ready.append(Seed(target.run_id, target.item_key, target.root_key, target.stage, ref, siblings))
            return
        p = self._plans[target.stage]
        key = self.key_of(target.run_id, target.stage, ref, target.item_key)
        tasks.failed.append((target.run_id, self.pipeline.name, target.stage, target.item_key, target.root_key, key,
                             p.version, p.config_hash, ref.digest, ref.kind, ref.inline, ref.size, "child_failed",
                             verdict.failure, p.max_attempts, self.lane_rank(target.run_id), now, now, now, siblings))


class Ended(NamedTuple):
    """A task that ended without an output (failed, rejected, dead-lettered), as a join or gather sees it."""

    error_class: str


class Verdict(NamedTuple):
    """A join or gather that is ready: the outputs it takes (in order), the children it goes without, and why it
    fails instead of running (a gather with on_child_failure="fail" that lost children)."""

    parts: list[Ref]
    lost: list[tuple[str, str]]
    failure: str | None


WAIT = Verdict([], [], "wait")  # not ready: something it waits on is still open (or ended, for a join)


def _stage_plan(pipeline: Pipeline, stage: Stage) -> _StagePlan:
    graph, name = pipeline.graph, stage.name
    kids = [pipeline[c] for c in graph.children[name]]
    gathers = tuple(g for g, spec in graph.gathers.items() if spec.stage == name)
    return _StagePlan(
        _key_prefix(pipeline.name, stage), stage.version, stage.config_hash, stage.kind == "fanout",
        stage.kind == "publish", stage.retry.max_attempts,
        tuple(c.name for c in kids if not c.is_join and c.kind not in ("gather", *GROUP_KINDS)), StageMemo(stage),
        stage.params,
        joins=tuple(c.name for c in kids if c.is_join),
        gathers=gathers,
        settles=tuple(g for g, spec in graph.gathers.items() if name in spec.path),
        fanned=tuple(g for g, spec in graph.gathers.items() if spec.fanout == name),
    )


RUNS_REMEMBERED = 10_000  # per-run facts a long-lived worker keeps; the API makes a run per job


def _bound(*caches: dict[str, Any]) -> None:
    """Forget what is kept per run once a cache holds RUNS_REMEMBERED of them: each fact is read again from the
    store when a run comes back, so a worker that serves millions of jobs keeps its memory bounded."""
    for cache in caches:
        if len(cache) >= RUNS_REMEMBERED:
            cache.clear()
