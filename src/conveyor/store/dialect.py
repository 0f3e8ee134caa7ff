"""The few things SQLite and PostgreSQL do differently, chosen by URL.

Every query in ``store`` is written once with ``?`` placeholders; a dialect
turns it into what its driver wants and owns the connection's transactions.
"""

from __future__ import annotations

import fcntl
import functools
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import orjson

from conveyor.errors import UserError
from conveyor.store.bulk import CopiedRows, copied_insert, copied_update, first_per_key, json_update
from conveyor.store.checkpointer import Checkpointer
from conveyor.store.errortext import POSTGRES_ERROR_TEXT, SQLITE_DROP_INSERT_TRIGGER, SQLITE_ERROR_TEXT
from conveyor.store.memokey import KEY64_SQL, SQLITE_FUNCTION, key64
from conveyor.store.sqlitemany import ManyRows

if TYPE_CHECKING:
    import psycopg

# Item keys compare byte by byte, whatever the database's locale (a root's fan-out descendants are one range).
BYTE_ORDERED_KEYS = "\n".join(
    f'ALTER TABLE {table} ALTER COLUMN {column} TYPE TEXT COLLATE "C";'
    for table, column in (("items", "item_key"), ("items", "root_key"), ("items", "parent_key"),
                          ("tasks", "item_key"), ("tasks", "root_key")))

# The full-text index of live publications. SQLite: an FTS5 index over publications.text (external content:
# the text is stored once), holding the live versions only (store/publications.py adds and removes entries
# in the transaction that changes what is live). PostgreSQL: a tsvector generated from the text, with a GIN
# index restricted to the live versions; at most a million bytes of lexemes fit a tsvector, so it is made
# from the first 250,000 characters.
SQLITE_TEXT_INDEX = "CREATE VIRTUAL TABLE publication_fts USING fts5(text, content='publications', content_rowid='id')"
POSTGRES_TEXT_INDEX = """ALTER TABLE publications ADD COLUMN text_index tsvector
    GENERATED ALWAYS AS (to_tsvector('simple', left(coalesce(text, ''), 250000))) STORED;
CREATE INDEX publications_text ON publications USING GIN (text_index) WHERE live = 1;"""


