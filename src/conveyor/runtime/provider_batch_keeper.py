"""The provider batch keeper: packs a pipeline's parked model requests into batch files, creates them on the
provider, polls them, and stores what they answered, waking the tasks that wait.

Any worker with the lane on runs it; one per pipeline at a time holds its lease (``provider_batch_keepers``).
A batch is recorded (state ``creating``, its tag: a hash of its content) before it is created, and its
provider id recorded as soon as it is; a keeper that died in between leaves a ``creating`` row, and the next
round looks the tag up on the provider and adopts the batch it finds, creating it only when there is none:
a batch is never lost and never paid for twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from conveyor.providers.base import ProviderError
from conveyor.providers.batchapi import BatchEntry, BatchState
from conveyor.runtime.provider_batch import BatchSettings
from conveyor.store.provider_batch import PendingRequest, ProviderBatch, Settled

log = logging.getLogger("conveyor.provider_batch")
T = TypeVar("T")
StoreCall = Callable[..., Awaitable[Any]]
FIRST_POLL_S = 1.0
MAX_BATCHES_PER_ROUND = 20
KEEPER_LEASE_S = 15.0  # renewed every round, and every third of it while a round talks to the provider
GATHER_AT_MOST = 30  # × gather_s: the longest a request waits for its batch file to fill
MAX_TRIES = 5  # attempts to create one batch file before its requests are called directly


def tag_of(pipeline: str, provider: str, model: str, lines: Sequence[bytes], tries: Sequence[int],
           packed_at: float) -> str:
    """The batch's tag: a hash of what it holds, of how many times its requests were batched and of when it
    was packed (the same requests asked again later make a batch of their own)."""
    digest = hashlib.sha256(
        f"{pipeline}\0{provider}\0{model}\0{','.join(map(str, tries))}\0{packed_at!r}\0".encode())
    for line in lines:
        digest.update(line)
    return digest.hexdigest()[:40]


class BatchKeeper:
    """One pipeline's batches, kept by one worker (``owner``) while it holds the keeper lease."""

    def __init__(self, pipeline: str, owner: str, settings: BatchSettings, store: StoreCall,
                 api: Callable[[], Any], clock: Callable[[], float], settle: StoreCall) -> None:
        self.pipeline, self.owner, self.settings = pipeline, owner, settings
        self.store, self.api, self.clock = store, api, clock
        # Storing what batches answered wakes tasks: a transition (Transitions.settle_batch_requests).
        self.settle = settle
        self.lease_s = KEEPER_LEASE_S
        self.after_create: Callable[[BatchState], None] | None = None  # a test's crash point
        self.stats: Counter[str] = Counter()

    async def _held(self) -> bool:
        """Take or renew the keeper lease: before each step that talks to the provider, so a long round cannot
        outlast it while another worker takes over."""
        now = self.clock()
        return bool(await self.store("take_batch_keeper", self.pipeline, self.owner, now, now + self.lease_s))

    async def round(self) -> bool:
        """One round: False when another worker keeps this pipeline's batches now."""
        if not await self._held():
            return False
        async with self._renewing():  # an upload of 200 MB may take longer than the lease
            return await self._round()

    @contextlib.asynccontextmanager
    async def _renewing(self) -> AsyncIterator[None]:
        async def beat() -> None:
            while True:
                await asyncio.sleep(self.lease_s / 3)
                await self._held()

        beating = asyncio.create_task(beat())
        try:
            yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def _round(self) -> bool:
        now = self.clock()
        api = self.api()
        if api is None:
            return True
        overdue = await self.store("overdue_requests", self.pipeline, now)
        if overdue:
            await self._settle([Settled(c, "direct", error="past its batch_deadline") for c in overdue], None, "")
        for batch in await self.store("open_batches", self.pipeline):
            if not await self._held():
                return False
            try:
                if batch.state == "creating":
                    await self._create(api, batch)
                elif batch.next_poll_at is None or batch.next_poll_at <= now:
                    await self._poll(api, batch)
            except ProviderError as exc:
                await self._failed(batch, exc)
        await self._pack(api, now)
        return True

    async def release(self) -> None:
        await self.store("drop_batch_keeper", self.pipeline, self.owner)

    # --- packing and creating ------------------------------------------------

    async def _pack(self, api: Any, now: float) -> None:
        max_requests = min(self.settings.max_requests or api.limits.requests, api.limits.requests)
        max_bytes = min(self.settings.max_bytes or api.limits.bytes, api.limits.bytes)
        made = 0
        for group in await self.store("pending_groups", self.pipeline):
            count = group.requests
            quiet = now - group.newest >= self.settings.gather_s
            waited = now - group.oldest >= GATHER_AT_MOST * self.settings.gather_s  # a steady trickle
            while count and made < MAX_BATCHES_PER_ROUND and (count >= max_requests or quiet or waited):
                pending = await self.store("pending_requests", self.pipeline, group.model, max_requests)
                chosen: list[tuple[PendingRequest, bytes]] = []
                size = 0
                for request in sorted(pending, key=lambda r: r.custom_id):
                    line = api.line(request.custom_id, json.loads(request.body))
                    if chosen and size + len(line) > max_bytes:
                        continue
                    chosen.append((request, line))
                    size += len(line)
                if not chosen or not await self._held():
                    break
                lines = [line for _, line in chosen]
                tag = tag_of(self.pipeline, api.name, group.model, lines, [r.tries + 1 for r, _ in chosen], now)
                row = ProviderBatch(0, self.pipeline, api.name, group.model, tag, None, "creating", None,
                                    len(chosen), size, 0, now, None, None, 0, None, 0, 0, 0, 0)
                row = row._replace(id=await self.store("pack_batch", row, [r.custom_id for r, _ in chosen]))
                log.info("provider batch %s: %d requests (%d bytes) of %s packed", tag[:12], len(chosen), size,
                         group.model, extra={"event": "provider_batch_packed"})
                self.stats["batches_packed"] += 1
                try:
                    await self._create(api, row)
                except ProviderError as exc:
                    await self._failed(row, exc)
                count -= len(chosen)
                made += 1

    async def _create(self, api: Any, batch: ProviderBatch) -> None:
        """Create the batch on the provider, or adopt the one a keeper that died before recording it made."""
        await self.store("note_create_try", batch.id)
        found = await self._find(api, batch) if batch.create_tries > 0 else None
        if found is not None:
            self.stats["batches_adopted"] += 1
            log.warning("provider batch %s adopted: it was created (as %s) before its keeper stopped", batch.tag[:12],
                        found.id, extra={"event": "provider_batch_adopted"})
        else:
            rows = await self.store("packed_bodies", batch.id)
            lines = [api.line(custom_id, json.loads(body)) for custom_id, body, _ in rows]
            if tag_of(self.pipeline, api.name, batch.model, lines, [t for _, _, t in rows], batch.created_at) \
                    != batch.tag:
                raise RuntimeError(f"provider batch {batch.tag}: its requests changed since it was packed")
            found = await api.create(batch.model, lines, batch.tag)
            self.stats["batches_created"] += 1
            if self.after_create is not None:
                self.after_create(found)
        now = self.clock()
        await self.store("record_submitted", batch.id, found.id, found.status, now, now + FIRST_POLL_S)
        log.info("provider batch %s submitted as %s", batch.tag[:12], found.id,
                 extra={"event": "provider_batch_submitted"})

    async def _find(self, api: Any, batch: ProviderBatch) -> BatchState | None:
        """The batch an earlier try may have created; None when there is none, or the provider cannot list its
        batches (then nothing could be adopted anyway)."""
        try:
            found: BatchState | None = await api.find(batch.tag, batch.created_at, batch.requests)
        except ProviderError as exc:
            if exc.retryable:
                raise
            log.warning("provider batch %s: cannot list the provider's batches to adopt it (%s); creating it",
                        batch.tag[:12], exc, extra={"event": "provider_batch_error"})
            return None
        return found

    async def _failed(self, batch: ProviderBatch, exc: ProviderError) -> None:
        """The provider refused to create or show a batch: tried again next round while the error is one that
        retries (at most MAX_TRIES times to create it); otherwise its requests are called directly."""
        tries = batch.create_tries + 1 if batch.state == "creating" else 0
        if exc.retryable and (batch.state != "creating" or tries < MAX_TRIES):
            log.warning("provider batch %s: %s; trying again", batch.tag[:12], exc,
                        extra={"event": "provider_batch_error"})
            if batch.state != "creating":
                await self.store("note_poll", batch.id, batch.status or "", self.clock() + self.settings.poll_s)
            return
        packed = await self.store("packed_requests", batch.id)
        why = f"the provider batch could not be {'created' if batch.state == 'creating' else 'read'}: {exc}"
        await self._settle([Settled(c, "direct", error=why[:500]) for c, _, _ in packed], batch.id,
                           f"failed:{exc.error_class}")
        log.warning("provider batch %s given up (%s): its %d requests are called directly", batch.tag[:12], exc,
                    len(packed), extra={"event": "provider_batch_given_up"})

    # --- polling and settling --------------------------------------------------

    async def _poll(self, api: Any, batch: ProviderBatch) -> None:
        assert batch.provider_batch_id is not None
        state = await api.status(batch.provider_batch_id)
        now = self.clock()
        if not state.ended:
            wait = min(self.settings.poll_s, FIRST_POLL_S * 2 ** min(batch.polls, 16))
            await self.store("note_poll", batch.id, state.status, now + wait)
            return
        packed = await self.store("packed_requests", batch.id)
        entries = await api.results(batch.provider_batch_id, [c for c, _, _ in packed])
        tries = {c: (t, m) for c, t, m in packed}
        settled = [_settled(entry, *tries[entry.custom_id]) for entry in entries]
        woken = await self._settle(settled, batch.id, state.status)
        counts = Counter(s.state for s in settled)
        log.info("provider batch %s (%s) %s: %d answered, %d failed, %d batched again, %d to call directly; "
                 "%d tasks woken", batch.tag[:12], batch.provider_batch_id, state.status, counts["answered"],
                 counts["failed"], counts["pending"], counts["direct"], woken,
                 extra={"event": "provider_batch_ended"})

    async def _settle(self, settled: list[Settled], batch_id: int | None, status: str) -> int:
        woken: int = await self.settle(settled, self.clock(), batch_id, status)
        self.stats.update(Counter(f"requests_{s.state}" for s in settled))
        return woken


def _settled(entry: BatchEntry, tries: int, max_tries: int) -> Settled:
    """What becomes of one entry: answered; expired → called directly; a retryable error → batched again
    while its tries last, then called directly; any other error → failed."""
    if entry.body is not None:
        return Settled(entry.custom_id, "answered", json.dumps(entry.body))
    if entry.expired:
        return Settled(entry.custom_id, "direct", error="the batch expired before answering it")
    error = entry.error
    error_class = str(getattr(error, "error_class", "server_error"))
    if getattr(error, "retryable", True):
        return Settled(entry.custom_id, "pending" if tries < max_tries else "direct", None, error_class, str(error))
    return Settled(entry.custom_id, "failed", None, error_class, str(error))
