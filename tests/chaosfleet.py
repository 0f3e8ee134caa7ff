"""What the chaos suite (tests/test_chaos.py, `make chaos`) runs its scenarios with: a private PostgreSQL cluster
it may restart at will (never the machine's shared server), four supervised worker processes, a client that
submits in batches while the chaos goes on, and a publish ledger that tells effects from invocations."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.apiserver import free_port
from tests.helpers import SRC, query

# parse → enrich → publish. enrich sleeps long enough (CHAOS_ENRICH_S) that the four workers are busy the whole
# time the chaos lasts, so that every blow lands on leased work. enrich's output (about 10 KiB) is past the 8 KiB
# kept inline, so every item goes through the blob store, and carries its own sha256 for publish to check what it
# read. publish is idempotent on ctx.idempotency_key, as users are told to write one: the ledger's effect lands only
# when the key has none yet; every call of its body is recorded too.
PIPELINE = """
    import hashlib, os, sqlite3, time
    from conveyor import Pipeline, Retry

    pipe = Pipeline("chaos", lease_seconds=5, retry=Retry(max_attempts=40, base=0.5, cap=4))

    @pipe.stage
    def parse(ctx, source: bytes) -> dict:
        return {"text": source.decode()}

    @pipe.stage(after=parse)
    def enrich(ctx, doc: dict) -> dict:
        time.sleep(float(os.environ["CHAOS_ENRICH_S"]))
        body = hashlib.sha256(doc["text"].encode()).hexdigest() * 160
        return {"text": doc["text"], "body": body, "sha256": hashlib.sha256(body.encode()).hexdigest()}

    @pipe.stage(after=enrich, kind="publish")
    def publish(ctx, doc: dict) -> None:
        intact = hashlib.sha256(doc["body"].encode()).hexdigest() == doc["sha256"]
        db = sqlite3.connect(os.environ["CHAOS_LEDGER"], timeout=60, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO invocations VALUES (?, ?, ?, ?, ?, ?)",
                       (ctx.idempotency_key, ctx.item_key, ctx.run_id, ctx.attempt, os.getpid(), int(intact)))
            if db.execute("SELECT 1 FROM effects WHERE key = ?", (ctx.idempotency_key,)).fetchone() is None:
                db.execute("INSERT INTO effects VALUES (?, ?, ?, ?)",
                           (ctx.idempotency_key, ctx.item_key, ctx.run_id, time.time()))
            db.execute("COMMIT")
        finally:
            db.close()
"""

LEDGER_SCHEMA = """
CREATE TABLE invocations (key TEXT, item TEXT, run_id TEXT, attempt INTEGER, pid INTEGER, intact INTEGER);
CREATE TABLE effects (key TEXT, item TEXT, run_id TEXT, at REAL);
"""


def chaos_seconds() -> float:
    """How long each scenario's chaos lasts: CHAOS_SECONDS, 300 by default."""
    return float(os.environ.get("CHAOS_SECONDS", "300"))


def chaos_items() -> int:
    """How many items the client submits over a scenario: CHAOS_ITEMS, 3000 by default."""
    return int(os.environ.get("CHAOS_ITEMS", "3000"))


# --- a private PostgreSQL ---------------------------------------------------------------------------------


