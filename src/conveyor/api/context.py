"""What every request works with: a store per thread, the blob store, the pipelines served, the caller."""

from __future__ import annotations

import threading
from collections.abc import Callable
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


class Services:
    """The server's parts. Stores are opened once per thread (a store is one connection, not thread-safe);
    every store call runs in the thread pool, never on the event loop."""

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
        self._local = threading.local()
        self._stores: list[SqlStore] = []
        self._lock = threading.Lock()

    def store(self) -> SqlStore:
        store: SqlStore | None = getattr(self._local, "store", None)
        if store is None:
            store = open_store(self.settings.db, migrate=False)
            self._local.store = store
            with self._lock:
                self._stores.append(store)
        return store

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(store, *args, **kwargs)`` in the thread pool, with that thread's store."""
        return await run_in_threadpool(lambda: fn(self.store(), *args, **kwargs))

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
        with self._lock:
            stores, self._stores = self._stores, []
        for store in stores:
            try:
                store.close()
            except Exception:  # closing at shutdown: a connection that broke is gone already
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
        return await run_in_threadpool(lambda: fn(TenantView(self.svc.store(), self.who), *args, **kwargs))


def scoped(svc: Svc, who: Who) -> Scoped:
    return Scoped(svc, who)


# What a route reads or writes for its caller goes through this (never Svc.call with a tenant of its own).
View = Annotated[Scoped, Depends(scoped)]


def base_url(request: Request) -> str:
    public = services(request).settings.public_url
    return (public or str(request.base_url)).rstrip("/")
