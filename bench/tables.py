"""Table submission benchmark: `conveyor submit` of a 1,000,000-row Parquet table against the same rows as a JSONL
manifest, on SQLite, with the no-op pipeline (bench/noop_pipeline.py).

    .venv/bin/python bench/tables.py [--items 1000000] [--rounds 1] [--no-write] [--profile]

The rows (``key``: ``item-0000042``, ``text``: about 60 bytes) are written once as ``items.jsonl`` (``{"key", "text"}``
per line: the manifest) and as ``items.parquet`` (columns ``key`` and ``text``, pyarrow's defaults). Each round
submits each of them, alternating which goes first, as a whole process into a fresh SQLite store:

- ``conveyor submit TARGET --input items.jsonl``;
- ``conveyor submit TARGET --input items.parquet --key key --text text``.

Both read and check their input (a fresh store has checked nothing), hash and store every item and queue its
first task. Prints the median items/s of each and the ratio parquet / jsonl (target >= 1.0), the same per CPU
second of the submitting process (steadier on a shared machine), and writes its section of bench/RESULTS.md.
``--profile`` runs only the readers (check and iterate, no store) under cProfile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results import markers, write_section  # noqa: E402

SCRIPT = "tables"
BEGIN, END = markers(f"{SCRIPT}.py")
TARGET = str(ROOT / "bench" / "noop_pipeline.py") + ":pipe"
TARGET_RATIO = 1.0


def write_inputs(folder: Path, items: int) -> tuple[Path, Path]:
    """The same rows as a JSONL manifest and as a Parquet table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest, table = folder / "items.jsonl", folder / "items.parquet"
    chunk = 100_000
    with manifest.open("w") as out, pq.ParquetWriter(table, pa.schema([("key", pa.string()),
                                                                        ("text", pa.string())])) as writer:
        for start in range(0, items, chunk):
            rows = range(start, min(items, start + chunk))
            keys = [f"item-{i:07d}" for i in rows]
            texts = [f"document {i}: the quick brown fox jumps over the lazy dog" for i in rows]
            out.write("".join(json.dumps({"key": k, "text": t}) + "\n" for k, t in zip(keys, texts, strict=True)))
            writer.write_table(pa.table({"key": keys, "text": texts}))
    return manifest, table


def submit(folder: Path, name: str, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `conveyor submit` process into a fresh SQLite store. The CPU seconds
    (user + system, from the child's rusage) hardly move with the machine's other load; the wall seconds do."""
    store = folder / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store}{suffix}").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "conveyor", "submit", TARGET, *args, "--db", f"sqlite:///{store}",
               "--blobs", str(folder / "blobs"), "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr}")
    print(f"  {name}: {seconds:.1f} s, {cpu:.1f} CPU s ({json.loads(proc.stdout)['expected']:,} items)", flush=True)
    return seconds, cpu


def profile(manifest: Path, table: Path) -> None:
    """The two readers alone (check, then iterate), under cProfile: where Parquet's time goes."""
    import cProfile
    import pstats

    from conveyor.service.inputs import check_input, iter_items
    from conveyor.service.tables import TableColumns, check_table, table_items

    columns = TableColumns("key", text="text")
    for name, run in (("jsonl", lambda: (check_input(manifest), sum(1 for _ in iter_items(manifest)))),
                      ("parquet", lambda: (check_table(table, columns), sum(1 for _ in table_items(table, columns))))):
        started = time.perf_counter()
        profiler = cProfile.Profile()
        profiler.runcall(run)
        print(f"{name}: {time.perf_counter() - started:.2f} s (under the profiler)")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    parser.add_argument("--profile", action="store_true", help="profile the readers alone, then stop")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-tables-") as scratch:
        folder = Path(scratch)
        started = time.perf_counter()
        manifest, table = write_inputs(folder, options.items)
        print(f"wrote {options.items:,} rows as JSONL ({manifest.stat().st_size / 1e6:.0f} MB) and Parquet "
              f"({table.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s", flush=True)
        if options.profile:
            profile(manifest, table)
            return
        runs: dict[str, list[float]] = {"jsonl": [], "parquet": []}
        cpus: dict[str, list[float]] = {"jsonl": [], "parquet": []}
        commands = {"jsonl": ["--input", str(manifest)],
                    "parquet": ["--input", str(table), "--key", "key", "--text", "text"]}
        for round_ in range(options.rounds):
            print(f"round {round_ + 1}", flush=True)
            order = ["jsonl", "parquet"] if round_ % 2 == 0 else ["parquet", "jsonl"]
            for name in order:
                wall, cpu = submit(folder, name, commands[name])
                runs[name].append(wall)
                cpus[name].append(cpu)
    rate = {name: options.items / statistics.median(seconds) for name, seconds in runs.items()}
    cpu_rate = {name: options.items / statistics.median(seconds) for name, seconds in cpus.items()}
    ratio, cpu_ratio = rate["parquet"] / rate["jsonl"], cpu_rate["parquet"] / cpu_rate["jsonl"]
    rounds = "; ".join(f"{j / p:.2f}" for j, p in zip(runs["jsonl"], runs["parquet"], strict=True))
    print(f"jsonl {rate['jsonl']:,.0f} items/s, parquet {rate['parquet']:,.0f} items/s, ratio {ratio:.2f} "
          f"(target >= {TARGET_RATIO}; per round: {rounds}); per CPU second: jsonl {cpu_rate['jsonl']:,.0f}, "
          f"parquet {cpu_rate['parquet']:,.0f}, ratio {cpu_ratio:.2f}")
    if not options.no_write:
        write_section(f"{SCRIPT}.py", section(options, runs, cpus, rate, ratio, cpu_ratio))


def section(options: argparse.Namespace, runs: dict[str, list[float]], cpus: dict[str, list[float]],
            rate: dict[str, float], ratio: float, cpu_ratio: float) -> str:
    seconds = {name: ", ".join(f"{s:.1f}" for s in values) for name, values in runs.items()}
    cpu = {name: ", ".join(f"{s:.1f}" for s in values) for name, values in cpus.items()}
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    return "\n".join([
        BEGIN,
        "## Submitting a table: Parquet beside JSONL (bench/tables.py)",
        "",
        f"`conveyor submit` of {options.items:,} rows into a fresh SQLite store with the no-op pipeline, each a whole "
        "process: the rows as a Parquet table (`--key key --text text`) against the same rows as a JSONL manifest; "
        f"{options.rounds} round(s), alternating which goes first. {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} cores (shared with other work).",
        "",
        "| input | seconds per round | CPU seconds per round | items/s (median) |",
        "| --- | --- | --- | --- |",
        f"| JSONL manifest | {seconds['jsonl']} | {cpu['jsonl']} | {rate['jsonl']:,.0f} |",
        f"| Parquet table | {seconds['parquet']} | {cpu['parquet']} | {rate['parquet']:,.0f} |",
        "",
        f"Parquet / JSONL: **{ratio:.2f}** in items/s ({verdict} the target of >= {TARGET_RATIO}); "
        f"{cpu_ratio:.2f} in items per CPU second (user + system of the submitting process, which the machine's "
        "other load hardly moves). Run with `make bench-tables`.",
        END,
    ])


if __name__ == "__main__":
    main()