class PrivatePostgres:
    """A cluster of its own, made with the machine's initdb/pg_ctl in a temp folder on a free port: the one the
    chaos restarts. As root it runs as the `postgres` user (initdb refuses root), as scripts/ensure-postgres.sh
    does."""

    def __init__(self) -> None:
        bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
        if not bindirs:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql: install Debian's postgresql")
        self.bin = Path(bindirs[-1])
        self.folder = Path(tempfile.mkdtemp(prefix="conveyor-chaos-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.restarts = 0
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.folder, "postgres")
        (self.folder / "run").mkdir()
        if self.as_user:
            shutil.chown(self.folder / "run", "postgres")

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def start(self) -> None:
        subprocess.run([*self.as_user, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A",
                        "trust", "--no-sync"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=120)
        options = (f"-p {self.port} -k {self.folder / 'run'} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c max_connections=100")
        self._ctl("-l", str(self.folder / "server.log"), "-w", "-t", "60", "-o", options, "start")

    def restart(self, mode: str) -> None:
        """``pg_ctl restart -m fast`` (sessions ended, a clean shutdown) or ``-m immediate`` (a crash: recovery
        at start)."""
        self._ctl("-w", "-t", "60", "-m", mode, "restart")
        self.restarts += 1

    def stop(self) -> None:
        try:
            self._ctl("-w", "-t", "60", "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.stop()


def clock_ahead(seconds: int) -> dict[str, str]:
    """The environment that puts a process's wall clock ``seconds`` ahead: what `faketime -f +60s` sets, without
    its wrapper process (which would stand between the supervisor's signals and the worker). The monotonic clock
    moves by as much, harmlessly (it is only ever compared with itself): libfaketime 0.9.10's
    FAKETIME_DONT_FAKE_MONOTONIC=1 makes every ``time.sleep`` fail with EINVAL (Python sleeps with an absolute
    clock_nanosleep on the monotonic clock)."""
    libraries = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not libraries:
        raise RuntimeError("no libfaketime: install Debian's faketime (scripts/ensure-tools.sh does)")
    return {"LD_PRELOAD": libraries[0], "FAKETIME": f"+{seconds}s", "FAKETIME_NO_CACHE": "1"}


# --- supervised workers -----------------------------------------------------------------------------------


class Supervisor:
    """Runs one worker process per slot and starts it again whenever it exits, as a Deployment or systemd
    `Restart=always` would; counts the restarts. ``stop`` sends SIGTERM (a drain) and records the exit codes."""

    def __init__(self, argv: list[str], env: Callable[[int], dict[str, str]], logs: Path, slots: int) -> None:
        self.argv, self.env, self.logs, self.slots = argv, env, logs, slots
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * slots
        self.restarts = [0] * slots
        self.exits: list[tuple[int, int]] = []  # (slot, exit code) of every exit the supervisor restarted
        self.final: list[int | None] = [None] * slots
        self.stats: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stopping = False
        self.threads = [threading.Thread(target=self._keep, args=(slot,), daemon=True) for slot in range(slots)]
        logs.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _keep(self, slot: int) -> None:
        for life in range(10_000):
            out = self.logs / f"worker{slot}-{life}.out"
            with self.lock:
                if self.stopping:
                    return
                with out.open("wb") as stdout, (self.logs / f"worker{slot}-{life}.err").open("wb") as stderr:
                    # A session of its own: signals go to its process group, so a worker under a wrapper
                    # (faketime forks it) gets them itself.
                    proc = subprocess.Popen(self.argv, env=self.env(slot), stdin=subprocess.DEVNULL, stdout=stdout,
                                            stderr=stderr, start_new_session=True)
                self.procs[slot] = proc
            code = proc.wait()
            self._read_stats(slot, out)
            with self.lock:
                if self.stopping:
                    self.final[slot] = code
                    return
                self.exits.append((slot, code))
                self.restarts[slot] += 1
            time.sleep(1.0)

    def _read_stats(self, slot: int, out: Path) -> None:
        text = out.read_text().strip()
        if text:
            self.stats.append({**json.loads(text.splitlines()[-1]), "slot": slot})

    def signal(self, slot: int, sig: int) -> None:
        with self.lock:
            proc = self.procs[slot]
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, sig)

    def all_alive(self) -> bool:
        with self.lock:
            return all(proc is not None and proc.poll() is None for proc in self.procs)

    def stop(self, timeout: float = 90.0) -> None:
        with self.lock:
            self.stopping = True
            for proc in self.procs:
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGTERM)
        for thread in self.threads:
            thread.join(timeout)
        with self.lock:
            for proc in self.procs:
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def stderr(self) -> str:
        return "".join(path.read_text(errors="replace") for path in sorted(self.logs.glob("worker*.err")))


# --- the submitting client ----------------------------------------------------------------------------------


@dataclass
class Client:
    """Submits ``batches`` folders of items spread over ``seconds``, each with `conveyor submit`, trying the same
    command again (which finishes a run whose submission stopped part way) until it exits 0."""

    target: str
    db: str
    blobs: str
    env: dict[str, str]
    folder: Path
    items: int
    batches: int
    seconds: float
    run_ids: list[str] = field(default_factory=list)
    item_keys: list[str] = field(default_factory=list)
    failed_submits: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._submit_all, daemon=True)
        self.submitting = threading.Event()  # set while a `conveyor submit` runs

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the client did not finish submitting"

    def _submit_all(self) -> None:
        per_batch = self.items // self.batches
        began = time.monotonic()
        for batch in range(self.batches):
            time.sleep(max(0.0, began + batch * self.seconds / self.batches - time.monotonic()))
            docs = self.folder / f"batch{batch}"
            docs.mkdir(parents=True)
            for i in range(per_batch):
                key = f"b{batch}-{i:05d}.txt"
                (docs / key).write_text(f"batch {batch} item {i}: the quick brown fox\n")
                self.item_keys.append(key)
            self.run_ids.append(self._submit(docs))

    def _submit(self, docs: Path) -> str:
        while True:
            cmd = [sys.executable, "-m", "conveyor", "submit", self.target, "--input", str(docs), "--db", self.db,
                   "--blobs", self.blobs, "--json"]
            self.submitting.set()
            try:
                proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                self.failed_submits += 1
                self.errors.append("timed out")
                continue
            finally:
                self.submitting.clear()
            if proc.returncode == 0:
                return str(json.loads(proc.stdout)["run_id"])
            self.failed_submits += 1
            said = proc.stderr.strip().splitlines()
            self.errors.append(said[-1] if said else f"exit {proc.returncode}")
            time.sleep(1.0)


