"""A submission's heartbeat: the sign that its submitter is alive, written from a thread of its own.

Workers that run until idle wait while a run is being submitted (more work may
come). If the submitter is killed, its heartbeat stops; ``ABANDON_AFTER_S``
later the run is marked ``abandoned``, the workers return, and the submission
can be resumed. The heartbeat runs in a thread with its own store connection,
so reading one very large file does not make a live submission look dead.
"""

from __future__ import annotations

import logging
import os
import threading

from conveyor.store import SqlStore, open_store, sqlite_path

log = logging.getLogger("conveyor.submit")

HEARTBEAT_S = 2.0
# Several missed heartbeats: the submitter is gone. CONVEYOR_ABANDON_AFTER_S shortens it, for tests only.
ABANDON_AFTER_S = max(3 * HEARTBEAT_S, float(os.environ.get("CONVEYOR_ABANDON_AFTER_S", "15")))


class Heartbeat:
    """``with Heartbeat(url, run_id, submitter):`` keeps the submission's hold on its run."""

    def __init__(self, url: str, run_id: str, submitter: str, interval: float = HEARTBEAT_S) -> None:
        self.url, self.run_id, self.submitter, self.interval = url, run_id, submitter, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="conveyor-heartbeat", daemon=True)
        self.lost = False  # the run was taken from us (marked abandoned by someone who thought us dead)

    def __enter__(self) -> Heartbeat:
        in_memory = self.url.startswith("sqlite:") and sqlite_path(self.url) is None  # no other process sees it
        if not in_memory:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _beat(self) -> None:
        store, missed = None, 0
        while not self._stop.wait(self.interval):
            try:
                store = store or open_store(self.url, migrate=False)
                if not store.heartbeat(self.run_id, self.submitter, store.clock()):
                    self.lost = True
                missed = 0
            except Exception as exc:  # a missed beat is not fatal; several are, by design
                missed += 1
                log.debug("submission heartbeat of run %s missed", self.run_id, exc_info=True)
                if missed == 2:  # one is noise (the submission itself reports a store it lost, in one line)
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    log.warning("submission heartbeat of run %s missed twice: %s", self.run_id, first,
                                extra={"event": "heartbeat_failed", "run": self.run_id})
        if store is not None:
            store.close()


def submitter_id() -> str:
    """``host:pid:nonce``: who submits, and where, so a dead submitter on this host is seen at once."""
    return f"{os.uname().nodename}:{os.getpid()}:{os.urandom(3).hex()}"


def submitter_gone(submitter: str | None) -> bool:
    """True when ``submitter`` was a process of this machine that no longer exists; False when it is
    alive or runs elsewhere (then only its heartbeat tells)."""
    host, _, rest = (submitter or "").partition(":")
    pid = rest.partition(":")[0]
    if host != os.uname().nodename or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, under another user
        return False
    return False


def stopped(submitter: str | None, heartbeat_at: float, now: float) -> bool:
    """A submission has stopped: its heartbeat is ABANDON_AFTER_S old, or its process is gone."""
    return heartbeat_at < now - ABANDON_AFTER_S or submitter_gone(submitter)


def submission_alive(store: SqlStore, pipeline: str, run_id: str | None, now: float) -> bool:
    """Whether a submission (of ``pipeline``, or of ``run_id``) may still add work; those that stopped
    are marked abandoned on the way."""
    live = store.live_submissions(pipeline, run_id)
    dead = [run for run, submitter, beat in live if stopped(submitter, beat, now)]
    if dead:
        store.abandon_runs(dead, "the submitter stopped (its process is gone, or no heartbeat for "
                                 f"{ABANDON_AFTER_S:g} s)")
    return len(dead) < len(live)
