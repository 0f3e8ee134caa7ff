"""The pipeline's graph: edges, item levels, joins, gathers and groups, checked. Pure Python, no I/O.

A stage works on items of one *level*. Root stages work on the run's items (level ``()``); below a fan-out
stage F the level gains ``("fanout", F)`` (its children); a gather after a stage at level ``L + (("fanout", F),)``
works on F's item again, at level ``L``; a group stage G makes one item per group of the run
(``group:KEY``), so it and the stages after it are at level ``(("group", G),)``.

- A **join** is a stage with several parents (``after=[a, b]``). Its parents must hand it items of one
  level, and it runs once each of them has succeeded for the item, given their outputs in declared order.
- A **gather** (``kind="gather"``) after a stage X below a fan-out F runs once per F's item after every child
  has *settled* at X: succeeded there, or ended (failed, rejected, dead-lettered) at X or at a stage between
  F and X (``Gather.path``).
- A **group** (``kind="group"``, ``by=``; ``kind="reduce"``: one group) runs once per group of a run after
  every item of the run has settled at its parent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.errors import PipelineError

if TYPE_CHECKING:
    from conveyor.pipeline.declare import Stage

Level = tuple[tuple[str, str], ...]
GROUP_KINDS = ("group", "reduce")
GROUP_PREFIX = "group:"  # a group item's key is GROUP_PREFIX + its group key


@dataclass(frozen=True)
class Gather:
    """What a gather stage waits for: the children of ``fanout``'s items, settled at ``stage`` (the gather's
    parent); ``path`` is every stage a child passes on its way from the fan-out to ``stage``, ``stage``
    included: an ending at any of them settles the child."""

    fanout: str
    stage: str
    path: tuple[str, ...]


@dataclass(frozen=True)
class Graph:
    """The checked graph of a pipeline's stages (``Graph.of``)."""

    order: tuple[str, ...]  # every stage, each after its parents
    parents: Mapping[str, tuple[str, ...]]
    children: Mapping[str, tuple[str, ...]]
    levels: Mapping[str, Level]  # the level of the items each stage works on
    gathers: Mapping[str, Gather]  # gather stage -> what it waits for
    joins: frozenset[str]  # stages with more than one parent

    @classmethod
    def of(cls, stages: Mapping[str, Stage], pipeline: str) -> Graph:
        """The graph of ``stages`` (by name, in declaration order), or a PipelineError that names the
        stages at fault: a parent never declared, a cycle, parents of a join at different levels, a gather
        with no fan-out above it, a stage after a publish stage."""
        parents = {name: tuple(s.parents) for name, s in stages.items()}
        for name, ps in parents.items():
            for parent in ps:
                if parent not in stages:
                    raise PipelineError(f"stage {name!r} comes after {parent!r}, which pipeline {pipeline!r} does "
                                        f"not declare")
                if stages[parent].kind == "publish":
                    raise PipelineError(f"stage {name!r} cannot come after publish stage {parent!r}: a publish "
                                        "stage is a leaf of the graph")
        order = _ordered(parents, pipeline)
        children: dict[str, list[str]] = {name: [] for name in stages}
        for name in order:
            for parent in parents[name]:
                children[parent].append(name)
        levels: dict[str, Level] = {}
        gathers: dict[str, Gather] = {}
        for name in order:
            stage = stages[name]
            levels[name] = _level(stage, parents[name], stages, levels, gathers, pipeline)
        joins = frozenset(name for name, ps in parents.items() if len(ps) > 1)
        return cls(order, parents, {k: tuple(v) for k, v in children.items()}, levels, gathers, joins)

    def output_level(self, name: str, kind: str) -> Level:
        """The level of the items a stage's output goes to: a fan-out's children, or the stage's own items."""
        return (*self.levels[name], ("fanout", name)) if kind == "fanout" else self.levels[name]

    def below(self, name: str) -> tuple[str, ...]:
        """Every stage downstream of ``name`` (joins, gathers and groups included), in graph order."""
        seen: set[str] = set()
        frontier = [name]
        while frontier:
            frontier = [c for n in frontier for c in self.children[n] if c not in seen]
            seen.update(frontier)
        return tuple(n for n in self.order if n in seen)

    def above(self, name: str) -> tuple[str, ...]:
        """Every stage upstream of ``name``, in graph order."""
        seen: set[str] = set()
        frontier = [name]
        while frontier:
            frontier = [p for n in frontier for p in self.parents[n] if p not in seen]
            seen.update(frontier)
        return tuple(n for n in self.order if n in seen)