# --- the fleet, and what is checked after --------------------------------------------------------------------


@dataclass
class Figures:
    scenario: str
    items: int = 0
    runs: int = 0
    wall_s: float = 0.0
    chaos_events: int = 0
    pg_restarts: int = 0
    worker_restarts: int = 0
    failed_submits: int = 0
    retries_by_class: dict[str, int] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # one failed attempt's message per class
    outcomes: dict[str, int] = field(default_factory=dict)
    unaccounted: int = 0
    invocations: int = 0
    effects: int = 0
    duplicate_effects: int = 0
    unstable_keys: int = 0  # items whose publish ran under more than one idempotency key
    corrupt_reads: int = 0
    store_outages: int = 0
    note: str = ""


class Fleet:
    """The store, the blobs, four supervised workers and the client, for one scenario."""

    def __init__(self, folder: Path, db: str, blobs: str, env: dict[str, str] | None = None, workers: int = 4,
                 slot_env: Callable[[int], dict[str, str]] = lambda slot: {}) -> None:
        from tests.helpers import write_pipeline

        self.folder, self.db, self.blobs = folder, db, blobs
        self.target = write_pipeline(folder, PIPELINE, name="chaos_pipeline.py")
        self.ledger = folder / "ledger.sqlite"
        with sqlite3.connect(self.ledger) as conn:
            conn.executescript(LEDGER_SCHEMA)
        enrich_s = 0.9 * chaos_seconds() * workers / chaos_items()
        self.env = {**os.environ, "PYTHONPATH": SRC, "CHAOS_LEDGER": str(self.ledger),
                    "CHAOS_ENRICH_S": f"{enrich_s:.3f}", **(env or {})}
        worker = [sys.executable, "-m", "conveyor", "worker", self.target, "--db", db, "--blobs", blobs,
                  "--batch-size", "10", "--json", "-q"]
        self.supervisor = Supervisor(worker, lambda slot: {**self.env, **slot_env(slot)}, folder / "logs", workers)
        self.client = Client(self.target, db, blobs, self.env, folder / "inputs", chaos_items(), 12,
                             chaos_seconds() * 0.8)
        self.began = 0.0

    def start(self) -> None:
        self.began = time.monotonic()
        self.supervisor.start()
        self.client.start()

    def wait_done(self, timeout: float) -> None:
        """Until the client has submitted everything and no task is open."""
        self.client.join(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                left = query(self.db, "SELECT COUNT(*) FROM tasks WHERE status IN ('queued', 'running')")[0][0]
            except Exception as exc:  # the store is still coming back from the last restart
                left = f"unreachable ({exc})"
            if left == 0:
                return
            assert time.monotonic() < deadline, f"tasks still open after {timeout:.0f}s: {left}"
            time.sleep(1.0)

    def finish(self, scenario: str) -> Figures:
        """Stop the workers (SIGTERM), reconcile every run with `conveyor reconcile --json`, read the ledger."""
        wall = time.monotonic() - self.began
        alive = self.supervisor.all_alive()
        self.supervisor.stop()
        figures = Figures(scenario, items=len(self.client.item_keys), runs=len(self.client.run_ids), wall_s=wall,
                          worker_restarts=sum(self.supervisor.restarts), failed_submits=self.client.failed_submits)
        for run_id in self.client.run_ids:
            report = self.reconcile(run_id)
            figures.unaccounted += report["unaccounted"] + len(report["not_done"])
            for name, count in report["outcomes"].items():
                figures.outcomes[name] = figures.outcomes.get(name, 0) + count
            for name, count in report["attempt_errors"].items():
                figures.retries_by_class[name] = figures.retries_by_class.get(name, 0) + int(count)
        figures.store_outages = sum(int(s.get("store_outages", 0)) for s in self.supervisor.stats)
        self._read_ledger(figures)
        figures.messages = {str(k): str(m)[:300] for k, m in query(
            self.db, "SELECT error_class, MIN(message) FROM attempts WHERE error_class IS NOT NULL GROUP BY 1")}
        if self.client.errors:
            figures.messages["submit"] = self.client.errors[0][:300]
        corrupt = query(self.db, "SELECT COUNT(*) FROM attempts WHERE error_class = 'blob_corrupt'")[0][0]
        figures.corrupt_reads += int(corrupt)
        figures.note = "" if alive else "a worker was between restarts at the end"
        return figures

    def reconcile(self, run_id: str) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-m", "conveyor", "reconcile", run_id, "--db", self.db, "--blobs",
                               self.blobs, "--json", "--sample", "0"], env=self.env, capture_output=True,
                              text=True, timeout=300)
        assert proc.stdout.strip(), proc.stderr
        data: dict[str, Any] = json.loads(proc.stdout)
        return data

    def _read_ledger(self, figures: Figures) -> None:
        with sqlite3.connect(self.ledger) as conn:
            figures.invocations = conn.execute("SELECT COUNT(*) FROM invocations").fetchone()[0]
            figures.effects = conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0]
            # An item whose effect landed more than once: under one key (the publish was not idempotent) or under
            # two (the key was not stable across redeliveries).
            figures.duplicate_effects = conn.execute(
                "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) AS n FROM effects GROUP BY item)").fetchone()[0]
            figures.unstable_keys = conn.execute(
                "SELECT COUNT(*) FROM (SELECT item FROM invocations GROUP BY item HAVING COUNT(DISTINCT key) > 1)"
            ).fetchone()[0]
            figures.corrupt_reads = conn.execute("SELECT COUNT(*) FROM invocations WHERE intact = 0").fetchone()[0]
            published = {row[0] for row in conn.execute("SELECT DISTINCT item FROM effects")}
        missing = set(self.client.item_keys) - published
        assert not missing, f"{len(missing)} items have no publish effect, e.g. {sorted(missing)[:5]}"

    def stop(self) -> None:
        """Whatever state the test ended in, no process of this fleet is left behind."""
        self.supervisor.stop(timeout=30)


