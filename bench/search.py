"""Search-by-meaning benchmark: 100,000 published vectors of 384 dimensions, a query's latency and its recall@10
against an exact scan.

    PYTHONPATH=src .venv/bin/python bench/search.py [--vectors 100000] [--queries 50] [--no-pg] [--no-pgvector]
        [--no-write]

The vectors are random unit vectors with clustered structure (CLUSTERS centres; each vector a centre plus
noise, normalised), so that near neighbours exist as they do among real embeddings; making 100,000 real MiniLM
embeddings would take most of an hour on this machine. They are published into a fresh SQLite store through the
store's own publication path (``SqlStore.publish``, one version per item, its full-text entry and its vector in
the same transaction), with ``embedding_model`` recorded. Each query is a new vector drawn the same way, handed
to ``conveyor.service.publications.search(mode="semantic")`` by an embedder that returns it: the query path is
the real one (the collection's model looked up, the vector index asked, the hits read) except the model call.

Measured: the first search, which makes the sqlite-vec index from the live vectors; the median and p95 latency of
``--queries`` searches (target: median <= 100 ms); recall@10 of each against the exact top 10 (numpy, or the
pure-Python scan without it; target: mean >= 0.95); the exact scan's own latency (the fallback where sqlite-vec
cannot load, and PostgreSQL's way: with CONVEYOR_TEST_PG set, the same vectors are published there too and the
scan timed); and the cost of keeping the index in step (1,000 items published again, with the index and without).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results import markers, pg_database, write_section  # noqa: E402

SCRIPT = "search"
BEGIN, END = markers(f"{SCRIPT}.py")
DIM, CLUSTERS, NOISE = 384, 200, 0.9  # noise per coordinate, relative to the centre's (1/sqrt(DIM))
MODEL, COLLECTION = "bench-embed", "bench"
BATCH = 5000
SCAN_QUERIES = 5


def vectors(count: int, seed: int) -> list[array[float]]:
    """``count`` clustered unit vectors as float32 arrays (the same centres for every seed)."""
    centres = _gauss(CLUSTERS, 0)
    rng = random.Random(seed)
    try:
        import numpy as np

        picked = centres[np.array([rng.randrange(CLUSTERS) for _ in range(count)])]
        raw = picked + NOISE * np.random.default_rng(seed).standard_normal((count, DIM)) / DIM ** 0.5
        unit = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
        return [array("f", row.tobytes()) for row in unit]
    except ImportError:
        out = []
        for _ in range(count):
            centre = centres[rng.randrange(CLUSTERS)]
            point = [c + NOISE * rng.gauss(0, 1) / DIM ** 0.5 for c in centre]
            norm = sum(x * x for x in point) ** 0.5
            out.append(array("f", [x / norm for x in point]))
        return out


def _gauss(count: int, seed: int) -> Any:
    rng = random.Random(seed)
    rows = [[rng.gauss(0, 1) for _ in range(DIM)] for _ in range(count)]
    rows = [[x / sum(y * y for y in r) ** 0.5 for x in r] for r in rows]
    try:
        import numpy as np

        return np.array(rows)
    except ImportError:
        return rows


def publish(url: str, data: Sequence[Sequence[float]], start: int = 0, tag: str = "") -> float:
    """Publish one version per vector (item ``doc{i}``) through the store's publication path; seconds."""
    from conveyor.store import NewPublication, open_store

    store = open_store(url)
    began = time.perf_counter()
    try:
        for first in range(0, len(data), BATCH):
            rows = [NewPublication(COLLECTION, f"doc{start + i:06d}", "bench", "bench", start + i, f"d{start + i}{tag}",
                                   f'{{"n": {start + i}}}', f"document {start + i} {tag}", [list(v)], time.time(),
                                   MODEL) for i, v in enumerate(data[first:first + BATCH], first)]
            with store.db.transaction():
                store.publish(rows)
    finally:
        store.close()
    return time.perf_counter() - began


