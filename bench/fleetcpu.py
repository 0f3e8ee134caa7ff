"""CPU per task on the fleet path, PostgreSQL: conveyor's two workers and the whole server, beside the minimal floor.

    .venv/bin/python bench/fleetcpu.py ROUNDS URL PGDATA NAME=SRC [NAME=SRC ...] [--items 20000]

Needs a PostgreSQL cluster of its own (URL its admin database, PGDATA its data folder, on this machine): the
server's CPU is every process of that cluster, from /proc (the postmaster's children, exited ones included
through its reaped time: backends, WAL writer, checkpointer), so nothing else may use it meanwhile. For each
round, each tree in turn (``conveyor submit`` and two ``conveyor worker --until-idle`` with ``PYTHONPATH=SRC``,
as bench/fleet_ab.py), then the minimal floor (bench/minifloor.py, its seed not counted): the workers' CPU and
the server's, per task (item-stage), and the rate on the issue's clock. Wall rates move with the host's load;
CPU per task much less, and conveyor / minimal floor is about what their CPU per task says on a host whose two
cores they fill (the workers' start-up, about 0.27 s of CPU each, is in their figure: 9 us a task at 20,000
items).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine
import minifloor

TICK = os.sysconf("SC_CLK_TCK")


def cluster_cpu(pgdata: str) -> float:
    """User+system seconds of the cluster's postmaster and every process it started (exited ones reaped into its
    own children's time)."""
    postmaster = int(Path(pgdata, "postmaster.pid").read_text().split()[0])
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == postmaster:
            total += sum(int(f) for f in fields[11:15]) / TICK
        elif int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rounds", type=int)
    parser.add_argument("url")
    parser.add_argument("pgdata")
    parser.add_argument("trees", nargs="+", metavar="NAME=SRC")
    parser.add_argument("--items", type=int, default=20_000)
    args = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in args.trees)
    n, work = args.items, Path(tempfile.mkdtemp(prefix="conveyor-fleetcpu-"))
    tasks = 3 * n
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in [*trees, "minimal floor"]}
    try:
        manifest = engine.write_manifest(work / "manifest.jsonl", n)
        payloads = engine.minifloor_payloads(manifest)
        with engine.pg_stores(args.url) as stores:
            for round_ in range(args.rounds):
                for name, src in trees.items():
                    os.environ["PYTHONPATH"] = src
                    db = next(stores)
                    run_id = engine.submit_noop(manifest, db, work / "blobs")
                    before = cluster_cpu(args.pgdata)
                    timing = engine.drain_noop(run_id, db, work / "blobs", tasks, name)
                    server = cluster_cpu(args.pgdata) - before
                    figures[name].append((timing.cpu / tasks * 1e6, server / tasks * 1e6,
                                          tasks / engine.job_span(db, run_id)))
                    _print(round_, name, figures[name][-1], timing.load)
                db = next(stores)
                table = minifloor.MiniTable(db)
                table.create(payloads)
                table.close()
                before, cpu = cluster_cpu(args.pgdata), engine._cpu_seconds()
                procs = [subprocess.Popen([sys.executable, minifloor.__file__, "worker", db], stdout=subprocess.PIPE,
                                          text=True) for _ in range(2)]
                stamps = [json.loads(proc.communicate()[0]) for proc in procs]
                server, cpu = cluster_cpu(args.pgdata) - before, engine._cpu_seconds() - cpu
                span = max(s["last"] for s in stamps if s["first"]) - min(s["first"] for s in stamps if s["first"])
                figures["minimal floor"].append((cpu / tasks * 1e6, server / tasks * 1e6, tasks / span))
                _print(round_, "minimal floor", figures["minimal floor"][-1], os.getloadavg()[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    floor = statistics.median(w + s for w, s, _ in figures["minimal floor"])
    for name, rows in figures.items():
        total = statistics.median(w + s for w, s, _ in rows)
        print(f"{name}: medians workers {statistics.median(w for w, _, _ in rows):.1f} + server "
              f"{statistics.median(s for _, s, _ in rows):.1f} = {total:.1f} us of CPU a task, "
              f"{statistics.median(r for _, _, r in rows):,.0f} item-stages/s; minimal floor's CPU / this = "
              f"{floor / total:.2f}")
    return 0


def _print(round_: int, name: str, figure: tuple[float, float, float], load: float) -> None:
    workers, server, rate = figure
    print(f"round {round_} {name}: workers {workers:.1f} + server {server:.1f} us of CPU a task, {rate:,.0f} "
          f"item-stages/s, load {load:.1f}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
