"""What a server is told at start: its store, its pipelines, and its limits."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from conveyor.service.webhooks import WebhookPolicy

DEFAULT_MAX_UPLOAD = 1 << 30  # 1 GiB: a document (or a batch's manifest) larger than this is refused with 413
MAX_JSON = 16 << 20  # every other body (JSON, the dashboard's forms): 413 beyond (api/bodies.py)


@dataclass(frozen=True)
class ApiSettings:
    """``pipelines``: the TARGETs served (``file.py:pipe``); a request names one by its pipeline name, or
    leaves it out when only one is served. ``auth=False`` (``--no-auth``) serves one local user, who sees
    everything. ``relay``: deliver webhooks from this process. ``public_url``: the base of the URLs the
    answers give (default: the request's own)."""

    db: str
    blobs: str
    pipelines: tuple[str, ...] = ()
    auth: bool = True
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD
    webhook_policy: WebhookPolicy = field(default_factory=WebhookPolicy)
    relay: bool = True
    sse_poll_s: float = 0.25
    # CONVEYOR_SSE_KEEPALIVE_S shortens the keep-alive for tests; leave it unset in production.
    sse_keepalive_s: float = field(default_factory=lambda: float(os.environ.get("CONVEYOR_SSE_KEEPALIVE_S", "15")))
    public_url: str | None = None
