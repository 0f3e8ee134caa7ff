"""runtime/collector.py: a worker's collector settings are its own while it runs and put back after."""

from __future__ import annotations

import gc
import threading

from conveyor.runtime.collector import YOUNG_THRESHOLD, fewer_collections


def test_settings_change_while_workers_run_and_come_back_after_the_last() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    inside, entered, leave = [], threading.Event(), threading.Event()

    def other_worker() -> None:
        with fewer_collections():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=other_worker)
    with fewer_collections():
        inside.append((gc.get_threshold(), gc.get_freeze_count()))
        thread.start()
        assert entered.wait(10)
    # The first one out leaves the settings to the one still running.
    inside.append((gc.get_threshold(), gc.get_freeze_count()))
    leave.set()
    thread.join(10)
    assert all(t[0] == max(before[0], YOUNG_THRESHOLD) and t[1:] == before[1:] and n > frozen for t, n in inside)
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
