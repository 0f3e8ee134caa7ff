"""Export benchmark: `conveyor export RUN --format parquet` of 1,000,000 accepted items from SQLite, against a
hand-written floor on the same store, and the export's peak memory.

    .venv/bin/python bench/export.py [--items 1000000] [--rounds 3] [--no-write]

The run's rows are written straight into a fresh SQLite store (the engine's own schema), as a run of a
one-stage pipeline that calls a model writes them: per root item its ``items`` row, one succeeded ``extract``
task whose JSON output (``{"title", "n", "score", "tags", "meta": {"lang", "pages"}}``, about 150 bytes) is
inline in the memo (``outputs``), one attempt with the model's usage (tokens, cost, model, prompt version)
and the task's provenance rows (``model``, ``prompt_version``). Then, alternating, each a whole process:

- ``conveyor export RUN --format parquet --out FILE``;
- the floor: this script with ``--floor``: one SELECT joining items, tasks, the memo, attempts and provenance,
  the values decoded and spread into the same columns, written by pyarrow's ParquetWriter a batch at a time.

Prints the median seconds of each, the ratio floor / export (target >= 0.7) and the export process's peak
RSS (target <= 200 MB, from wait4's rusage), and writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results import markers, write_section  # noqa: E402

SCRIPT = "export"
BEGIN, END = markers(f"{SCRIPT}.py")
STAGES = '[{"name": "extract", "after": null, "kind": "map", "version": "1", "accept": null}]'
TASK_COLUMNS = ("run_id", "pipeline", "stage", "item_key", "root_key", "status", "task_key", "stage_version",
                "config_hash", "input_digest", "input_kind", "input_size", "max_attempts", "available_at",
                "created_at", "started_at", "finished_at", "attempts", "output_digest", "output_kind")
ATTEMPT_COLUMNS = ("task_id", "run_id", "attempt", "outcome", "invoked", "worker", "lease_token", "stage_version",
                   "code_version", "started_at", "duration", "provider_calls", "prompt_tokens", "completion_tokens",
                   "cost", "model", "prompt_version", "config_hash", "provenance")
SEED_BATCH = 50_000
BATCH = 5000
MODEL, PROMPT = "gpt-4o-mini", "extract@3"


def populate(url: str, run_id: str, items: int) -> float:
    """Write the run's rows; returns the seconds it took."""
    import hashlib

    import orjson

    from conveyor.store import open_store
    from conveyor.store.memokey import key64
    from conveyor.store.provenance import sort_key

    store = open_store(url)
    started, now = time.perf_counter(), time.time()
    doc = orjson.dumps({"model": MODEL, "prompt_version": PROMPT}).decode()
    try:
        store.db.execute(
            "INSERT INTO runs (run_id, pipeline, target, input, status, expected, has_publish, stages, created_at, "
            "submitted_at, finished_at) VALUES (?, 'bench', 'bench.py:pipe', 'bench', 'finished', ?, 0, ?, ?, ?, ?)",
            (run_id, items, STAGES, now, now, now))
        for start in range(0, items, SEED_BATCH):
            numbers = range(start, min(items, start + SEED_BATCH))
            keys = [f"manuals/doc{i:08d}.txt" for i in numbers]
            outputs = [orjson.dumps({"title": f"Document number {i}", "n": i, "score": (i % 97) / 97.0,
                                     "tags": ["manual", f"section{i % 9}"], "meta": {"lang": "en", "pages": i % 40}},
                                    option=orjson.OPT_SORT_KEYS) for i in numbers]
            digests = [hashlib.sha256(o).hexdigest() for o in outputs]
            task_keys = [hashlib.sha256(f"{run_id}/{k}".encode()).hexdigest() for k in keys]
            with store.transaction():
                store.db.append("items", ("run_id", "item_key", "root_key", "source_digest", "source_size",
                                          "created_at"), [(run_id, k, k, "d" * 64, 100, now) for k in keys])
                store.db.append("tasks", TASK_COLUMNS, [
                    (run_id, "bench", "extract", k, k, "succeeded", tk, "1", "c0ffee", "d" * 64, "bytes", 100, 3, now,
                     now, now, now, 1, dg, "json") for k, tk, dg in zip(keys, task_keys, digests, strict=True)])
                store.db.append("outputs", ("key64", "task_key", "stage", "kind", "digest", "inline", "size", "run_id",
                                            "created_at", "provenance"),
                                [(key64(tk), tk, "extract", "json", dg, o, len(o), run_id, now, doc)
                                 for tk, dg, o in zip(task_keys, digests, outputs, strict=True)])
                ids = store.db.execute("SELECT id FROM tasks WHERE run_id = ? AND root_key >= ? AND root_key <= ? "
                                       "ORDER BY root_key", (run_id, keys[0], keys[-1]))
                store.db.append("attempts", ATTEMPT_COLUMNS, [
                    (int(tid), run_id, 1, "succeeded", 1, "w1", 1, "1", "code", now, 0.5, 1, 300 + i % 50, 40, 0.00012,
                     MODEL, PROMPT, "c0ffee", doc) for (tid,), i in zip(ids, numbers, strict=True)])
                store.db.append("provenance", ("run_id", "root_key", "item_key", "stage", "name", "value", "sort_key"),
                                [(run_id, k, k, "extract", name, value, sort_key(value))
                                 for k in keys for name, value in (("model", MODEL), ("prompt_version", PROMPT))])
        store.db.refresh_statistics(("tasks", "items", "provenance", "attempts", "outputs"))
        store.recount_run_totals(run_id)
        if store.db.name == "sqlite":
            store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # as a store whose run finished a while ago
    finally:
        store.close()
    return time.perf_counter() - started


