"""`make demo`: run the manual-page pipeline twice, through the model provider layer.

Chat goes to the provider simulator, started here in a background thread with realistic faults
(5xx, malformed and truncated JSON, slow tails, rare hangs, a tokens-per-minute limit), unless
OPENAI_BASE_URL or OPENAI_API_KEY is set: then to that endpoint, with DEMO_MODEL (gpt-4o-mini).
Embeddings come from the local all-MiniLM-L6-v2 model on the CPU.

The first run parses, summarises, embeds and publishes a deterministic sample of this machine's
manual pages (DEMO_LIMIT, default 300: CPU embeddings take about a tenth of a second per chunk here;
DEMO_LIMIT=0 takes them all); the second run over the same pages makes zero stage calls and zero
model requests, because every task is answered from the memo. The store is ./.conveyor/.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conveyor.store import CHILD_MARK

HERE = Path(__file__).resolve().parent
TARGET = f"{HERE / 'pipeline.py'}:pipe"
CORPUS = Path(os.environ.get("MANPAGES", "/usr/share/man"))
STATE = Path(".conveyor")
CATALOGUE = STATE / "manpages-catalogue.db"
MANIFEST = STATE / "manpages-sample.jsonl"
SIM_LOG = STATE / "provider-sim.jsonl"
LIMIT = int(os.environ.get("DEMO_LIMIT", "300"))
PER_FAMILY = 2  # pages per name family (gcloud_*, git-*, ...) in the sample, so big generated families don't crowd it
SHOWN = ("man1/ls.1.gz", "man1/gzip.1.gz", "man1/tar.1.gz")
QUERY = "compress or decompress files"
# The simulator's faults and limits; the pipeline's fleet-wide budget for sim-1 is 90% of these limits.
SIM = {"seed": 7, "tpm": 200_000, "rpm": 1_200, "latency_ms": 80.0, "latency_tail": 0.6, "error_rate_5xx": 0.02,
       "malformed_rate": 0.01, "truncated_rate": 0.01, "hang_rate": 0.003, "hang_seconds": 30.0}


def conveyor(*args: str, env: dict[str, str], capture: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "conveyor", *args]
    shown = [a if len(a) < 60 else "…" + a[-40:] for a in args]
    print(f"\n$ conveyor {' '.join(shown)}", flush=True)
    return subprocess.run(cmd, text=True, stdout=subprocess.PIPE if capture else None, check=False, env=env)


def corpus() -> Path:
    if CORPUS.is_dir() and next(CORPUS.rglob("*.gz"), None) is not None:
        return CORPUS
    print(f"{CORPUS} has no manual pages here; using the sample pages shipped in {HERE / 'sample'}")
    return HERE / "sample"


def family(name: str) -> str:
    return re.split(r"[_\-.]", name, maxsplit=1)[0].lower()


def write_sample(root: Path, limit: int) -> str:
    """A manifest of a deterministic sample of the pages under ``root`` (keys as `--input DIR` gives them)."""
    pages: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        pages += [Path(folder, n).relative_to(root).as_posix() for n in sorted(files) if Path(folder, n).is_file()]
    english = [p for p in pages if p.split("/", 1)[0].startswith("man")] or pages
    seen: Counter[str] = Counter()
    varied = []
    for key in english:
        seen[family(Path(key).name)] += 1
        if seen[family(Path(key).name)] <= PER_FAMILY or key in SHOWN:
            varied.append(key)
    if limit <= 0 or limit >= len(pages):
        chosen, note = pages, f"all {len(pages):,} pages under {root}"
    else:
        step = max(1, len(varied) // limit)
        chosen = sorted({*varied[::step][:limit], *(k for k in SHOWN if k in varied)})
        note = (f"a sample of {len(chosen):,} of the {len(pages):,} pages under {root} (DEMO_LIMIT={limit}: "
                f"1 in {step} of the English pages, at most {PER_FAMILY} per name family; DEMO_LIMIT=0 runs "
                "them all, which takes hours here)")
    STATE.mkdir(exist_ok=True)
    with MANIFEST.open("w", encoding="utf-8") as out:
        for key in chosen:
            out.write(json.dumps({"key": key, "path": str(root / key)}) + "\n")
    return note


def simulated() -> bool:
    """The simulator serves chat unless OPENAI_BASE_URL or OPENAI_API_KEY names a real endpoint."""
    return not (os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"))


@contextlib.contextmanager
def endpoint(env: dict[str, str]) -> Iterator[str]:
    """The chat endpoint the workers use: the simulator in a thread of this process, or the one in the env."""
    if not simulated():
        env["MANPAGES_MODEL"] = os.environ.get("DEMO_MODEL", "gpt-4o-mini")
        where = os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        yield f"{where}, model {env['MANPAGES_MODEL']} (real requests; this costs real tokens)"
        return
    try:
        from conveyor.providers.simulator import SimConfig, run_simulator
    except ImportError as exc:
        raise SystemExit(f"the provider simulator needs fastapi and uvicorn: make setup ({exc})") from None
    SIM_LOG.unlink(missing_ok=True)
    with run_simulator(SimConfig(**SIM, log_path=SIM_LOG)) as url:
        env.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="sim", MANPAGES_MODEL="sim-1")
        yield (f"the provider simulator at {url}, model sim-1: {SIM['error_rate_5xx']:.0%} 5xx, "
               f"{SIM['malformed_rate']:.0%} malformed and {SIM['truncated_rate']:.0%} truncated JSON, "
               f"{SIM['hang_rate']:.1%} hangs, latency {SIM['latency_ms']:.0f} ms lognormal (sigma "
               f"{SIM['latency_tail']}), {SIM['tpm']:,} tokens and {SIM['rpm']:,} requests a minute; log {SIM_LOG}")


def sim_requests() -> list[dict[str, Any]]:
    if not SIM_LOG.exists():
        return []
    return [json.loads(line) for line in SIM_LOG.read_text(encoding="utf-8").splitlines() if line.strip()]


def status(run_id: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "conveyor", "status", run_id, "--json"], text=True,
                          stdout=subprocess.PIPE, check=True, env=env)
    return dict(json.loads(done.stdout))


def show_model_use(first: dict[str, Any], state: dict[str, Any], requests: list[dict[str, Any]]) -> None:
    """Tokens, cost, retries and 429s of the first run: conveyor's own accounts, then the simulator's log."""
    usage = state.get("usage", {})
    accepted = first["outcomes"].get("published", 0) + first["outcomes"].get("completed", 0)
    cost = float(usage.get("cost") or 0.0)
    print(f"\nmodel use of the first run, as conveyor recorded it (`conveyor status {first['run_id']} --json`):")
    print(f"  provider calls {usage.get('provider_calls', 0):,} (chat and local embeddings, failed attempts included)"
          f"; tokens {usage.get('prompt_tokens', 0):,} prompt + {usage.get('completion_tokens', 0):,} completion"
          f"; cost ${cost:.4f}" + (f", ${cost * 1000 / accepted:.4f} per 1,000 accepted manuals" if accepted else ""))
    errors = state.get("attempt_errors")
    line = f"  retries {state.get('retries', 0):,}"
    if errors:
        line += " (failed attempts by class: " + ", ".join(
            f"{k} {v}" for k, v in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))) + ")"
    if errors is not None:
        line += f"; 429s (rate_limited attempts) {errors.get('rate_limited', 0)}"
    print(line)
    chat = [r for r in requests if r.get("endpoint") == "chat"]
    if chat:
        statuses = Counter(r["status"] for r in chat)
        faults = Counter(r["fault"] for r in chat if r.get("fault"))
        answered = [r for r in chat if r["status"] == 200]
        print(f"  the simulator's log ({SIM_LOG}): {len(chat):,} chat requests, {statuses.get(200, 0):,} answered "
              f"({faults.get('malformed', 0)} with malformed and {faults.get('truncated', 0)} with truncated JSON), "
              f"{statuses.get(429, 0)} 429s, {statuses.get(500, 0) + statuses.get(503, 0)} 5xx, "
              f"{faults.get('hang', 0)} hung; {sum(r['prompt_tokens'] for r in answered):,} prompt + "
              f"{sum(r['completion_tokens'] for r in answered):,} completion tokens charged for chat "
              "(the rest above is the local model's)")


def show_catalogue() -> None:
    with sqlite3.connect(CATALOGUE) as db:
        total, twice = db.execute("SELECT COUNT(*), COALESCE(SUM(deliveries > 1), 0) FROM manpages").fetchone()
        chunks, chunks_twice, manuals = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(deliveries > 1), 0), COUNT(DISTINCT substr(source, 1, instr(source, ?)))"
            " FROM chunks", (CHILD_MARK,)).fetchone()
        marks = ",".join("?" * len(SHOWN))
        rows = db.execute(f"SELECT source, names, section, description, summary, keywords FROM manpages"
                          f" WHERE alias_of IS NULL AND source IN ({marks}) ORDER BY source", SHOWN).fetchall()
    print(f"\ncatalogue {CATALOGUE}: {total:,} manuals and {chunks:,} chunk vectors of {manuals:,} manuals; "
          f"{twice + chunks_twice} delivered more than once (the publish keys held them to one effect each)")
    for source, names, section, description, summary, keywords in rows:
        shown = summary if len(summary or "") <= 100 else summary[:99] + "…"
        print(f"  {source}: {names} ({section}) — {description}\n      model: {shown!r} [{keywords}]")
    if rows and simulated():
        print("  (the simulator answers with filler words; a real endpoint writes real summaries and keywords)")


def search(query: str, top: int = 3) -> None:
    """The nearest manuals to ``query`` by cosine over the catalogue's chunk vectors (the local model, here)."""
    import asyncio

    import numpy as np

    sys.path.insert(0, str(HERE))
    from enrich import unpack_vector

    from conveyor.providers.local_embeddings import LocalEmbeddings

    with sqlite3.connect(CATALOGUE) as db:
        rows = db.execute("SELECT source, snippet, vector_f16 FROM chunks").fetchall()
    if not rows:
        return
    started = time.monotonic()
    query_vector = np.array(asyncio.run(LocalEmbeddings().embed([query])).vectors[0])
    matrix = np.array([unpack_vector(r[2]) for r in rows], dtype=np.float32)
    scores = matrix @ query_vector
    best: dict[str, tuple[float, str]] = {}
    for i in np.argsort(-scores):
        manual = rows[i][0].split(CHILD_MARK, 1)[0]  # a chunk is a fan-out child: "<manual>¶<index>"
        best.setdefault(manual, (float(scores[i]), rows[i][1]))
        if len(best) == top:
            break
    print(f"\nsemantic search over the chunk vectors for {query!r} ({time.monotonic() - started:.1f} s):")
    for manual, (score, snippet) in best.items():
        print(f"  {score:.2f} {manual}: {snippet[:90]}…")