def _ordered(parents: Mapping[str, Sequence[str]], pipeline: str) -> tuple[str, ...]:
    """The stages in an order where each comes after its parents (declaration order where free), or the
    error naming a cycle."""
    done: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name):], name]
            raise PipelineError(f"pipeline {pipeline!r} has a cycle: {' -> '.join(cycle)}; a stage cannot come "
                                "after itself, directly or through others")
        state[name] = 1
        for parent in parents[name]:
            visit(parent, [*path, name])
        state[name] = 2
        done.append(name)

    for name in parents:
        visit(name, [])
    return tuple(done)


def _level(stage: Stage, parents: tuple[str, ...], stages: Mapping[str, Stage], levels: Mapping[str, Level],
           gathers: dict[str, Gather], pipeline: str) -> Level:
    if not parents:
        if stage.kind in ("gather", *GROUP_KINDS):
            raise PipelineError(f"stage {stage.name!r}: a {stage.kind} stage needs after=... (the stage whose "
                                "outputs it takes)")
        return ()
    outputs = [_output_level(stages[p], levels) for p in parents]
    if any(level != outputs[0] for level in outputs):
        named = ", ".join(f"{p} ({_describe(level)})" for p, level in zip(parents, outputs, strict=True))
        raise PipelineError(f"stage {stage.name!r} joins parents at different item levels: {named}; a join takes "
                            "outputs of one item, so its parents must work on the same items")
    level = outputs[0]
    if stage.kind in GROUP_KINDS:
        return (("group", stage.name),)
    if stage.kind != "gather":
        return level
    parent = stages[parents[0]]
    if parent.kind == "fanout":
        raise PipelineError(f"stage {stage.name!r}: a gather after fan-out stage {parent.name!r} would get back "
                            "the list it returned; put the gather after a stage below the fan-out")
    if not level or level[-1][0] != "fanout":
        raise PipelineError(f"stage {stage.name!r}: kind=\"gather\" gathers a fan-out's children, but "
                            f"{parent.name!r} is not below a fan-out stage ({_describe(level)})")
    fanout = level[-1][1]
    path = tuple(name for name in (*_between(fanout, parent.name, stages), parent.name))
    gathers[stage.name] = Gather(fanout, parent.name, path)
    return level[:-1]


def _output_level(stage: Stage, levels: Mapping[str, Level]) -> Level:
    return (*levels[stage.name], ("fanout", stage.name)) if stage.kind == "fanout" else levels[stage.name]


def _between(fanout: str, stage: str, stages: Mapping[str, Stage]) -> list[str]:
    """The stages strictly between ``fanout`` and ``stage`` on the way down (every ancestor of ``stage``
    that descends from ``fanout``), in no particular order but stable."""
    found: list[str] = []
    frontier = list(stages[stage].parents)
    seen: set[str] = set()
    while frontier:
        name = frontier.pop()
        if name in seen or name == fanout:
            continue
        seen.add(name)
        found.append(name)
        frontier.extend(stages[name].parents)
    return sorted(found)


def _describe(level: Level) -> str:
    if not level:
        return "the run's items"
    kind, name = level[-1]
    return f"the children of fan-out {name!r}" if kind == "fanout" else f"the groups of {name!r}"