def exact_tops(data: Sequence[array[float]], queries: Sequence[array[float]], k: int = 10) -> list[list[str]]:
    """For each query, the item keys of the ``k`` nearest vectors by cosine (unit vectors: by dot product)."""
    try:
        import numpy as np

        matrix = np.frombuffer(b"".join(v.tobytes() for v in data), dtype=np.float32).reshape(len(data), DIM)
        return [[f"doc{i:06d}" for i in np.argsort(-(matrix @ np.asarray(q, dtype=np.float32)))[:k]]
                for q in queries]
    except ImportError:
        return [[f"doc{i:06d}" for i in sorted(range(len(data)), key=lambda i: -sum(
            a * b for a, b in zip(data[i], q, strict=True)))[:k]] for q in queries]


def time_queries(url: str, queries: Sequence[Sequence[float]]) -> tuple[list[float], list[float], list[list[str]], str]:
    """Each query through service.search(mode="semantic"): wall seconds, CPU seconds of this process, the keys
    found, the index that ranked."""
    from conveyor.service.publications import search
    from conveyor.store import open_store

    store = open_store(url)
    took, cpu, found, index = [], [], [], ""
    try:
        for query in queries:
            began, began_cpu = time.perf_counter(), time.process_time()
            answer = search(store, "q", COLLECTION, 10, "semantic", embed=lambda model, text, q=query: q)
            took.append(time.perf_counter() - began)
            cpu.append(time.process_time() - began_cpu)
            found.append([h["item_key"] for h in answer["results"]])
            index = answer["index"]
    finally:
        store.close()
    return took, cpu, found, index


def time_scan(url: str, queries: Sequence[Sequence[float]]) -> list[float]:
    """The exact scan's own latency (store/vectors.py ExactScan), whatever the store's usual way."""
    from conveyor.store import open_store
    from conveyor.store.vectors import ExactScan

    store = open_store(url)
    took = []
    try:
        for query in queries:
            began = time.perf_counter()
            ExactScan().nearest(store.db, COLLECTION, query, 10, None)
            took.append(time.perf_counter() - began)
    finally:
        store.close()
    return took


def first_search(url: str, query: Sequence[float]) -> float:
    return time_queries(url, [query])[0][0]


