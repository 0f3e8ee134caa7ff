"""One stage that waits a known time per item, for bench/rerun.py's small run: ``nap`` waits ``STAGE_S``
seconds (1.0) on each item, as a model call does (an async stage), up to ten at once in a worker, so ten items
take one stage time when nothing else costs anything. What a run of them takes beyond ``STAGE_S`` is the
engine's own overhead."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.pipeline import Pipeline

STAGE_S = 1.0

pipe = Pipeline("bench_sleep")


@pipe.stage(concurrency=10)
async def nap(ctx: Any, value: bytes) -> int:
    await asyncio.sleep(STAGE_S)
    return len(value)
