"""The fleet's view of its workers: each worker beats with its lease keeping (worker.py ``_keep_leases``).

A worker beats once per lease-keeping round (``beat_s``: a third of its lease, at least 0.2 s), in the
same transaction as its scan for expired leases, so beating takes no lock it did not take before. It is
``live`` while its last beat is at most ``LOST_AFTER_BEATS`` rounds old (about one lease), ``lost`` after
that (killed, stalled or cut off: its leases run out as well), and ``stopped`` once it exited cleanly.
Rows of workers silent for ``FORGET_AFTER_S`` are deleted, a bounded batch at each worker's start.
"""

from __future__ import annotations

import os
import socket

LOST_AFTER_BEATS = 3
FORGET_AFTER_S = 7 * 86400.0
MIN_BEAT_S = 0.2


def beat_seconds(lease_seconds: float) -> float:
    """How often a worker renews its leases and beats: a third of its lease."""
    return max(MIN_BEAT_S, lease_seconds / 3)


def worker_state(stopped_at: float | None, heartbeat_at: float, beat_s: float, now: float) -> str:
    """``stopped`` (a clean exit), ``live`` (beat within LOST_AFTER_BEATS rounds) or ``lost``."""
    if stopped_at is not None:
        return "stopped"
    return "live" if now - heartbeat_at <= LOST_AFTER_BEATS * beat_s else "lost"


def this_process() -> tuple[str, int]:
    """(host, pid) of this worker, as its id (``host:pid:nonce``) names them."""
    return socket.gethostname(), os.getpid()