def main() -> int:
    started = time.monotonic()
    note = write_sample(corpus(), LIMIT)
    print(f"input: {note}")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false")
    with endpoint(env) as where:
        print(f"chat: {where}\nembeddings: all-MiniLM-L6-v2 on this machine's CPU (one thread per worker)")
        run_started = time.monotonic()
        first = conveyor("run", TARGET, "--input", str(MANIFEST), "--workers", "2", "--json", env=env, capture=True)
        if first.returncode not in (0, 3, 4):  # 4: some items failed or were dead-lettered (shown below)
            return first.returncode
        run1 = json.loads(first.stdout)
        first_s = time.monotonic() - run_started
        print(f"first run {run1['run_id']} ({first_s:.0f} s): expected {run1['expected']:,}, outcomes "
              f"{run1['outcomes']}, unaccounted {run1['unaccounted']}, stage calls {run1['stage_calls']:,}, "
              f"cached {run1['cached']:,}")
        for item in run1.get("not_done", [])[:8]:
            print(f"  {item['item_key']}: {', '.join(item['error_classes'])}")
        requests_after_first = sim_requests()
        show_model_use(run1, status(run1["run_id"], env), requests_after_first)

        run_started = time.monotonic()
        second = conveyor("run", TARGET, "--input", str(MANIFEST), "--workers", "2", "--json", env=env, capture=True)
        run2 = json.loads(second.stdout)
        extra = len(sim_requests()) - len(requests_after_first)
    print(f"second run {run2['run_id']} ({time.monotonic() - run_started:.1f} s): stage_calls={run2['stage_calls']}, "
          f"cached={run2['cached']:,}, outcomes={run2['outcomes']}, unaccounted={run2['unaccounted']}, "
          f"provider calls {run2['usage']['provider_calls']}"
          + (f", simulator requests {extra}" if requests_after_first else ""))
    show_catalogue()
    if os.environ.get("DEMO_SEARCH", "1") != "0":
        search(QUERY)
    print(f"\ndemo took {time.monotonic() - started:.0f} s. next: `conveyor status`, `conveyor reconcile RUN_ID`, "
          "`conveyor dlq list` (store: ./.conveyor/)")
    ok = run1["unaccounted"] == 0 and run2["stage_calls"] == 0 and run2["unaccounted"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