# --- the floor: one SELECT and a ParquetWriter -------------------------------------------------------------------

FLOOR_SQL = """
SELECT i.item_key, i.source_digest, t.stage_version, t.config_hash, o.inline,
       (SELECT SUM(a.prompt_tokens + a.completion_tokens) FROM attempts a
          WHERE a.run_id = t.run_id AND a.task_id = t.id),
       (SELECT SUM(a.cost) FROM attempts a WHERE a.run_id = t.run_id AND a.task_id = t.id),
       (SELECT group_concat(p.value) FROM provenance p WHERE p.run_id = t.run_id AND p.root_key = t.root_key
          AND p.item_key = t.item_key AND p.stage = t.stage AND p.name = 'model'),
       (SELECT group_concat(p.value) FROM provenance p WHERE p.run_id = t.run_id AND p.root_key = t.root_key
          AND p.item_key = t.item_key AND p.stage = t.stage AND p.name = 'prompt_version')
FROM items i
JOIN tasks t ON t.run_id = i.run_id AND t.root_key = i.item_key AND t.item_key = i.item_key AND t.stage = 'extract'
JOIN outputs o ON o.key64 = key64(t.task_key)
WHERE i.run_id = ? AND i.parent_key IS NULL AND t.status = 'succeeded'
ORDER BY i.item_key
"""


def floor(db_path: str, run_id: str, out: str) -> None:
    """The hand-written export of the same run to the same columns."""
    import json

    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    from conveyor.store.memokey import key64

    conn = sqlite3.connect(db_path)
    conn.create_function("key64", 1, key64, deterministic=True)
    cursor = conn.execute(FLOOR_SQL, (run_id,))
    writer = None
    while rows := cursor.fetchmany(BATCH):
        values = [orjson.loads(r[4]) for r in rows]
        names = sorted({k for v in values for k in v})
        columns: dict[str, Any] = {"item_key": [r[0] for r in rows], "outcome": ["completed"] * len(rows),
                                   "error_class": [None] * len(rows), "error": [None] * len(rows)}
        columns |= {f"value.{n}": [v.get(n) for v in values] for n in names}
        columns |= {"model": [r[7] for r in rows], "prompt_version": [r[8] for r in rows],
                    "provenance": [json.dumps({"model": r[7], "prompt_version": r[8]}) for r in rows],
                    "run_id": [run_id] * len(rows), "stage": ["extract"] * len(rows),
                    "stage_version": [r[2] for r in rows], "config_hash": [r[3] for r in rows],
                    "source_digest": [r[1] for r in rows], "tokens": [r[5] for r in rows],
                    "cost": [r[6] for r in rows]}
        table = pa.table({k: pa.array(v, type=pa.string() if k in ("error_class", "error") else None)
                          for k, v in columns.items()})
        if writer is None:
            writer = pq.ParquetWriter(out, table.schema)
        writer.write_table(table.cast(writer.schema))
    if writer is not None:
        writer.close()
    conn.close()


