"""Support tickets sorted by a model: one async stage, one JSON-mode chat call per ticket.

    conveyor run examples/provider_batch/pipeline.py:pipe --input TICKETS/                    # direct calls
    conveyor run examples/provider_batch/pipeline.py:pipe --input TICKETS/ --provider-batch   # the Batch API

The provider: any OpenAI-compatible endpoint (OPENAI_BASE_URL / OPENAI_API_KEY), TICKETS_MODEL (default
gpt-4o-mini) at PRICES; the demo (demo.py) points it at the provider simulator. Declaring the stage with
``batch=True`` puts it on the provider batch lane without the flag.
"""

from __future__ import annotations

import os

from conveyor import Pipeline, Retry

MODEL = os.environ.get("TICKETS_MODEL", "gpt-4o-mini")
PRICES = {"gpt-4o-mini": {"input": 0.15, "output": 0.60}, "sim-1": {"input": 0.15, "output": 0.60}}
SYSTEM = ('Sort the support ticket. Answer with one JSON object: {"names": [the products it names], '
          '"confidence": 0 to 1}.')


def provider() -> object:
    from conveyor.providers.openai_provider import OpenAIProvider

    return OpenAIProvider(os.environ.get("OPENAI_BASE_URL"), os.environ.get("OPENAI_API_KEY"),
                          prices=os.environ.get("CONVEYOR_PRICES") or PRICES)


pipe = Pipeline("tickets", provider=provider, retry=Retry(max_attempts=3, base=0.2, cap=2.0))


@pipe.stage(version="1")
async def triage(ctx, source: bytes) -> dict:  # type: ignore[no-untyped-def]
    text = source.decode()
    answer = await ctx.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                            model=MODEL, json_mode=True, max_tokens=120, prompt_version="triage@1")
    return {"ticket": text[:80], "triage": answer.data}
