"""A worker's idle wait (``wait_for_work``, in a thread of its own) that is still waiting when the store is closed:
it returns soon, and the close neither crashes the process nor waits out the wait, on both backends."""

from __future__ import annotations

import threading
import time

from conveyor.store import open_store


def test_closing_the_store_ends_a_wait_still_in_its_thread(store_url: str) -> None:
    for _ in range(3):
        store = open_store(store_url)
        ended: list[float] = []
        waiting = threading.Thread(target=lambda s=store, e=ended: (s.wait_for_work(30.0), e.append(time.monotonic())))
        waiting.start()
        time.sleep(0.3)  # the wait is under way: polling (SQLite) or listening (PostgreSQL)
        closing = time.monotonic()
        store.close()
        waiting.join(10)
        assert not waiting.is_alive() and ended, "the wait outlived the store by 10 s"
        assert ended[0] - closing < 6.0
        assert time.monotonic() - closing < 6.0
