"""The naive baseline of the provider-quota benchmark (bench/providers.py).

What people write by hand to push a batch through a rate-limited model: asyncio,
the official client with its own retries off, a semaphore for concurrency, and
exponential backoff with full jitter on 429, 5xx and connection errors, held
inside the semaphore. It knows nothing of the limit and does not read
Retry-After::

    .venv/bin/python bench/baseline_naive.py --base-url http://127.0.0.1:8765/v1 \\
        --manifest manifest.jsonl --concurrency 32 --max-tokens 256

Every document of the manifest is scheduled at once; the semaphore lets
``--concurrency`` of them talk to the provider. SIGTERM (or Ctrl-C) cancels all of
them. Either way one JSON object is printed on stdout: documents answered, gave
up, cancelled, requests by outcome, and the client-side latency of the answered
requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai


def read_texts(manifest: Path) -> list[str]:
    with manifest.open(encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh if line.strip()]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = read_texts(args.manifest)
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=60.0)
    semaphore = asyncio.Semaphore(args.concurrency)
    rng = random.Random(args.seed)
    stats: Counter[str] = Counter()
    latencies: list[float] = []

    async def one(text: str) -> None:
        async with semaphore:
            for attempt in range(args.max_attempts):
                started = time.monotonic()
                try:
                    await client.chat.completions.create(
                        model=args.model, messages=[{"role": "user", "content": text}], max_tokens=args.max_tokens)
                except openai.RateLimitError:
                    stats["429"] += 1
                except openai.InternalServerError:
                    stats["5xx"] += 1
                except (openai.APIConnectionError, openai.APITimeoutError):
                    stats["connection"] += 1
                else:
                    latencies.append(time.monotonic() - started)
                    stats["answered"] += 1
                    return
                if attempt + 1 < args.max_attempts:
                    await asyncio.sleep(rng.uniform(0.0, min(args.cap, args.base * 2**attempt)))
            stats["gave_up"] += 1

    tasks = [asyncio.create_task(one(text)) for text in texts]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [t.cancel() for t in tasks])
    started = time.monotonic()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = time.monotonic() - started
    await client.close()
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 4) if latencies else None

    return {
        "documents": len(texts), "answered": stats["answered"], "gave_up": stats["gave_up"],
        "cancelled": sum(isinstance(r, asyncio.CancelledError) for r in results),
        "errors": {k: stats[k] for k in ("429", "5xx", "connection")}, "seconds": round(elapsed, 3),
        "latency_p50": pct(0.5), "latency_p99": pct(0.99),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="sim")
    p.add_argument("--manifest", type=Path, required=True, help='JSONL of {"key", "text"}')
    p.add_argument("--model", default="sim-1")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-attempts", type=int, default=8)
    p.add_argument("--base", type=float, default=1.0, help="backoff: first retry waits up to BASE seconds")
    p.add_argument("--cap", type=float, default=60.0, help="backoff: no retry waits more than CAP seconds")
    p.add_argument("--seed", type=int, default=0, help="seed of the jitter")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    summary = asyncio.run(run(parse_args(argv)))
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