class Dialect(Protocol):
    name: str
    types: dict[str, str]
    has_table: str  # counts the tables named ? that the store's connection sees
    local_clock: bool  # the store's clock is this machine's (one machine, one clock)
    row_lock: str  # appended to a SELECT to hold its rows until the transaction ends
    wakes_on_notify: bool  # wait_for_work returns as soon as another process queues work
    skip_locked: str
    in_chunk: int  # the most values one one_of may take
    max_params: int

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def execute_binary(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """``execute``, the rows sent in the backend's binary form where it has one (large byte values: a quarter of
        the time of PostgreSQL's hex text on the wire)."""
        ...

    def glob(self, pattern: str) -> tuple[str, str]:
        """The operator and the parameter that match a text column against a shell-style ``pattern`` (``*``,
        ``?``, ``[abc]``, ``[!abc]``; case-sensitive): ``f"item_key {op} ?"``."""
        ...

    def execute_rowcount(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def executemany_count(self, sql: str, rows: Sequence[Sequence[Any]]) -> int: ...

    def insert_many(self, sql: str, rows: Sequence[Sequence[Any]], key: Sequence[int]) -> int:
        """``executemany_count`` of a one-row ``INSERT ... VALUES`` whose rows conflict on ``key`` (positions in a
        row): the rows inserted or updated. On PostgreSQL, COPY and one statement (store/bulk.py)."""
        ...

    def insert_many_returning(self, sql: str, rows: Sequence[Sequence[Any]],
                              key: Sequence[int]) -> list[tuple[Any, ...]]:
        """``insert_many`` of a statement ending in ``RETURNING ...``: every row it returned (in no set order)."""
        ...

    def insert_numbered(self, sql: str, rows: Sequence[Sequence[Any]], table: str) -> list[int] | None:
        """Inside the caller's transaction, ``rows`` of a one-row ``INSERT`` into ``table`` (whose ``id`` is its
        auto-increment key) written as new rows, all of them: their ids, in the order of ``rows``; or None, and
        nothing written, when one of them meets a row already there (the caller then goes the statement's own
        way: ``insert_many_returning``, its conflict clause deciding). The ids are known without a RETURNING."""
        ...

    def update_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """``executemany_count`` of a one-row ``UPDATE ... SET c = ? ... WHERE k = ? ...`` whose rows name distinct
        rows (by their ``WHERE`` values): the rows changed. On PostgreSQL, COPY and one statement (store/bulk.py)."""
        ...

    def one_of(self, column: str, values: Sequence[Any], kind: str) -> tuple[str, list[Any]]:
        """``column`` is one of ``values`` (at most ``in_chunk`` of them; ``kind``: "bigint" or "text"): the
        condition and its parameters. ``IN (?, ...)`` on SQLite; ``= ANY(?)`` of one array on PostgreSQL, one
        statement text for any count (a list of ? is parsed by psycopg for every call, and prepared never)."""
        ...

    def append(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Add rows to a table with no unique constraint to check (the attempts log), fastest way."""
        ...

    def executemany_returning(self, sql: str, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """executemany of a statement with RETURNING: every row it returned."""
        ...

    def transaction(self) -> Any: ...

    def pipelined(self) -> AbstractContextManager[None]:
        """The block's statements sent without waiting for each one's answer where the backend can (PostgreSQL's
        pipeline mode: one round trip for the block); an error of one surfaces by the block's end at the latest.
        Only for statements whose results the block does not read."""
        ...

    def refresh_statistics(self, tables: Sequence[str], columns: Mapping[str, Sequence[str]] | None = None) -> None:
        """Bring the planner's picture of ``tables`` up to date after a bulk load (of only ``columns[table]``,
        when given, once the table grew)."""
        ...

    def clock(self) -> float:
        """The store's time (epoch seconds): every machine of a fleet reads the same clock here."""
        ...

    def lock(self, name: str) -> None:
        """Hold a lock named ``name`` until the current transaction ends (writers of one store exclude
        each other already where the backend has a single writer)."""
        ...

    def notify(self) -> None: ...

    def wait_for_work(self, timeout: float) -> None: ...

    def lost(self) -> bool:
        """True when the connection is gone (the server restarted or ended it, the network failed): the next
        call opens a new one, so a caller that waits and tries again carries on."""
        ...

    def conflicted(self, exc: BaseException) -> bool:
        """True when ``exc`` is the database refusing a transaction for another's sake (a deadlock, a
        serialization failure): it was rolled back whole, and making it again is safe."""
        ...

    def checkpointing(self) -> AbstractContextManager[None]:
        """While the block runs, the store's log is written back in the background where that is the backend's
        own work at close (SQLite's WAL: store/checkpointer.py); elsewhere nothing."""
        ...

    def close(self) -> None: ...


class WriterLock:
    """An advisory file lock that SQLite writers of one store queue on, beside SQLite's own lock.

    SQLite makes a writer that finds the database locked sleep and retry, for up to 100 ms a
    time, so with several worker processes the write lock often sits free while every waiter
    sleeps. Waiting on ``flock`` instead wakes the next writer the moment the lock is released.
    A thread that already holds the lock through another connection to the same file does not
    wait on it again (that would wait forever); it falls back to SQLite's busy timeout.
    """

    _held: ClassVar[dict[tuple[str, int], int]] = {}  # (lock path, thread id) -> depth
    _guard = threading.Lock()

    def __init__(self, db_path: str) -> None:
        # The real path: a store opened through a symlink queues on the same lock as through its target.
        self.path = os.path.realpath(db_path) + ".lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    @contextmanager
    def held(self) -> Iterator[None]:
        key = (self.path, threading.get_ident())
        with self._guard:
            nested = key in self._held
            self._held[key] = self._held.get(key, 0) + 1
        try:
            if not nested:
                fcntl.flock(self.fd, fcntl.LOCK_EX)  # releases the GIL while it waits
            try:
                yield
            finally:
                if not nested:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            with self._guard:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]

    def close(self) -> None:
        os.close(self.fd)


# SQLite's page cache per connection, MiB (CONVEYOR_SQLITE_CACHE_MB sets it for every process). A `conveyor
# worker` takes the small one: it is most of a worker's memory (one worker over 20,000 items: 70 MB peak RSS at
# 16 MiB, 115 MB at 64 MiB, in the same time). Other processes keep the large one: a cached re-run copies the
# rows of the run before it, and ran about 10% slower at 16 MiB (bench/RESULTS.md).
SQLITE_CACHE_MB = 64
WORKER_SQLITE_CACHE_MB = 16
ENV_SQLITE_CACHE = "CONVEYOR_SQLITE_CACHE_MB"


def sqlite_cache_kib(env: Any = os.environ) -> int:
    raw = env.get(ENV_SQLITE_CACHE)
    if not raw:
        return SQLITE_CACHE_MB * 1024
    try:
        mib = float(raw)
    except ValueError:
        mib = 0.0
    if not 0 < mib <= 65536:
        raise UserError(f"{ENV_SQLITE_CACHE}={raw!r}: expected MiB of SQLite page cache per connection, "
                        f"a number > 0 (default {SQLITE_CACHE_MB}, {WORKER_SQLITE_CACHE_MB} in a worker)")
    return max(1, int(mib * 1024))


# From this many rows an insert_many on PostgreSQL goes through COPY (fewer: executemany's pipeline).
COPY_FROM = 16
DIRECT_PAUSE = 32  # batches of a statement that go the staged way after its direct COPY met an existing row
# The savepoint of a direct COPY (PostgreSQL): rolled back to when the rows meet a unique key, else left to the end
# of the transaction (its RELEASE would cost a round trip of its own; a COPY after it opens one of the same name,
# and a rollback goes to the latest). Named apart from psycopg's own (_pg3_N).
DIRECT_SAVEPOINT = "conveyor_direct"
# The column types a COPY sends in PostgreSQL's binary form (psycopg's C dumper of the column's own type, set_types):
# the client writes no text spelling of numbers and bytes (the text form wrote bytea through two Python-level
# dumpers a value); the server's CPU is the same either way (bench/RESULTS.md). A value of another Python type than
# its column's is refused by the dumper before the row is sent (the COPY then goes back to its savepoint and again
# as text); an ``integer`` column's values are checked against its range first, since that dumper writes the low
# 32 bits of a larger number where the text form is refused (``_ints_fit``).
BINARY_COPY_TYPES = frozenset(("text", "bigint", "integer", "double precision", "bytea"))
INT4_RANGE = (-(2**31), 2**31 - 1)
WAKE_POLL_S = 0.01  # how often an idle SQLite worker looks for a commit
CLOSE_WAIT_S = 5.0  # how long close waits for a PostgreSQL wait_for_work it woke (else it leaves the listener open)
# PostgreSQL's statistics of a table are refreshed (refresh_statistics) once more rows than this share of what
# they counted, plus STALE_ROWS, were written since (autovacuum's own rule, which a server may have switched off).
STALE_SHARE, STALE_ROWS = 0.2, 1_000


@functools.cache
def _new_rows_only(sql: str) -> str:
    """A one-row ``INSERT`` whose conflict clause, if any, is ``DO NOTHING``: a row that meets one is skipped."""
    return sql.partition("ON CONFLICT")[0].rstrip() + " ON CONFLICT DO NOTHING"


class SqliteDialect:
    """SQLite tuned for a queue: WAL, BEGIN IMMEDIATE, a long busy timeout, writers queued on a file lock."""

    name = "sqlite"
    has_table = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
    types: ClassVar[dict[str, str]] = {
        "id": "INTEGER PRIMARY KEY", "real": "REAL", "blob": "BLOB", "without_rowid": " WITHOUT ROWID",
        "key64": KEY64_SQL["sqlite"], "byte_ordered_keys": "", "publication_text_index": SQLITE_TEXT_INDEX,
        "task_error_text": SQLITE_ERROR_TEXT, "items_stage_index_drop": "DROP INDEX IF EXISTS tasks_run_stage_key",
        "bytes_order": "", "attempt_minute": "CAST(CAST((started_at + COALESCE(duration, 0)) / 60 AS INTEGER) AS TEXT)",
        "attempt_second": "CAST(started_at + COALESCE(duration, 0) AS INTEGER)",
        "epoch_second": "CAST(available_at AS INTEGER)", "task_error_text_insert_drop": SQLITE_DROP_INSERT_TRIGGER}
    skip_locked = ""
    in_chunk = 900  # values per one_of: under SQLite's limit of bound parameters
    row_lock = ""  # one writer at a time: a row read in a write transaction is held already
    max_params = 30000
    local_clock = True
    wakes_on_notify = True  # by watching for commits (wait_for_work)

    @staticmethod
    def glob(pattern: str) -> tuple[str, str]:
        return "GLOB", pattern.replace("[!", "[^")  # SQLite's GLOB is the shell's, but a set's complement is [^abc]

    def __init__(self, path: str) -> None:
        import sqlite3

        from conveyor.store.sqlitevec import register

        register()  # before connecting: sqlite-vec joins the connections opened after it (store/sqlitevec.py)
        cache_kib = sqlite_cache_kib()
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=60.0, check_same_thread=False)
        # A bounded page cache and no mmap: memory must not grow with the size of the store.
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=60000",
                       "foreign_keys=OFF", f"cache_size=-{cache_kib}", "wal_autocheckpoint=100000",
                       "journal_size_limit=268435456"):
            self.conn.execute(f"PRAGMA {pragma}")
        self.conn.create_function(SQLITE_FUNCTION, 1, key64, deterministic=True)
        self._depth = 0
        self.path = path
        self._watcher: Any = None
        # wait_for_work runs in a thread of its own (a worker's idle wait) and may still be polling when the store
        # is closed: the watcher is used and closed only under this lock, and not used after close.
        self._watch_lock = threading.Lock()
        self._closed = False
        self._writers = WriterLock(path) if path != ":memory:" and not path.startswith("file:") else None
        self._many = ManyRows(self.conn)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def execute_binary(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()  # SQLite hands bytes over as they are

    def execute_rowcount(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    # sqlite3 binds a row that is a plain tuple faster than any other sequence: a NamedTuple row (the hot path's
    # successes and attempts) cost about 0.9 us more a row, 6 or 12 columns alike, than the same row copied into a
    # tuple first (which a plain tuple is not: tuple() hands it back).
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.conn.executemany(sql, map(tuple, rows))

    def executemany_count(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """executemany, returning the total number of rows changed."""
        return self.conn.executemany(sql, map(tuple, rows)).rowcount if rows else 0

    def _many_count(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """``executemany_count`` in statements of many rows (store/sqlitemany.py) where ``sql`` is of a shape for
        it: the updates of tasks by id, the inserts that land in order in every index (new tasks, attempts). Not
        the memo's insert: its index is a hash's order, where many rows a statement ran slower (3.1 against 2.5
        us a row)."""
        changed = self._many.run(sql, rows) if len(rows) > 1 else None
        return self.executemany_count(sql, rows) if changed is None else changed

    def insert_many(self, sql: str, rows: Sequence[Sequence[Any]], key: Sequence[int]) -> int:
        return self.executemany_count(sql, rows)  # one prepared statement stepped per row: SQLite's bulk rate

    def insert_many_returning(self, sql: str, rows: Sequence[Sequence[Any]],
                              key: Sequence[int]) -> list[tuple[Any, ...]]:
        return self.executemany_returning(sql, rows)

    def insert_numbered(self, sql: str, rows: Sequence[Sequence[Any]], table: str) -> list[int] | None:
        """One executemany, not a statement per row with RETURNING (which sqlite3's executemany cannot return;
        4.5 ms per 1,000 rows less). The caller's transaction holds the store's one writer lock, so new rows take
        the ids after the largest, in order: when the largest grew by exactly the rows given and every row was
        written, each was inserted new. Otherwise (a row that met one already there) the statement is rolled back
        to a savepoint. The statement runs with ``DO NOTHING`` for its conflict clause (``_new_rows_only``): when
        every row is new its action never runs, and one that updates the table's rows would compile the table's
        update triggers into the insert (tasks: about 1 us a row, store/errortext.py)."""
        top = int(self.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")[0][0])
        self.conn.execute("SAVEPOINT numbered_rows")
        written = self._many_count(_new_rows_only(sql), rows)
        if written == len(rows) and int(self.execute(f"SELECT MAX(id) FROM {table}")[0][0]) == top + len(rows):
            self.conn.execute("RELEASE numbered_rows")
            return list(range(top + 1, top + len(rows) + 1))
        self.conn.execute("ROLLBACK TO numbered_rows")
        self.conn.execute("RELEASE numbered_rows")
        return None

    def update_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """In statements of many rows (store/sqlitemany.py), or row by row when ``sql`` is not of that shape."""
        return self._many_count(sql, rows)

    def executemany_returning(self, sql: str, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """sqlite3's executemany cannot return rows: one execute per row, in the caller's transaction."""
        returned: list[tuple[Any, ...]] = []
        execute = self.conn.execute
        for row in rows:
            returned += execute(sql, row).fetchall()
        return returned

    @staticmethod
    def one_of(column: str, values: Sequence[Any], kind: str) -> tuple[str, list[Any]]:
        return f"{column} IN ({','.join('?' * len(values))})", list(values)

    def append(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            marks = ", ".join("?" * len(columns))
            self._many_count(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        if self._writers is None:
            with self._write():
                yield
            return
        with self._writers.held(), self._write():
            yield

    @contextmanager
    def _write(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self.conn.execute("ROLLBACK")
            raise
        self._depth = 0
        self.conn.execute("COMMIT")

    def refresh_statistics(self, tables: Sequence[str], columns: Mapping[str, Sequence[str]] | None = None) -> None:
        """Nothing to refresh: SQLite plans without statistics unless ANALYZE was run, and conveyor never runs it."""

    def pipelined(self) -> AbstractContextManager[None]:
        """Nothing to gather: an embedded store's statements make no round trip."""
        return nullcontext()

    def clock(self) -> float:
        """This machine's clock: an embedded store lives on one machine, which all its workers share."""
        return time.time()

    def lock(self, name: str) -> None:
        """Nothing to take: a write transaction already holds the store's one writer lock."""

    def notify(self) -> None:
        """Nothing to send: a commit is what wakes a waiting worker (``wait_for_work``)."""

    def wait_for_work(self, timeout: float) -> None:
        """Return once another connection commits, or ``timeout`` passes: ``PRAGMA data_version`` (a read of
        the WAL index in shared memory, no lock) changes on every commit made elsewhere. Read on a connection
        of its own, every WAKE_POLL_S, so a job queued through the API starts within milliseconds."""
        if self.path == ":memory:":
            time.sleep(timeout)
            return
        version = self._data_version()
        deadline = time.monotonic() + timeout
        while version is not None and time.monotonic() < deadline:
            time.sleep(min(WAKE_POLL_S, max(0.0, deadline - time.monotonic())))
            if self._data_version() != version:
                return

    def _data_version(self) -> int | None:
        """The watcher's ``PRAGMA data_version`` (made on first use); None once the store is closed."""
        with self._watch_lock:
            if self._closed:
                return None
            if self._watcher is None:
                import sqlite3

                self._watcher = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            return int(self._watcher.execute("PRAGMA data_version").fetchone()[0])

    def lost(self) -> bool:
        """Never: an embedded store has no connection to lose."""
        return False

    def conflicted(self, exc: BaseException) -> bool:
        """Never: writers queue on one lock (busy timeout), so no transaction is chosen as a victim."""
        return False

    @contextmanager
    def checkpointing(self) -> Iterator[None]:
        """PASSIVE checkpoints from a thread while the block runs (store/checkpointer.py), so that this
        connection's close has little left to copy; not for a store in memory or opened by URI (no writer lock
        either: no file that another connection is known to share)."""
        if self._writers is None:
            yield
            return
        checkpointer = Checkpointer(self.path).start()
        try:
            yield
        finally:
            checkpointer.stop()

    def close(self) -> None:
        self.conn.close()
        with self._watch_lock:  # a wait still polling in its thread returns at its next look
            self._closed = True
            if self._watcher is not None:
                self._watcher.close()
        if self._writers is not None:
            self._writers.close()


class PostgresDialect:
    """PostgreSQL through psycopg 3: SKIP LOCKED claims, LISTEN/NOTIFY wake-ups.

    A connection the server ended (a restart, ``pg_terminate_backend``, the network) fails the call that meets
    it; the next call outside a transaction opens a new one (``lost`` says when that is so).
    """

    name = "postgres"
    has_table = ("SELECT COUNT(*) FROM pg_catalog.pg_tables WHERE tablename = ? "
                 "AND schemaname = ANY(current_schemas(false))")
    types: ClassVar[dict[str, str]] = {
        "id": "BIGSERIAL PRIMARY KEY", "real": "DOUBLE PRECISION", "blob": "BYTEA", "without_rowid": "",
        "key64": KEY64_SQL["postgres"], "byte_ordered_keys": BYTE_ORDERED_KEYS,
        "publication_text_index": POSTGRES_TEXT_INDEX, "bytes_order": ' COLLATE "C"',
        "task_error_text": POSTGRES_ERROR_TEXT, "items_stage_index_drop": "",
        "attempt_minute": "CAST(CAST(FLOOR((started_at + COALESCE(duration, 0)) / 60) AS BIGINT) AS TEXT)",
        "attempt_second": "CAST(FLOOR(started_at + COALESCE(duration, 0)) AS BIGINT)",
        "epoch_second": "CAST(FLOOR(available_at) AS BIGINT)", "task_error_text_insert_drop": ""}
    skip_locked = "FOR UPDATE SKIP LOCKED"
    in_chunk = 10_000  # values per one_of: one array, a batch's worth
    row_lock = " FOR UPDATE"
    max_params = 60000
    local_clock = False
    wakes_on_notify = True
    channel = "conveyor_tasks"

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self._psycopg = psycopg
        self.conn = self._connect()
        self._listener: Any = None
        # wait_for_work blocks in a thread of its own (a worker's idle wait) and may still be listening when the
        # store is closed: the listener is used and closed only under this lock (close wakes it with a NOTIFY).
        self._listen_lock = threading.Lock()
        self._closed = False
        self._depth = 0
        self._sql_cache: dict[str, str] = {}
        self._copied: dict[str, CopiedRows | None] = {}  # None: not of the shape (executemany)
        self._fed: dict[str, tuple[str, tuple[int, ...]] | None] = {}  # update_many's JSON-fed moves (None: COPY)
        self._types: dict[str, dict[str, str]] = {}  # column types by table, for those moves
        self._direct_paused: dict[str, int] = {}  # statement: batches it skips the direct COPY for (_copy_direct)
        self._text_copies: set[tuple[str, tuple[str, ...]]] = set()  # (table, columns) a binary COPY refused
        self._sequences: dict[str, str] = {}  # table: the sequence of its id (insert_numbered)
        self._staged: set[str] = set()  # the temporary tables this connection has (store/bulk.py)
        self._staging: set[str] = set()  # those made by the open transaction

    @staticmethod
    def glob(pattern: str) -> tuple[str, str]:
        return "~", glob_regex(pattern)

    def lost(self) -> bool:
        return bool(self.conn.broken or self.conn.closed)

    def conflicted(self, exc: BaseException) -> bool:
        errors = self._psycopg.errors
        return isinstance(exc, (errors.DeadlockDetected, errors.SerializationFailure))

    def _connect(self) -> psycopg.Connection[Any]:
        """A new connection, whose binary COPY writes ``bytea`` values with psycopg's C dumper of ``bytes``: the
        one it would pick for the column's type (set_types) is the DB-API ``Binary`` wrapper's, two Python calls a
        value."""
        from psycopg.adapt import PyFormat

        conn = self._psycopg.connect(self.url, autocommit=True)
        conn.adapters.register_dumper(bytes, conn.adapters.get_dumper(bytes, PyFormat.BINARY))
        return conn

    def _live(self) -> psycopg.Connection[Any]:
        """The connection, a new one when the last was lost (never inside a transaction: that one failed)."""
        if not self._depth and self.lost():
            fresh = self._connect()
            self.conn.close()
            self.conn = fresh
            self._staged.clear()  # temporary tables die with their session
        return self.conn

    def _sql(self, sql: str) -> str:
        out = self._sql_cache.get(sql)
        if out is None:
            out = self._sql_cache[sql] = sql.replace("%", "%%").replace("?", "%s")
        return out

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._live().execute(self._sql(sql), params)
        return cur.fetchall() if cur.description else []

    def execute_binary(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._live().cursor(binary=True) as cur:
            cur.execute(self._sql(sql), params)
            return cur.fetchall() if cur.description else []

    def execute_rowcount(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._live().execute(self._sql(sql), params).rowcount

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            with self._live().cursor() as cur:
                cur.executemany(self._sql(sql), rows)

    def executemany_count(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """executemany, returning the total number of rows changed (psycopg sums them)."""
        if not rows:
            return 0
        with self._live().cursor() as cur:
            cur.executemany(self._sql(sql), rows)
            return cur.rowcount

    def insert_many(self, sql: str, rows: Sequence[Sequence[Any]], key: Sequence[int]) -> int:
        """Fewer than ``COPY_FROM`` rows as executemany; more copied into a temporary table and moved by one
        statement, the first row of each key kept (store/bulk.py)."""
        plan = self._copy_plan(sql, rows, copied_insert)
        if plan is None:
            return self.executemany_count(sql, rows)
        with self.transaction():
            if plan.direct is not None and self._copy_direct(sql, plan, rows):
                return len(rows)
            return int(self._copy_and_move(plan, first_per_key(rows, key)).rowcount)

    def _copy_direct(self, sql: str, plan: CopiedRows, rows: Sequence[Sequence[Any]]) -> bool:
        """COPY ``rows`` straight into the table, in a savepoint of the open transaction: True, or False (rolled
        back) when one of them meets a unique key. After a miss the statement goes the staged way for its next
        ``DIRECT_PAUSE`` batches: its rows are likely to meet existing ones again (a resumed submission)."""
        paused = self._direct_paused.get(sql, 0)
        if paused:
            self._direct_paused[sql] = paused - 1
            return False
        assert plan.direct is not None
        constants = plan.constants
        self.conn.execute(f"SAVEPOINT {DIRECT_SAVEPOINT}")
        try:
            self._copy_in(plan.direct, rows, (), constants, self._binary_kinds(plan.direct, rows, constants))
        except self._psycopg.errors.UniqueViolation:
            self.conn.execute(f"ROLLBACK TO SAVEPOINT {DIRECT_SAVEPOINT}")
            self._direct_paused[sql] = DIRECT_PAUSE
            return False
        return True

    def insert_many_returning(self, sql: str, rows: Sequence[Sequence[Any]],
                              key: Sequence[int]) -> list[tuple[Any, ...]]:
        """As insert_many; the move statement's RETURNING rows."""
        plan = self._copy_plan(sql, rows, copied_insert)
        if plan is None:
            return self.executemany_returning(sql, rows)
        return list(self._copy_and_move(plan, first_per_key(rows, key)).fetchall())

    def insert_numbered(self, sql: str, rows: Sequence[Sequence[Any]], table: str) -> list[int] | None:
        """The ids first, from the table's sequence (one statement), then the rows with them by COPY straight into
        the table, in a savepoint of the open transaction (asked for with the ids: one round trip), as
        ``_copy_direct``: no temporary table, no ``INSERT ... SELECT`` and no RETURNING (a commit's 1,000 new
        leased tasks: 121 against 99 ms on a loaded host). None for fewer than ``COPY_FROM`` rows, a statement not
        of the shape, or a row that met a unique key (rolled back; the sequence's numbers taken are skipped, as
        any rolled back insert skips them)."""
        plan = self._copy_plan(sql, rows, copied_insert)
        if plan is None or plan.direct is None:
            return None
        paused = self._direct_paused.get(sql, 0)
        if paused:
            self._direct_paused[sql] = paused - 1
            return None
        head = f"COPY {table} ("
        assert plan.direct.startswith(head), plan.direct
        with self.transaction():  # the caller's, as a rule
            return self._numbered(f"{head}id, {plan.direct[len(head):]}", plan.constants, sql, rows, table)

    def _numbered(self, numbered: str, constants: tuple[Any, ...], sql: str, rows: Sequence[Sequence[Any]],
                  table: str) -> list[int] | None:
        conn = self.conn
        sequence = self._sequences.get(table)
        if sequence is None:  # named once: pg_get_serial_sequence in the statement ran once per id (2.7 us each)
            found = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", (table,)).fetchone()
            assert found is not None and found[0] is not None, table
            sequence = self._sequences[table] = str(found[0])
        with conn.pipeline():  # the ids and the savepoint: one round trip
            numbering = conn.execute(
                "SELECT nextval(CAST(%s AS regclass)) FROM generate_series(1, %s)", (sequence, len(rows)))
            conn.execute(f"SAVEPOINT {DIRECT_SAVEPOINT}")
        ids = [int(r[0]) for r in numbering.fetchall()]
        try:
            self._copy_in(numbered, rows, ids, constants, self._binary_kinds(numbered, rows, constants, True))
        except self._psycopg.errors.UniqueViolation:
            conn.execute(f"ROLLBACK TO SAVEPOINT {DIRECT_SAVEPOINT}")
            self._direct_paused[sql] = DIRECT_PAUSE
            return None
        return ids

    def update_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Fewer than ``COPY_FROM`` rows as executemany; more applied by one ``UPDATE ... FROM``, the rows sent as
        one JSON parameter (store/bulk.py ``json_update``) or, when they have no exact JSON spelling, copied into a
        temporary table first."""
        plan = self._copy_plan(sql, rows, copied_update)
        if plan is None or len(first_per_key(rows, plan.match)) < len(rows):
            return self.executemany_count(sql, rows)  # a row named twice: one statement would change it once
        if sql not in self._fed:
            self._fed[sql] = json_update(plan, self._column_types(plan.update.split(None, 2)[1]))
        fed = self._fed[sql]
        if fed is not None:
            move, floats = fed
            try:
                payload = orjson.dumps(rows if type(rows[0]) is tuple else [tuple(r) for r in rows]).decode()
            except TypeError:  # bytes, an integer past 64 bits: not JSON
                payload = None
            if payload is not None and _finite(rows, floats):
                # Planned at each call, never prepared (as _copy_and_move's move).
                return int(self._live().execute(self._sql(move), (payload,), prepare=False).rowcount)
        return int(self._copy_and_move(plan, rows).rowcount)

    def _column_types(self, table: str) -> dict[str, str]:
        """A table's column types as PostgreSQL names them (``double precision``), read once per connection."""
        if table not in self._types:
            self._types[table] = {str(name): str(kind) for name, kind in self._live().execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                "to_regclass(%s) AND attnum > 0 AND NOT attisdropped", (table,))}
        return self._types[table]

    def _copy_plan(self, sql: str, rows: Sequence[Sequence[Any]],
                   make: Callable[[str], CopiedRows | None]) -> CopiedRows | None:
        """How ``sql`` goes through COPY (made once per statement), or None: executemany (few rows, or a
        statement not of the shape)."""
        if len(rows) < COPY_FROM:
            return None
        if sql not in self._copied:
            self._copied[sql] = make(sql)
        return self._copied[sql]

    def _copy_and_move(self, plan: CopiedRows, rows: Sequence[Sequence[Any]]) -> Any:
        """COPY ``rows`` and run the plan's move: its cursor (rowcount, and rows if it returns any)."""
        with self.transaction():
            conn = self.conn
            if plan.staging not in self._staged and plan.staging not in self._staging:
                conn.execute(plan.create)
                self._staging.add(plan.staging)  # made for good once this transaction commits
            with conn.cursor() as cur, cur.copy(f"COPY {plan.staging} ({', '.join(plan.bound)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            # Planned at each call, never prepared: a plan made while the table was small (a hash join over all
            # of it) would be kept as it grew (tests/test_plans.py).
            return conn.execute(plan.move, prepare=False)

    def executemany_returning(self, sql: str, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """executemany of a statement with RETURNING: every row returned, in one pipeline."""
        returned: list[tuple[Any, ...]] = []
        if not rows:
            return returned
        with self._live().cursor() as cur:
            cur.executemany(self._sql(sql), rows, returning=True)
            while True:
                returned += cur.fetchall()
                if not cur.nextset():
                    return returned

    @staticmethod
    def one_of(column: str, values: Sequence[Any], kind: str) -> tuple[str, list[Any]]:
        # The array goes as one text parameter written at C speed (psycopg builds a list parameter element by
        # element in Python): a literal of numbers, or a JSON array of strings.
        if kind == "bigint":
            return f"{column} = ANY(CAST(? AS bigint[]))", ["{" + ",".join(map(str, values)) + "}"]
        return (f"{column} = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(? AS jsonb))))",
                [orjson.dumps(list(values)).decode()])

    def append(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """COPY: one stream instead of a statement per row (attempts went from 14 to ~3 us a row), in binary form
        where it can be (``_copy_in``; inside a transaction, from a savepoint to go back to if it is refused)."""
        if not rows:
            return
        copy = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
        conn = self._live()
        kinds = self._binary_kinds(copy, rows, ())
        if kinds is not None and self._depth:
            conn.execute(f"SAVEPOINT {DIRECT_SAVEPOINT}")
        self._copy_in(copy, rows, (), (), kinds)

    def _copy_in(self, copy: str, rows: Sequence[Sequence[Any]], ids: Sequence[int], constants: tuple[Any, ...],
                 kinds: list[str] | None) -> None:
        """``copy`` (``COPY t (c, ...) FROM STDIN``) of ``rows``, each after its id when ``ids`` are given and
        before ``constants``: in binary form with ``kinds`` (``_binary_kinds``: a worker's instructions a task
        -27 %, bench/RESULTS.md), else as text. A binary COPY that refuses a value (not of its column's Python
        type: none of conveyor's rows), or whose columns' types changed meanwhile, goes back to the savepoint
        ``DIRECT_SAVEPOINT`` the caller took just before it (outside a transaction it failed alone) and is made
        again as text, and so are the same columns' from then on."""
        if kinds is not None:
            try:
                self._write_copy(f"{copy} (FORMAT BINARY)", kinds, rows, ids, constants)
                return
            except (TypeError, ValueError, OverflowError, self._psycopg.errors.InvalidBinaryRepresentation,
                    self._psycopg.errors.ProtocolViolation):  # the last two: the server's, a column's type changed
                self._text_copies.add(self._copy_key(copy))
                if self._depth:
                    self.conn.execute(f"ROLLBACK TO SAVEPOINT {DIRECT_SAVEPOINT}")
        self._write_copy(copy, None, rows, ids, constants)

    def _write_copy(self, copy: str, kinds: list[str] | None, rows: Sequence[Sequence[Any]], ids: Sequence[int],
                    constants: tuple[Any, ...]) -> None:
        with self.conn.cursor() as cur, cur.copy(copy) as stream:
            if kinds is not None:
                stream.set_types(kinds)
            write = stream.write_row
            if ids:
                for task_id, row in zip(ids, rows, strict=True):
                    write((task_id, *row, *constants))
            elif constants:
                for row in rows:
                    write((*row, *constants))
            else:
                for row in rows:
                    write(row)

    @staticmethod
    def _copy_key(copy: str) -> tuple[str, tuple[str, ...]]:
        """A ``COPY t (c, ...) FROM STDIN`` statement's (table, columns)."""
        head, _, rest = copy.partition(" (")
        return head.split()[1], tuple(c.strip() for c in rest.partition(")")[0].split(","))

    def _binary_kinds(self, copy: str, rows: Sequence[Sequence[Any]], constants: tuple[Any, ...],
                      numbered: bool = False) -> list[str] | None:
        """The column types of ``copy`` in binary form (``_copy_in``), or None: text."""
        table, columns = key = self._copy_key(copy)
        if key in self._text_copies:
            return None
        types = self._column_types(table)
        kinds = [types.get(c, "") for c in columns]
        if not all(k in BINARY_COPY_TYPES for k in kinds):
            return None
        first = 1 if numbered else 0  # the id, a bigint, comes before the row's own values
        bound = len(columns) - first - len(constants)
        checked = [i - first for i, k in enumerate(kinds) if k == "integer" and first <= i < first + bound]
        fixed = [constants[i - first - bound] for i, k in enumerate(kinds) if k == "integer" and i >= first + bound]
        return kinds if _ints_fit(rows, checked) and _ints_fit([fixed], range(len(fixed))) else None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; nested calls join it instead of making savepoints."""
        if self._depth:
            yield
            return
        conn = self._live()
        self._depth = 1
        try:
            with conn.transaction():
                yield
            self._staged |= self._staging  # their CREATE is committed
        finally:
            self._depth = 0
            self._staging.clear()

    @contextmanager
    def pipelined(self) -> Iterator[None]:
        """psycopg's pipeline mode: each executemany in the block rides it (no Sync of its own), so a commit's
        closing upserts (its runs' totals, metrics and queue counts) cost one round trip, not three."""
        with self._live().pipeline():
            yield

    def refresh_statistics(self, tables: Sequence[str], columns: Mapping[str, Sequence[str]] | None = None) -> None:
        """ANALYZE the tables whose statistics are stale: never gathered, or more rows written since than
        ``STALE_SHARE`` of the rows they counted (right after a bulk load they describe a far smaller table). Not
        every time: an ANALYZE of a large table reads 30,000 of its pages, and each submission asks.

        A table named in ``columns`` is analyzed on those columns only, once it grew by that share (its live rows
        against the rows it counted): the statistics of every other column cost four fifths of the time (tasks of
        40,000 rows: 1.0 s against 0.2 s), and an ANALYZE of some columns leaves the count of rows written since
        as it was, so growth is what tells."""
        for table in tables:
            row = self._live().execute(
                "SELECT c.reltuples, s.n_mod_since_analyze, s.n_live_tup FROM pg_class c JOIN pg_stat_all_tables s "
                "ON s.relid = c.oid WHERE c.oid = to_regclass(%s)", (table,)).fetchone()
            some = (columns or {}).get(table)
            if row is not None and row[0] >= 0 and (
                    row[2] <= (1 + STALE_SHARE) * row[0] + STALE_ROWS if some else
                    row[1] <= STALE_SHARE * row[0] + STALE_ROWS):
                continue
            self._live().execute(f"ANALYZE {table} ({', '.join(some)})" if some else f"ANALYZE {table}")

    def clock(self) -> float:
        """The server's clock: workers on machines whose clocks disagree still agree on leases."""
        row = self._live().execute("SELECT extract(epoch from clock_timestamp())").fetchone()
        assert row is not None
        return float(row[0])

    def lock(self, name: str) -> None:
        self._live().execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))

    def notify(self) -> None:
        self._live().execute(f"NOTIFY {self.channel}")

    def wait_for_work(self, timeout: float) -> None:
        """Block until a NOTIFY arrives or ``timeout`` passes. When the listening connection is lost, wait out
        ``timeout`` as a poll would and listen on a new connection next time (what was sent meanwhile is
        missed: the caller looks for work after every wait anyway)."""
        with self._listen_lock:
            if self._closed:
                return
            try:
                if self._listener is None:
                    self._listener = self._psycopg.connect(self.url, autocommit=True)
                    self._listener.execute(f"LISTEN {self.channel}")
                for _ in self._listener.notifies(timeout=timeout, stop_after=1):
                    break
                return
            except self._psycopg.OperationalError:
                if self._listener is not None:
                    self._listener.close()
                    self._listener = None
        time.sleep(timeout)

    def checkpointing(self) -> AbstractContextManager[None]:
        """Nothing to do: the server writes its log back on its own schedule, not at a client's close."""
        return nullcontext()

    def close(self) -> None:
        self._closed = True
        if self._listener is not None and self._listen_lock.locked():  # a wait is listening: wake it
            try:
                self.conn.execute(f"NOTIFY {self.channel}")
            except self._psycopg.Error:
                pass
        if self._listen_lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                if self._listener is not None:
                    self._listener.close()
                    self._listener = None
            finally:
                self._listen_lock.release()
        self.conn.close()


def _finite(rows: Sequence[Sequence[Any]], positions: Iterable[int]) -> bool:
    """Every value at these positions of ``rows`` is None or a finite number (JSON spells no other). Their sum,
    at C speed, is finite only if each is (an infinity or NaN carries through; only an overflow of the sum of
    finite values is judged again value by value, as is a column with a None)."""
    for i in positions:
        values = list(map(itemgetter(i), rows))
        try:
            if math.isfinite(sum(values)):
                continue
        except TypeError:  # a None among them
            pass
        if not all(v is None or math.isfinite(v) for v in values):
            return False
    return True


def _ints_fit(rows: Sequence[Sequence[Any]], positions: Iterable[int]) -> bool:
    """Every value at these positions of ``rows`` is a number within PostgreSQL's ``integer`` (None, or another
    type, is not: such rows are copied as text)."""
    low, high = INT4_RANGE
    for i in positions:
        values = list(map(itemgetter(i), rows))
        try:
            if min(values) < low or max(values) > high:
                return False
        except TypeError:
            return False
    return True


def glob_regex(pattern: str) -> str:
    """A shell-style pattern as an anchored regular expression (PostgreSQL's ``~``): ``*`` any run, ``?`` one
    character, ``[abc]`` / ``[!abc]`` a set or its complement; everything else literal."""
    out, i, n = ["^"], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[" and (end := _set_end(pattern, i)) > 0:
            body = pattern[i:end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\").replace("[", "\\[") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
    return "".join(out) + "$"


def _set_end(pattern: str, start: int) -> int:
    """Where the set opened before ``start`` closes (a ``]`` first in the set is a member), or -1."""
    i = start + (1 if pattern[start:start + 1] in ("!", "^") else 0)
    i += 1 if pattern[i:i + 1] == "]" else 0
    end = pattern.find("]", i)
    return end
