"""What the provider batch lane asks of a provider's Batch API (OpenAI ``/v1/files`` + ``/v1/batches``,
Anthropic message batches): the records it works with and the protocol an adapter's ``batch_api()`` returns.

The lane (runtime/provider_batch.py) builds each request's body with ``body``, writes a batch file of
``line``s, creates it tagged with a hash of its content (``create``), finds it again by that tag after a crash
(``find``), polls it (``status``) and reads its entries (``results``); an answered entry becomes a
``Completion`` costed at the batch price (``completion``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from conveyor.providers.base import Completion


class BatchLimits(NamedTuple):
    """How much one batch may hold."""

    requests: int
    bytes: int


class BatchState(NamedTuple):
    """A provider batch as last seen: its id, the provider's status word, and whether it has ended."""

    id: str
    status: str
    ended: bool


class BatchEntry(NamedTuple):
    """One entry of an ended batch: ``body`` the answer (a response body), else ``error`` its ProviderError;
    ``expired`` when the batch ran out of time before answering it (it is then called directly)."""

    custom_id: str
    body: dict[str, Any] | None
    error: Exception | None = None
    expired: bool = False


class BatchApi(Protocol):
    name: str
    limits: BatchLimits

    def body(self, messages: Sequence[Any], options: dict[str, Any]) -> dict[str, Any]: ...

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes: ...

    async def create(self, model: str, lines: Sequence[bytes], tag: str) -> BatchState: ...

    async def find(self, tag: str, since: float, requests: int) -> BatchState | None: ...

    async def status(self, batch_id: str) -> BatchState: ...

    async def results(self, batch_id: str, custom_ids: Sequence[str]) -> list[BatchEntry]: ...

    def completion(self, body: dict[str, Any], options: dict[str, Any]) -> Completion: ...
