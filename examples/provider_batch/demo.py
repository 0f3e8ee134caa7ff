"""`make demo` (second part): the same run direct and through the provider's Batch API, with the cost of each.

200 support tickets go through examples/provider_batch/pipeline.py twice, each run in a store of its own (so
the second is not answered from the first one's memo): first with direct calls, then with `--provider-batch`,
which parks each ticket's task (no worker held) while its request waits in a batch file on the provider
(/v1/files + /v1/batches), and wakes it with the answer. Chat goes to the provider simulator, started here in a
background thread, whose batches take BATCH_DELAY_S seconds and fail or expire a few entries (failed entries
go into a later batch, expired ones are called directly), unless OPENAI_BASE_URL or OPENAI_API_KEY is set:
then to that endpoint (TICKETS_MODEL, default gpt-4o-mini; a real Batch API may take hours).

The stores are under ./.conveyor/provider-batch/, made afresh on every run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = f"{HERE / 'pipeline.py'}:pipe"
STATE = Path(".conveyor") / "provider-batch"
TICKETS = int(os.environ.get("DEMO_TICKETS", "200"))
BATCH_DELAY_S = 2.0
SIM = {"seed": 11, "latency_ms": 60.0, "latency_tail": 0.5, "batch_delay_s": BATCH_DELAY_S,
       "batch_failure_rate": 0.03, "batch_expired_rate": 0.01}
PRODUCTS = ("printer", "VPN", "laptop", "badge reader", "mail client", "projector", "phone", "monitor")
PROBLEMS = ("will not start", "is slow since Monday", "shows error 0x80070005", "keeps disconnecting",
            "was left in room 4.12", "needs a new licence", "beeps twice and stops")


def write_tickets(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for i in range(count):
        product, problem = PRODUCTS[i % len(PRODUCTS)], PROBLEMS[(i * 3) % len(PROBLEMS)]
        (folder / f"ticket-{i:04d}.txt").write_text(f"NAME: {product} - ticket {i}: the {product} {problem}.\n")


def conveyor_json(*args: str, env: dict[str, str]) -> dict[str, Any]:
    print(f"\n$ conveyor {' '.join(args)} --json", flush=True)
    done = subprocess.run([sys.executable, "-m", "conveyor", *args, "--json"], text=True, stdout=subprocess.PIPE,
                          check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"conveyor {args[0]} exited {done.returncode}")
    return dict(json.loads(done.stdout))


@contextlib.contextmanager
def endpoint(env: dict[str, str]) -> Iterator[str]:
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        yield f"{os.environ.get('OPENAI_BASE_URL') or 'https://api.openai.com/v1'} (real requests, real cost)"
        return
    from conveyor.providers.simulator import SimConfig, run_simulator

    with run_simulator(SimConfig(**SIM)) as url:  # type: ignore[arg-type]
        env.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="sim", TICKETS_MODEL="sim-1")
        yield (f"the provider simulator at {url} (sim-1 priced like gpt-4o-mini); its batches take "
               f"{BATCH_DELAY_S:g} s, {SIM['batch_failure_rate']:.0%} of entries fail, "
               f"{SIM['batch_expired_rate']:.0%} expire")


def run(label: str, db: Path, env: dict[str, str], *flags: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    out = conveyor_json("run", TARGET, "--input", str(STATE / "tickets"), "--db", f"sqlite:///{db}", "--blobs",
                        str(STATE / "blobs"), "--workers", "1", *flags, env=env)
    seconds = time.monotonic() - started
    usage = out["usage"]
    print(f"{label}: {out['outcomes']} in {seconds:.1f} s; {usage['provider_calls']} provider calls, "
          f"{usage['prompt_tokens']:,} + {usage['completion_tokens']:,} tokens, cost ${usage['cost']:.6f}")
    return out, seconds


def main() -> int:
    shutil.rmtree(STATE, ignore_errors=True)
    write_tickets(STATE / "tickets", TICKETS)
    env = dict(os.environ, CONVEYOR_PROVIDER_BATCH_GATHER_S="0.5", CONVEYOR_PROVIDER_BATCH_POLL_S="1")
    with endpoint(env) as where:
        print(f"{TICKETS} tickets; chat: {where}")
        direct, direct_s = run("direct", STATE / "direct.db", env)
        batched, batched_s = run("batched", STATE / "batched.db", env, "--provider-batch")
        shown = conveyor_json("provider-batches", "--run", batched["run_id"], "--db",
                              f"sqlite:///{STATE / 'batched.db'}", env=env)
    batches = shown["batches"]
    print(f"  {len(batches)} batch files: " + "; ".join(
        f"{b['provider_batch_id']} {b['requests']} requests → {b['answered']} answered, {b['retried']} batched "
        f"again, {b['direct']} called directly" for b in reversed(batches)))
    a, b = direct["usage"]["cost"], batched["usage"]["cost"]
    print(f"\ncost: direct ${a:.6f}, batched ${b:.6f} ({b / a:.0%} of direct; answers from a batch cost the price "
          f"table's batch_discount, 0.5, and the few expired entries were called directly at full price); wall "
          f"time {direct_s:.1f} s vs {batched_s:.1f} s (the batched tasks held no worker while their batches ran)")
    ok = direct["outcomes"] == batched["outcomes"] == {"completed": TICKETS} and b < a
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