def recall(found: Sequence[Sequence[str]], truth: Sequence[Sequence[str]]) -> list[float]:
    return [len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL even when CONVEYOR_TEST_PG is set")
    parser.add_argument("--no-pgvector", action="store_true", help="skip the private PostgreSQL with pgvector")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args()

    from conveyor.store.sqlitevec import register

    register()
    data = vectors(args.vectors, 1)
    queries = vectors(args.queries, 2)
    truth = exact_tops(data, queries)
    pg = os.environ.get("CONVEYOR_TEST_PG") if not args.no_pg else None
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/search.db"
        published = publish(url, data)
        print(f"published {len(data):,} vectors of {DIM} dims on SQLite in {published:.1f} s")
        built = first_search(url, queries[0])
        print(f"first search (makes the index): {ms(built)} ms")
        load = os.getloadavg()[0]
        took, cpu, found, index = time_queries(url, queries)
        scores = recall(found, truth)
        median, p95 = statistics.median(took), sorted(took)[int(0.95 * (len(took) - 1))]
        print(f"{index}: median {ms(median)} ms (CPU {ms(statistics.median(cpu))} ms), p95 {ms(p95)} ms over "
              f"{len(took)} queries, load average {load:.1f}; recall@10 {statistics.mean(scores):.3f} "
              f"(min {min(scores):.2f})")
        scan = time_scan(url, queries[:SCAN_QUERIES])
        print(f"exact scan on SQLite: median {ms(statistics.median(scan))} ms")
        again = data[:1000]
        kept = publish(url, [array("f", [-x for x in v]) for v in again], tag="again")
        print(f"1,000 items published again with the index kept in step: {kept:.2f} s")
    pg_scan: list[float] = []
    if pg:
        with pg_database(pg, "search") as pg_url:
            from conveyor.store import open_store

            open_store(pg_url).close()
            pg_published = publish(pg_url, data)
            pg_scan = time_scan(pg_url, queries[:SCAN_QUERIES])
            print(f"PostgreSQL: published in {pg_published:.1f} s; "
                  f"exact scan median {ms(statistics.median(pg_scan))} ms")
    pgvector = None if args.no_pgvector else time_pgvector(data, queries, truth)
    if not args.no_write:
        write_section(f"{SCRIPT}.py", report(args, built, (took, cpu, load), scores, index, scan, kept, pg_scan,
                                             pgvector))


def time_pgvector(data: Sequence[array[float]], queries: Sequence[array[float]],
                  truth: Sequence[Sequence[str]]) -> tuple[float, float, list[float], list[float], float] | None:
    """The same vectors on a private PostgreSQL with pgvector (tests/pgvector_server.py): published, the first
    search (makes the table), then the queries: (publish s, first search s, wall s per query, recall per query,
    load average), or None without pgserver."""
    sys.path.insert(0, str(ROOT))
    import psycopg
    from tests.pgvector_server import binaries, running_pgvector

    if binaries() is None:
        print("pgvector: pgserver is not installed; skipped")
        return None
    with running_pgvector() as admin, pg_database(admin, "pgvector") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
        published = publish(url, data)
        built = first_search(url, queries[0])
        load = os.getloadavg()[0]
        took, _, found, index = time_queries(url, queries)
    scores = recall(found, truth)
    print(f"PostgreSQL with {index}: published in {published:.1f} s, first search {ms(built)} ms, median "
          f"{ms(statistics.median(took))} ms, recall@10 {statistics.mean(scores):.3f}, load average {load:.1f}")
    return published, built, took, scores, load


def report(args: Any, built: float, timed: tuple[list[float], list[float], float], scores: list[float], index: str,
           scan: list[float], kept: float, pg_scan: list[float],
           pgvector: tuple[float, float, list[float], list[float], float] | None) -> str:
    took, cpu, load = timed
    median, p95 = statistics.median(took), sorted(took)[int(0.95 * (len(took) - 1))]
    passed = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    lines = [
        BEGIN, "## Search by meaning (bench/search.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `make bench-search` "
        f"({args.vectors:,} vectors, {args.queries} queries). Machine: nproc {os.cpu_count()}; {platform.platform()}; "
        f"Python {platform.python_version()}. 1-minute load average before the queries: {load:.1f} (the host is "
        "shared: a query's wall time grows with the load; its CPU time is what it costs).", "",
        f"{args.vectors:,} random unit vectors of {DIM} dimensions in {CLUSTERS} clusters, published into a fresh "
        "SQLite store through `SqlStore.publish` (one version per item, `embedding_model` recorded); each query a "
        "new vector drawn the same way, through `service.publications.search(mode=\"semantic\")` with an embedder "
        "that returns it. Recall@10 against the exact top 10 (numpy over the same float32 vectors).", "",
        "| measure | value | target | |", "| --- | ---: | ---: | --- |",
        f"| query latency, median ({index}), wall | {ms(median)} ms | <= 100 ms | {passed(median <= 0.1)} |",
        f"| query latency, median, CPU time of the process | {ms(statistics.median(cpu))} ms | <= 100 ms | "
        f"{passed(statistics.median(cpu) <= 0.1)} |",
        f"| query latency, p95 | {ms(p95)} ms | | |",
        f"| recall@10, mean over {len(scores)} queries | {statistics.mean(scores):.3f} | >= 0.95 | "
        f"{passed(statistics.mean(scores) >= 0.95)} |",
        f"| first search (makes the sqlite-vec index from the live vectors) | {ms(built)} ms | | |",
        f"| exact scan on SQLite (the fallback without sqlite-vec), median of {len(scan)} | "
        f"{ms(statistics.median(scan))} ms | | |",
    ]
    if pg_scan:
        lines.append(f"| exact scan on PostgreSQL (no pgvector), median of {len(pg_scan)} | "
                     f"{ms(statistics.median(pg_scan))} ms | | |")
    if pgvector:
        _, pg_built, pg_took, pg_scores, pg_load = pgvector
        lines += [f"| PostgreSQL 16 with pgvector (pgserver's server): query latency, median (load {pg_load:.1f}) | "
                  f"{ms(statistics.median(pg_took))} ms | | |",
                  f"| PostgreSQL with pgvector: recall@10 | {statistics.mean(pg_scores):.3f} | | |",
                  f"| PostgreSQL with pgvector: first search (makes the table from the live vectors) | "
                  f"{ms(pg_built)} ms | | |"]
    lines += [f"| 1,000 items published again, the index kept in step in the same transactions | {kept:.2f} s | | |",
              "", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
