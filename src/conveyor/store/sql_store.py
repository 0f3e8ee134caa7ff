"""The store: one schema, two backends, every SQL statement of conveyor."""

from __future__ import annotations

import re
import time
from contextlib import AbstractContextManager
from typing import Any

from conveyor.errors import StoreError
from conveyor.store.alerts import AlertQueries
from conveyor.store.barriers import BarrierQueries
from conveyor.store.budget import BudgetQueries
from conveyor.store.claimfloors import ClaimFloors, ReclaimFloors
from conveyor.store.compare import CompareQueries
from conveyor.store.depth import DepthQueries
from conveyor.store.dialect import Dialect
from conveyor.store.diffs import DiffQueries
from conveyor.store.exports import ExportQueries
from conveyor.store.forecast import ForecastQueries
from conveyor.store.jobs import JobQueries
from conveyor.store.journal import JournalQueries
from conveyor.store.metrics import MetricsQueries
from conveyor.store.progress import ProgressQueries
from conveyor.store.provenance import ProvenanceQueries
from conveyor.store.provider_batch import ProviderBatchQueries
from conveyor.store.publications import PublicationQueries
from conveyor.store.queuecounts import QueueCountQueries
from conveyor.store.quota import QuotaQueries
from conveyor.store.reopen import ReopenQueries
from conveyor.store.replay import ReplayQueries
from conveyor.store.reports import ReportQueries
from conveyor.store.reviews import ReviewQueries
from conveyor.store.runs import RunQueries
from conveyor.store.schema import MIGRATIONS
from conveyor.store.selection import SelectionQueries
from conveyor.store.show import ShowQueries
from conveyor.store.tasks import TaskQueries
from conveyor.store.traces import TraceQueries
from conveyor.store.workers import WorkerQueries


class SqlStore(TaskQueries, RunQueries, ReportQueries, QuotaQueries, ReplayQueries, ReviewQueries,
               PublicationQueries, DiffQueries, ProvenanceQueries, SelectionQueries, ReopenQueries, CompareQueries,
               ShowQueries, ForecastQueries, BudgetQueries, JobQueries, WorkerQueries, MetricsQueries,
               ProgressQueries, AlertQueries, TraceQueries, ProviderBatchQueries, QueueCountQueries, DepthQueries,
               JournalQueries, BarrierQueries, ExportQueries):
    """A store over one connection. Not thread-safe: give each thread its own."""

    def __init__(self, db: Dialect, url: str) -> None:
        self.db = db
        self.url = url
        self.claim_floors = ClaimFloors()  # where claims start while an old snapshot is held (PostgreSQL)
        self.reclaim_floors = ReclaimFloors()  # and where the reclaim scan starts
        self.created = False  # migrate() made the schema: there was no store here before

    def initialised(self) -> bool:
        """True once the store's schema exists (``migrate`` creates it)."""
        return bool(self.db.execute(self.db.has_table, ("schema_migrations",))[0][0])

    @property
    def backend(self) -> str:
        return self.db.name

    def transaction(self) -> AbstractContextManager[Any]:
        """Group several operations into one transaction (nested calls join it)."""
        context: AbstractContextManager[Any] = self.db.transaction()
        return context

    def migrate(self) -> int:
        """Apply every migration not applied yet; return the schema version."""
        with self.db.transaction():
            # First, before anything is created: processes opening a fresh database at once must not
            # race even on CREATE TABLE IF NOT EXISTS (PostgreSQL answers one of them UniqueViolation).
            self.db.lock("conveyor.migrate")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                f"description TEXT NOT NULL, applied_at {self.db.types['real']} NOT NULL)"
            )
            done = {int(r[0]) for r in self.db.execute("SELECT version FROM schema_migrations")}
            self.created = not done
            for version, description, ddl in MIGRATIONS:
                if version in done:
                    continue
                for statement in _statements(ddl.format(**self.db.types)):
                    self.db.execute(statement)
                self.db.execute(
                    "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
                    (version, description, time.time()),
                )
        return max(v for v, _, _ in MIGRATIONS)

    def schema_version(self) -> int:
        try:
            rows = self.db.execute("SELECT MAX(version) FROM schema_migrations")
        except Exception as exc:
            raise StoreError(f"the store at {self.url} is not initialised ({exc})") from None
        return int(rows[0][0] or 0)

    def clock(self) -> float:
        """The fleet's clock: PostgreSQL's on PostgreSQL, this machine's on SQLite."""
        return self.db.clock()

    def notify(self) -> None:
        self.db.notify()

    def wait_for_work(self, timeout: float) -> None:
        self.db.wait_for_work(timeout)

    def lost(self) -> bool:
        """True when the connection to the store is gone; the next call opens a new one (PostgreSQL)."""
        return self.db.lost()

    def conflicted(self, exc: BaseException) -> bool:
        """True when ``exc`` rolled back a transaction for another's sake (a deadlock): safe to make again."""
        return self.db.conflicted(exc)

    def checkpointing(self) -> AbstractContextManager[None]:
        """While the block runs, SQLite's WAL is copied into the store from a thread (store/checkpointer.py), so
        closing the store after a long write is quick; nothing on PostgreSQL."""
        return self.db.checkpointing()

    def close(self) -> None:
        self.db.close()


def _statements(ddl: str) -> list[str]:
    """A migration's statements, split at semicolons, except those inside a trigger's BEGIN ... END."""
    lines = [line for line in ddl.splitlines() if not line.strip().startswith("--")]
    statements: list[str] = []
    held: list[str] = []
    for piece in "\n".join(lines).split(";"):
        held.append(piece)
        text = ";".join(held).strip()
        if _TRIGGER.match(text) and not _END.search(text):
            continue
        if text:
            statements.append(text)
        held = []
    return statements


_TRIGGER = re.compile(r"CREATE\s+TRIGGER\b", re.IGNORECASE)
_END = re.compile(r"\bEND$", re.IGNORECASE)