# --- timing ---------------------------------------------------------------------------------------------------------

def timed(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one whole process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
    return took, usage.ru_maxrss / 1024


def rows_of(path: str) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--floor", nargs=3, metavar=("DB", "RUN", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--populate", nargs=2, metavar=("DB", "RUN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        floor(*args.floor)
        return
    if args.populate:
        seconds = populate(f"sqlite:///{args.populate[0]}", args.populate[1], args.items)
        print(f"wrote a run of {args.items:,} items in {seconds:.1f} s", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-export-") as work:
        db, run_id = f"{work}/bench.db", "rbench-export"
        # Written by a child process: this one stays small, so the children it forks to time start small (a
        # forked child's peak RSS counts its parent's pages until it execs).
        subprocess.run([sys.executable, __file__, "--populate", db, run_id, "--items", str(args.items)], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        out_export, out_floor = f"{work}/export.parquet", f"{work}/floor.parquet"
        export_cmd = [sys.executable, "-m", "conveyor", "export", run_id, "--format", "parquet", "--out", out_export,
                      "--db", f"sqlite:///{db}", "--blobs", f"{work}/blobs"]
        floor_cmd = [sys.executable, __file__, "--floor", db, run_id, out_floor]
        exports, floors, peaks = [], [], []
        for round_ in range(args.rounds):
            took, peak = timed(export_cmd)
            exports.append(took)
            peaks.append(peak)
            floors.append(timed(floor_cmd)[0])
            print(f"round {round_ + 1}: export {exports[-1]:.1f} s (peak RSS {peak:.0f} MB), floor {floors[-1]:.1f} s",
                  flush=True)
        rows, floor_rows = rows_of(out_export), rows_of(out_floor)
    export_s, floor_s, peak = statistics.median(exports), statistics.median(floors), max(peaks)
    ratio = floor_s / export_s
    rounds = ", ".join(f"{f / e:.2f}" for e, f in zip(exports, floors, strict=True))
    lines = [
        f"| `conveyor export RUN --format parquet` | {rows:,} | {export_s:.1f} | {peak:.0f} |",
        f"| floor: one SELECT + ParquetWriter | {floor_rows:,} | {floor_s:.1f} | |",
        "",
        f"Ratio floor / export: **{ratio:.2f}** (target >= 0.7: {'PASS' if ratio >= 0.7 else 'FAIL'}); peak RSS of "
        f"the export process {peak:.0f} MB (target <= 200 MB: {'PASS' if peak <= 200 else 'FAIL'}). Each round's "
        f"ratio, in order: {rounds} (export seconds {', '.join(f'{e:.1f}' for e in exports)}; floor "
        f"{', '.join(f'{f:.1f}' for f in floors)}): the machine is shared, so a round's two sides can see "
        "different loads.",
    ]
    print("\n".join(lines))
    section = "\n".join([
        BEGIN, "## Export (bench/export.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
        f"    .venv/bin/python bench/export.py --items {args.items} --rounds {args.rounds}", "",
        f"Machine: nproc {os.cpu_count()}; {platform.platform()}; Python {platform.python_version()}. "
        f"A finished run of {args.items:,} accepted items (one model stage: its task, its JSON output inline in "
        "the memo, an attempt with usage, two provenance rows) written straight into a fresh SQLite store; each "
        f"side a whole process, alternating, median of {args.rounds}.", "",
        "| export | rows | seconds | peak RSS MB |", "| --- | ---: | ---: | ---: |", *lines, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
