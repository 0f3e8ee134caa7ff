"""Pipelines for bench/graph.py: the no-op chain beside a join, a gather and a group of the same items.

- ``chain``: a → b → c (3 transitions an item), as bench/noop_pipeline.py;
- ``join``: a → {b, c} → d, d a join of b and c (4 transitions an item: the chain's 3 and the join);
- ``gather``: a fans out 2 children → b on each → g gathers them (4 transitions an item);
- ``chain4`` (a → b → c → d) and ``fanout`` (the gather's pipeline without its gather): the yardsticks;
- ``reduce``: a → total, one group of every item, called on batches of 1,000 members folded up a tree.
"""

from __future__ import annotations

from typing import Any

from conveyor.pipeline import Pipeline

chain = Pipeline("bench_graph_chain")
join = Pipeline("bench_graph_join")
gather = Pipeline("bench_graph_gather")
fanout = Pipeline("bench_graph_fanout")
reduce = Pipeline("bench_graph_reduce")


def same(ctx: Any, value: Any) -> Any:
    return value


chain_a = chain.stage(name="a")(same)
chain_b = chain.stage(name="b", after="a")(same)
chain.stage(name="c", after="b")(same)

join.stage(name="a")(same)
join.stage(name="b", after="a")(same)
join.stage(name="c", after="a")(same)


@join.stage(after=["b", "c"])
def d(ctx: Any, left: bytes, right: bytes) -> bytes:
    return left


@gather.stage(name="a", kind="fanout")
def split(ctx: Any, value: bytes) -> list[bytes]:
    return [value, value]


gather.stage(name="b", after="a")(same)


@gather.stage(after="b", kind="gather")
def g(ctx: Any, parts: list[bytes]) -> int:
    return len(parts)


@reduce.stage(name="a")
def size(ctx: Any, value: bytes) -> int:
    return len(value)


def fold(ctx: Any, key: str, parts: list[int]) -> int:
    return sum(parts)


@reduce.stage(after="a", kind="reduce", batch=1_000, fold=fold)
def total(ctx: Any, key: str, members: Any) -> int:
    return sum(value for _, value in members)

# The chain with a fourth stage: what the join's and gather's four transitions an item cost without a join or gather.
chain4 = Pipeline("bench_graph_chain4")
chain4.stage(name="a")(same)
chain4.stage(name="b", after="a")(same)
chain4.stage(name="c", after="b")(same)
chain4.stage(name="d", after="c")(same)

# The gather's pipeline without its gather (a fans out 2 children → b on each: 3 transitions an item).
fanout.stage(name="a", kind="fanout")(split.fn)
fanout.stage(name="b", after="a")(same)
