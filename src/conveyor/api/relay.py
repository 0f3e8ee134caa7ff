"""The outbox relay: delivers job events to their webhooks from a background thread while the server runs.

A relay leases the deliveries that are due, sends a few at a time and records each result (service/webhooks.py).
Several servers may run relays on one store: a leased delivery is skipped by the others until its lease ends,
and a relay that dies mid-send leaves its leases to run out, after which another sends them again: every event
is delivered at least once, and its ``webhook-id`` lets the receiver drop a repeat. Now and then the relay also
forgets Idempotency-Keys older than their keeping time.

The retry schedule is a day long. Tests shorten it through the environment; leave these unset in production:
``CONVEYOR_WEBHOOK_RETRY_BASE_S``, ``CONVEYOR_WEBHOOK_RETRY_CAP_S``, ``CONVEYOR_WEBHOOK_DEADLINE_S`` and
``CONVEYOR_WEBHOOK_TIMEOUT_S`` (the fields of RelaySettings, in seconds), and ``CONVEYOR_WEBHOOK_POLL_S`` (how
often an idle relay looks for due deliveries).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import httpx

from conveyor.api.settings import ApiSettings
from conveyor.errors import UserError
from conveyor.service.jobs import IDEMPOTENCY_TTL_S
from conveyor.service.tokens import LOCAL, webhook_secret
from conveyor.service.webhooks import RelaySettings, record, send, webhook_client
from conveyor.store import SqlStore, open_store
from conveyor.store.jobs import Delivery

log = logging.getLogger("conveyor.api.relay")
T = TypeVar("T")

CONCURRENCY = 8  # deliveries in flight per relay
POLL_S = 0.5  # how often an idle relay looks for due deliveries
EXPIRE_EVERY_S = 600.0
EXPIRE_BATCH = 5000  # Idempotency-Keys dropped per statement; a full batch means more are waiting
STOP_GRACE_S = 2.0  # at stop, how long sends in flight may finish; the rest are sent again after their lease


class Db(Protocol):
    """Runs a store call in the relay's store thread."""

    def __call__(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...


def relay_settings(environ: Mapping[str, str]) -> RelaySettings:
    """The default schedule, with the test-only ``CONVEYOR_WEBHOOK_*`` variables applied."""
    default = RelaySettings()
    return RelaySettings(base_s=_seconds(environ, "CONVEYOR_WEBHOOK_RETRY_BASE_S", default.base_s),
                         cap_s=_seconds(environ, "CONVEYOR_WEBHOOK_RETRY_CAP_S", default.cap_s),
                         deadline_s=_seconds(environ, "CONVEYOR_WEBHOOK_DEADLINE_S", default.deadline_s),
                         timeout_s=_seconds(environ, "CONVEYOR_WEBHOOK_TIMEOUT_S", default.timeout_s))


def _seconds(environ: Mapping[str, str], variable: str, default: float) -> float:
    value = environ.get(variable)
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise UserError(f"{variable}={value!r} is not a number of seconds") from None


class Relay:
    """``start()`` runs the relay in a thread of its own, with its own store; ``stop()`` ends it."""

    def __init__(self, settings: ApiSettings, delivery: RelaySettings | None = None,
                 concurrency: int = CONCURRENCY, poll_s: float | None = None) -> None:
        self.settings = settings
        self.delivery = delivery or relay_settings(os.environ)
        self.concurrency = concurrency
        self.poll_s = _seconds(os.environ, "CONVEYOR_WEBHOOK_POLL_S", POLL_S) if poll_s is None else poll_s
        # A lease outlasts an attempt (bounded by timeout_s) and the recording of its result.
        self.lease_s = 2 * self.delivery.timeout_s + 30
        self._next_expiry = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=self.poll_s + STOP_GRACE_S + 5)

    def _run(self) -> None:
        store_thread = ThreadPoolExecutor(1, thread_name_prefix="conveyor-relay-store")
        try:
            asyncio.run(self._serve(store_thread))
        except Exception:  # the server goes on serving; its leases pass to another relay
            log.exception("the webhook relay stopped")
        finally:
            store_thread.shutdown(wait=False)

    async def _serve(self, store_thread: ThreadPoolExecutor) -> None:
        client = webhook_client(self.delivery, self.concurrency)
        sending: dict[asyncio.Task[str | None], Delivery] = {}
        store: SqlStore | None = None

        async def db(fn: Callable[..., T], *args: Any) -> T:
            # Store calls run off the event loop, so sends in flight go on meanwhile, and all in one thread
            # (the store is one connection), never queued behind a slow DNS lookup.
            return await asyncio.get_running_loop().run_in_executor(store_thread, lambda: fn(*args))

        try:
            while not self._stopping.is_set():
                try:
                    if store is None:
                        store = await db(self._open)
                    await self._turn(db, store, client, sending)
                except Exception as exc:  # the store went away: open it again; what is leased waits its lease
                    log.warning("webhook relay: %s", exc)
                    if store is not None:
                        await db(_close, store)
                    store = None
                    await asyncio.sleep(max(1.0, 4 * self.poll_s))
            if store is not None:
                await self._finish(db, store, sending)
        finally:
            await client.aclose()
            if store is not None:
                await db(_close, store)

    def _open(self) -> SqlStore:
        store = open_store(self.settings.db, migrate=False)
        if not self.settings.auth:  # --no-auth's one tenant signs its webhooks too
            webhook_secret(store, LOCAL.tenant)
        return store

    async def _turn(self, db: Db, store: SqlStore, client: httpx.AsyncClient,
                    sending: dict[asyncio.Task[str | None], Delivery]) -> None:
        """Lease what is due (as many as there is room for), then record what finished."""
        now = await db(store.clock)
        await self._expire_keys(db, store, now)
        room = self.concurrency - len(sending)
        if room and await db(store.delivery_due, now):
            for delivery in await db(store.lease_deliveries, now, self.lease_s, room):
                task = asyncio.create_task(send(client, delivery, self.settings.webhook_policy, self.delivery))
                sending[task] = delivery
        if not sending:
            await asyncio.sleep(self.poll_s)
            return
        done, _ = await asyncio.wait(sending, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            await self._record(db, store, sending[task], task)
            del sending[task]

    async def _record(self, db: Db, store: SqlStore, delivery: Delivery, task: asyncio.Task[str | None]) -> None:
        try:
            error = task.result()
        except Exception as exc:  # a bug, not the receiver: recorded as a failed attempt, tried again
            log.exception("webhook delivery %s failed unexpectedly", delivery.id)
            error = f"internal error ({type(exc).__name__})"
        if await db(record, store, delivery, error, self.delivery) == "lost":
            log.info("webhook delivery %s: its lease passed to another relay, which records it", delivery.id)

    async def _finish(self, db: Db, store: SqlStore, sending: dict[asyncio.Task[str | None], Delivery]) -> None:
        if not sending:
            return
        done, pending = await asyncio.wait(sending, timeout=STOP_GRACE_S)
        for task in done:
            await self._record(db, store, sending[task], task)
        for task in pending:
            task.cancel()

    async def _expire_keys(self, db: Db, store: SqlStore, now: float) -> None:
        if now < self._next_expiry:
            return
        expired = await db(store.expire_idempotency_keys, now - IDEMPOTENCY_TTL_S, EXPIRE_BATCH)
        self._next_expiry = now + (self.poll_s if expired >= EXPIRE_BATCH else EXPIRE_EVERY_S)


def _close(store: SqlStore) -> None:
    try:
        store.close()
    except Exception:  # a connection that broke is gone already
        pass
