"""What every request works with: a store lent from a pool, the blob store, the pipelines served, the caller."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from conveyor.api.settings import ApiSettings
from conveyor.blobs import Blobs, open_blobs
from conveyor.errors import NotFound, UserError
from conveyor.pipeline import Pipeline
from conveyor.runtime.target import load_target
from conveyor.service.tenancy import TenantView
from conveyor.service.tokens import LOCAL, Caller, authenticate
from conveyor.store import SqlStore, open_store

T = TypeVar("T")


# Idle stores (connections) the pool keeps for the next calls; one more, after a burst, is closed when returned.
IDLE_STORES = 8


class Services:
    """The server's parts. Every store call runs in the thread pool, never on the event loop, with a store (one
    connection, used by one thread at a time) lent from a pool for that call: the server holds as many
    connections as calls run at once (the thread pool bounds them), at most ``IDLE_STORES`` of them idle, not
    one per thread the pool ever made (its threads come and go), and closes them all at shutdown."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        open_store(settings.db).close()  # migrated once, here
        self.blobs: Blobs = open_blobs(settings.blobs)
        self.pipelines: dict[str, tuple[Pipeline, str]] = {}
        for target in settings.pipelines:
            pipeline = load_target(target)
            if pipeline.name in self.pipelines:
                raise UserError(f"two served targets declare the pipeline {pipeline.name!r}; serve each name once")
            self.pipelines[pipeline.name] = (pipeline, target)
        self._idle: list[SqlStore] = []
        self._lent = 0
        self._closed = False
        self._lock = threading.Lock()

    @contextmanager
    def store(self) -> Iterator[SqlStore]:
        """A store for the block, the idle one used last or a new one; back to the pool after it (closed when
        the pool holds ``IDLE_STORES`` idle already, or the server has shut down)."""
        with self._lock:
            store = self._idle.pop() if self._idle else None
            self._lent += 1
        try:
            if store is None:
                store = open_store(self.settings.db, migrate=False)
            yield store
        finally:
            with self._lock:
                self._lent -= 1
                kept = store is not None and not self._closed and len(self._idle) < IDLE_STORES
                if kept and store is not None:
                    self._idle.append(store)
            if store is not None and not kept:
                _close(store)

    def connections(self) -> tuple[int, int]:
        """(stores lent now, stores idle in the pool)."""
        with self._lock:
            return self._lent, len(self._idle)

    def _with_store(self, fn: Callable[[SqlStore], T]) -> T:
        with self.store() as store:
            return fn(store)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(store, *args, **kwargs)`` in the thread pool, with a store lent for the call."""
        return await run_in_threadpool(self._with_store, lambda store: fn(store, *args, **kwargs))

    def pipeline(self, name: str | None) -> tuple[Pipeline, str]:
        """The served pipeline called ``name`` (the only one, when None); NotFound otherwise."""
        if name is None:
            if len(self.pipelines) == 1:
                return next(iter(self.pipelines.values()))
            if not self.pipelines:
                raise NotFound("this server serves no pipeline; start it with --pipeline TARGET")
            raise UserError(f"name the pipeline: this server serves {', '.join(sorted(self.pipelines))}")
        found = self.pipelines.get(name)
        if found is None:
            served = ", ".join(sorted(self.pipelines)) or "none"
            raise NotFound(f"this server does not serve a pipeline {name!r} (it serves: {served})")
        return found

    def close(self) -> None:
        """Close the idle stores; one lent now is closed when its call gives it back."""
        with self._lock:
            stores, self._idle, self._closed = self._idle, [], True
        for store in stores:
            _close(store)


def _close(store: SqlStore) -> None:
    try:
        store.close()
    except Exception:  # closing a connection that broke: it is gone already
        pass


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


async def caller(request: Request) -> Caller:
    """The caller of this request (a FastAPI dependency): 401 without a valid token, 403 for a revoked one.

    Checked once per request: the body guard (api/bodies.py) asks first, before any body is read, and the
    route's dependency gets the same answer from ``request.state``."""
    known: Caller | None = getattr(request.state, "caller", None)
    if known is not None:
        return known
    svc = services(request)
    found = LOCAL if not svc.settings.auth else await svc.call(authenticate, request.headers.get("authorization"))
    request.state.caller = found
    return found


# Route parameters every router takes: the caller (authenticated) and the server's parts.
Who = Annotated[Caller, Depends(caller)]
Svc = Annotated[Services, Depends(services)]


class Scoped:
    """The store as one request's caller sees it, made once per request: each call gets a ``TenantView`` of that
    thread's store for the caller (service/tenancy.py), so no route passes a tenant, or could forget one."""

    def __init__(self, svc: Services, who: Caller) -> None:
        self.svc, self.who = svc, who

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(view, *args, **kwargs)`` in the thread pool, ``view`` the caller's TenantView."""
        return await run_in_threadpool(
            self.svc._with_store, lambda store: fn(TenantView(store, self.who), *args, **kwargs))


def scoped(svc: Svc, who: Who) -> Scoped:
    return Scoped(svc, who)


# What a route reads or writes for its caller goes through this (never Svc.call with a tenant of its own).
View = Annotated[Scoped, Depends(scoped)]


def base_url(request: Request) -> str:
    public = services(request).settings.public_url
    return (public or str(request.base_url)).rstrip("/")