def check(figures: Figures, fleet: Fleet) -> None:
    """What must hold after every scenario."""
    supervisor = fleet.supervisor
    assert figures.unaccounted == 0, f"items without an outcome: {figures}"
    assert figures.outcomes == {"published": figures.items}, f"not every item published: {figures.outcomes}"
    assert figures.duplicate_effects == 0, f"a publish effect happened twice: {figures}"
    assert figures.unstable_keys == 0, f"a redelivered publish got another idempotency key: {figures}"
    assert figures.corrupt_reads == 0, f"a corrupt blob was read: {figures}"
    assert figures.effects == figures.items, figures
    assert all(code == 0 for code in supervisor.final), f"workers did not drain cleanly: {supervisor.final}"
    assert "Traceback" not in supervisor.stderr(), supervisor.stderr()[-4000:]
    raw = [line for line in fleet.client.errors if not line.startswith("error: ")]
    assert raw == [], f"a submission failed with more than a one-line error: {raw}"


def record(figures: Figures, how: str) -> None:
    """Print the figures and write them as the scenario's section of bench/RESULTS.md."""
    from bench.results import markers, write_section

    print(json.dumps(figures.__dict__, indent=1, sort_keys=True))
    script = f"chaos-{figures.scenario}"
    begin, end = markers(script)
    retries = ", ".join(f"{k} {v}" for k, v in sorted(figures.retries_by_class.items())) or "none"
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(figures.outcomes.items()))
    lines = [
        begin,
        f"## Chaos: {figures.scenario} (`make chaos`, tests/test_chaos.py)",
        "",
        f"{how} Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, CHAOS_SECONDS="
        f"{chaos_seconds():g}, on the 2-core development machine.",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| items (runs) | {figures.items} ({figures.runs}) |",
        f"| wall time, first submit to last task | {figures.wall_s:.0f} s |",
        f"| chaos events | {figures.chaos_events} |",
        f"| PostgreSQL restarts | {figures.pg_restarts} |",
        f"| worker restarts by the supervisor | {figures.worker_restarts} |",
        f"| workers' store outages waited out | {figures.store_outages} |",
        f"| submissions tried again | {figures.failed_submits} |",
        f"| outcomes | {outcomes} |",
        f"| items without an outcome | {figures.unaccounted} |",
        f"| failed attempts by class | {retries} |",
        f"| publish bodies run / effects landed | {figures.invocations} / {figures.effects} |",
        f"| duplicate effects | {figures.duplicate_effects} |",
        f"| items published under more than one idempotency key | {figures.unstable_keys} |",
        f"| corrupt reads | {figures.corrupt_reads} |",
        end,
    ]
    write_section(script, "\n".join(lines))
