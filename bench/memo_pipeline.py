"""A three-stage pipeline whose later stages see repeated inputs (issue 13 point 0): a → b → c.

Stage ``a`` returns ``{"n": len(source)}``, so items of one length share ``b``'s input and ``c``'s: nearly every
``b`` and ``c`` task is answered from the memo, as boilerplate pages and repeated chunks are in real corpora.
bench/noop_pipeline.py is the same graph with distinct outputs at every stage.
"""

from __future__ import annotations

from typing import Any

from conveyor.pipeline import Pipeline

pipe = Pipeline("bench_memo")


@pipe.stage
def a(ctx: Any, source: bytes) -> dict[str, int]:
    return {"n": len(source)}


@pipe.stage(after=a)
def b(ctx: Any, value: dict[str, int]) -> dict[str, int]:
    return value


@pipe.stage(after=b)
def c(ctx: Any, value: dict[str, int]) -> dict[str, int]:
    return value
