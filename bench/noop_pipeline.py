"""A no-op three-stage pipeline for the throughput benchmark: a → b → c, each returns its input.

Every stage costs nothing, so what bench/engine.py measures is the engine itself:
claiming, the memo lookup, committing outputs and attempts, expanding the next stage.
"""

from __future__ import annotations

from typing import Any

from conveyor.pipeline import Pipeline

pipe = Pipeline("bench_noop")


@pipe.stage
def a(ctx: Any, value: bytes) -> bytes:
    return value


@pipe.stage(after=a)
def b(ctx: Any, value: bytes) -> bytes:
    return value


@pipe.stage(after=b)
def c(ctx: Any, value: bytes) -> bytes:
    return value
