"""Planning a replay (reads only): for each selected task, the input it runs on again, its task key under its
stage's current version and config, whether the memo already answers that key, and what lies downstream of it.

A task's input is the output of the task before it on its item (for a fan-out child's first task, one element
of its parent's fan-out output), or the item's source for a first stage. A task that ended keeps an input that
lives in the blob store and a small input inline, except that a success drops its inline copy: that copy is
read again from the memo (the output it was, under the earlier task's key), or for a first stage from the
run's input (the manifest or folder), whose bytes must still have the digest the run read, unless the reason
is ``source-corrected``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from conveyor.pipeline import Pipeline, Stage
from conveyor.pipeline import params as run_params
from conveyor.pipeline.graph import GROUP_KINDS
from conveyor.runtime.expand import BAD_INPUT_KIND, task_key
from conveyor.runtime.values import INLINE_MAX, Ref, parse_fanout
from conveyor.store import CHILD_MARK, SqlStore
from conveyor.store.reopen import ENDED, Downstream, Reopened
from conveyor.store.selection import SelectedTask


class Sources(NamedTuple):
    """Root items' sources as they are now, read again from the run's input: key -> Ref, or why not."""

    found: dict[str, Ref | str]


@dataclass
class Plan:
    """What re-opening one page of selected tasks writes, and what it would cost (for a dry run)."""

    reopen: list[Reopened] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)  # task keys whose memoised refusals must not answer again
    downstream: list[Downstream] = field(default_factory=list)
    stage_of: dict[int, str] = field(default_factory=dict)  # re-opened task id -> stage
    run_of: dict[int, str] = field(default_factory=dict)
    answered: dict[int, bool] = field(default_factory=dict)  # re-opened task id -> the memo answers its new key
    corrected: list[tuple[str, str, int]] = field(default_factory=list)  # (root key, digest, size) read again
    regroup: set[tuple[str, str]] = field(default_factory=set)  # (run, group stage) whose groups are made again
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


class ReopenPlanner:
    """Plans re-opening tasks of one run under ``pipeline`` (its current declaration)."""

    def __init__(self, pipeline: Pipeline, store: SqlStore, run_id: str, replay_id: int, downstream: bool,
                 corrected: bool) -> None:
        self.pipeline, self.store, self.run_id = pipeline, store, run_id
        self.replay_id, self.downstream, self.corrected = replay_id, downstream, corrected
        run = store.get_run(run_id)
        self._params = run_params.decode(run.params if run else None)  # as the run recorded them
        self._below = {s.name: _below(pipeline, s.name) for s in pipeline}
        groups = [s.name for s in pipeline if s.kind in GROUP_KINDS]
        self._groups_below = {s.name: [g for g in groups if s.name in pipeline.graph.above(g)] for s in pipeline}
        self._gathers_over = {s.name: [g for g, spec in pipeline.graph.gathers.items() if s.name in spec.path]
                              for s in pipeline}
        self._fanout_at_or_below = {s.name: any(pipeline[n].kind == "fanout" for n in (s.name, *self._below[s.name]))
                                    for s in pipeline}

    def plan(self, tasks: Sequence[SelectedTask], selected: set[tuple[str, str]] | None, sources: Sources | None,
             now: float) -> Plan:
        """The plan for ``tasks``. ``selected``: every (item key, stage) the selection holds on these tasks'
        root items, so a task below another selected one is left to be made again from it (``--downstream``).
        ``sources``: the root items' sources read again (first stages whose inline input is gone, and every
        first stage when the source was corrected)."""
        p = Plan()
        inputs = self._parent_inputs([t for t in tasks if self._needs_parent(t)])
        keys: dict[int, str] = {}
        for t in tasks:
            stage = self._stage(t, p)
            if stage is None:
                continue
            if self.downstream and selected is not None and self._covered(t, selected):
                p.skip("below_another_selected_task")
                continue
            ref = self._input(t, stage, inputs, sources, p)
            if ref is None:
                continue
            key = task_key(self.pipeline.name, stage, ref, t.item_key, self._params)
            keys[t.id] = key
            p.reopen.append(Reopened(key, stage.version, stage.config_hash, ref.digest, ref.kind, ref.inline, ref.size,
                                     stage.retry.max_attempts, now, self.replay_id, t.id))
            p.forget += [t.task_key, key]
            p.stage_of[t.id], p.run_of[t.id] = t.stage, t.run_id
            if self.downstream and (self._below[t.stage] or self._fanout_at_or_below[t.stage]):
                p.downstream.append(Downstream(t.run_id, t.root_key, t.item_key, tuple(self._below[t.stage]),
                                               self._fanout_at_or_below[t.stage]))
            if self.downstream:  # the groups it is a member of are made again once it settles (store/groups.py)
                for group in self._groups_below[t.stage]:
                    if (t.run_id, group) not in p.regroup:
                        p.regroup.add((t.run_id, group))
                        p.downstream += [Downstream(t.run_id, item, item, (group, *self._below[group]),
                                                    self._fanout_at_or_below[group])
                                         for item in self.store.group_item_keys(t.run_id)]
            if self.downstream:  # a gather waiting on this child works on its parent item: it runs again too
                parent_item = t.item_key.rpartition(CHILD_MARK)[0]
                for gather in self._gathers_over[t.stage]:
                    p.downstream.append(Downstream(t.run_id, t.root_key, parent_item,
                                                   (gather, *self._below[gather]), self._fanout_at_or_below[gather]))
        memo = self.store.lookup_outputs(keys.values()) if keys else {}
        p.answered = {task_id: key in memo and memo[key].kind != "failed" for task_id, key in keys.items()}
        return p

    def _stage(self, t: SelectedTask, p: Plan) -> Stage | None:
        if t.status not in ENDED:
            p.skip("open" if t.status in ("queued", "running") else t.status)
            return None
        try:
            stage = self.pipeline[t.stage]
        except Exception:
            p.skip("stage_not_declared")
            return None
        if stage.is_join or stage.kind == "gather":
            # Its input is made of other tasks' outputs: replaying those with --downstream makes it again.
            p.skip("join_or_gather")
            return None
        if stage.kind in GROUP_KINDS:  # made again with its groups: replay its members' stage with --downstream
            p.skip("group")
            return None
        return stage

    def _covered(self, t: SelectedTask, selected: set[tuple[str, str]]) -> bool:
        """Another selected task is upstream of ``t`` on its item (or on an item it descends from)."""
        return any(upstream in selected for upstream in _upstream(self.pipeline, t.item_key, t.stage))

    # --- inputs ---------------------------------------------------------------------------------------------

    def _needs_parent(self, t: SelectedTask) -> bool:
        return (t.input_inline is None and t.input_size <= INLINE_MAX and t.input_kind != BAD_INPUT_KIND
                and t.stage in self._below and self.pipeline[t.stage].after is not None)

    def _parent_inputs(self, tasks: Iterable[SelectedTask]) -> dict[int, Ref | None]:
        """Each task's input, read from the memo under the key of the task before it."""
        wanted: dict[int, tuple[str, str, int | None]] = {}  # task id -> (parent item, parent stage, element)
        for t in tasks:
            parent_stage = self.pipeline[t.stage].after
            assert parent_stage is not None
            if self.pipeline[parent_stage].kind == "fanout":
                parent_item, _, position = t.item_key.rpartition(CHILD_MARK)
                wanted[t.id] = (parent_item, parent_stage, int(position))
            else:
                wanted[t.id] = (t.item_key, parent_stage, None)
        if not wanted:
            return {}
        roots = {t.id: t.root_key for t in tasks}
        parents = self.store.task_outputs(self.run_id, [(roots[i], item, stage) for i, (item, stage, _) in
                                                        wanted.items()])
        memo = self.store.lookup_outputs({row[0] for row in parents.values()})
        found: dict[int, Ref | None] = {}
        for task_id, (item, stage, element) in wanted.items():
            parent = parents.get((item, stage))
            hit = memo.get(parent[0]) if parent else None
            if hit is None or hit.inline is None or parent is None or hit.digest != parent[2]:
                found[task_id] = None
                continue
            out = Ref(hit.kind, hit.digest, hit.size, hit.inline)
            found[task_id] = out if element is None else _element(out, element)
        return found

    def _input(self, t: SelectedTask, stage: Stage, parents: dict[int, Ref | None], sources: Sources | None,
               p: Plan) -> Ref | None:
        if stage.after is None and (self.corrected or t.input_kind == BAD_INPUT_KIND
                                    or (t.input_inline is None and t.input_size <= INLINE_MAX)):
            return self._source(t, sources, p)
        if t.input_kind == BAD_INPUT_KIND:
            p.skip("bad_input")
            return None
        if t.input_inline is not None or t.input_size > INLINE_MAX:
            return Ref(t.input_kind, t.input_digest, t.input_size, t.input_inline)
        ref = parents.get(t.id)
        if ref is None or ref.digest != t.input_digest:
            p.skip("input_gone")
            return None
        return ref

    def _source(self, t: SelectedTask, sources: Sources | None, p: Plan) -> Ref | None:
        """A first stage's input, read again from the run's input."""
        found = sources.found.get(t.root_key) if sources is not None else None
        if found is None:
            p.skip("source_not_in_input")
            return None
        if isinstance(found, str):
            p.skip("source_unreadable")
            return None
        # An item whose source could not be read has no content digest to keep: what can be read now corrects it.
        corrected = self.corrected or t.input_kind == BAD_INPUT_KIND
        if found.digest != t.input_digest and not corrected:
            p.skip("source_changed")
            return None
        if corrected and found.digest != t.input_digest:
            p.corrected.append((t.root_key, found.digest, found.size))
        return found

    def needs_sources(self, tasks: Iterable[SelectedTask]) -> set[str]:
        """The root items whose sources must be read again to re-open these tasks."""
        return {t.root_key for t in tasks if t.status in ENDED and t.stage in self._below
                and self.pipeline[t.stage].after is None
                and (self.corrected or t.input_kind == BAD_INPUT_KIND
                     or (t.input_inline is None and t.input_size <= INLINE_MAX))}


def _element(fanout: Ref, index: int) -> Ref | None:
    assert fanout.inline is not None
    elements = parse_fanout(fanout.inline)
    return elements[index] if 0 <= index < len(elements) else None


def _below(pipeline: Pipeline, name: str) -> list[str]:
    """The stages after ``name``, all the way down, in declaration order."""
    found: list[str] = []
    frontier = [name]
    while frontier:
        children = [c.name for parent in frontier for c in pipeline.children(parent)]
        found += children
        frontier = children
    return [s.name for s in pipeline if s.name in found]


def _upstream(pipeline: Pipeline, item_key: str, stage: str) -> list[tuple[str, str]]:
    """(item key, stage) of every task before this one: its item's earlier stages, and through a fan-out
    its parent item's."""
    found: list[tuple[str, str]] = []
    item, current = item_key, pipeline[stage]
    while current.after is not None:
        parent = pipeline[current.after]
        if parent.kind == "fanout":
            item = item.rpartition(CHILD_MARK)[0]
        found.append((item, parent.name))
        current = parent
    return found
