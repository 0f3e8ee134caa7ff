"""The conveyor side of the provider-quota benchmark (bench/providers.py).

One async stage: each item's text goes to the model as one user message, and the
answer is the stage's output. The provider comes from the environment
(``OPENAI_BASE_URL`` pointing at the simulator, ``OPENAI_API_KEY=sim``) and the
limit from ``CONVEYOR_LIMITS='{"sim-1": {"tpm": N}}'``; both are set by the bench::

    OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=sim \\
    CONVEYOR_LIMITS='{"sim-1": {"tpm": 300000}}' \\
    conveyor run bench/quota_pipeline.py:pipe --input manifest.jsonl --workers 4

The model and ``max_tokens`` can be changed with ``QUOTA_BENCH_MODEL`` and
``QUOTA_BENCH_MAX_TOKENS`` (the bench passes the same values to the baseline).
Rate-limited calls get a large retry budget, as anyone would give them in a job
that is meant to run at its provider's limit: without it a run that meets 429s
dead-letters its items instead of processing them.
"""

from __future__ import annotations

import os
from typing import Any

from conveyor import Pipeline, Retry

MODEL = os.environ.get("QUOTA_BENCH_MODEL", "sim-1")
MAX_TOKENS = int(os.environ.get("QUOTA_BENCH_MAX_TOKENS", "256"))

pipe = Pipeline("quota-bench", retry=Retry(max_attempts=5, max_attempts_by_class={"rate_limited": 100}))


@pipe.stage(version="1", config={"model": MODEL, "max_tokens": MAX_TOKENS})
async def answer(ctx: Any, source: bytes) -> dict[str, Any]:
    done = await ctx.chat([{"role": "user", "content": source.decode("utf-8")}], model=MODEL,
                          max_tokens=MAX_TOKENS)
    return {"text": done.text, "prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens}
