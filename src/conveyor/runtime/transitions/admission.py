"""Admission: a submission's items and their first tasks."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.runtime import tracing
from conveyor.runtime.transitions.readiness import Readiness
from conveyor.runtime.values import Ref
from conveyor.store import NewItem
from conveyor.store.queuecounts import OpenTally
from conveyor.store.runtotals import RunTally


class Admission(Readiness):
    def admit(self, run_id: str, sources: Sequence[tuple[str, Ref]], now: float,
              bad: Sequence[tuple[str, str]] = (), metas: Mapping[str, Mapping[str, Any]] | None = None,
              ) -> tuple[int, int]:
        """Create root items (key, source) and their tasks. An item that settled in the latest earlier run
        of the same graph, from the same source, is copied from there (store/replay.py); the others are
        planned through the memo. Items in ``bad`` (key, why) have no readable source: each of their root
        tasks ends ``failed`` with error class ``bad_input`` at once. Returns (tasks answered from the
        memo, tasks queued to run). The planning (memo lookups, rows) is done before the write
        transaction opens: with SQLite's one writer, workers keep committing meanwhile."""
        x = self.expander
        items = [NewItem(run_id, key, None, key, ref.digest, ref.size, now) for key, ref in sources]
        items += [NewItem(run_id, key, None, key, None, None, now) for key, _ in bad]
        base = x.replay_base(run_id)
        replayed = set(self.store.settled_roots(base, [(key, ref.digest) for key, ref in sources])) if base else set()
        seeds = [seed for key, ref in sources if key not in replayed for seed in x.roots(run_id, key, ref)]
        tasks, new_items, cached = x.plan(seeds, now, items)
        pending = x.take_pending()
        x.refuse_bad(tasks, run_id, bad, now)
        notices = self.stale_notices(x.take_stale(), now)
        tracer = tracing.active()
        traced = tracer.start_items(self.pipeline.name, run_id, [i.item_key for i in items], now) if tracer else None
        totals, opened = RunTally(), OpenTally()
        with self.store.transaction():
            self.store.insert_items(new_items)
            if traced is not None and traced.traceparents:
                self.store.set_item_traces(run_id, traced.traceparents)
            if metas:
                self.store.set_item_meta(run_id, {key: json.dumps(meta, sort_keys=True) for key, meta in metas.items()})
            if base and replayed:
                copied = [key for key, _ in sources if key in replayed]
                cached += self.store.copy_settled(base, run_id, copied, now, x.lane_rank(run_id), x.has_fanout,
                                                  totals)
                if x.base_has_provenance(base):
                    self.store.copy_provenance(base, run_id, copied)
                self.store.copy_notices(base, run_id)
            if tasks:
                self.store.insert_tasks(tasks, totals, opened)
            if pending:  # joins and gathers on tasks of earlier commits (a submission taken over to be finished)
                cached += self.decide_waiting(pending, now, totals, opened).cached
            self.store.add_run_totals(totals)  # once per transaction (see store.insert_tasks)
            self.store.add_open_tasks(opened)
            if notices:
                self.store.add_notices(notices)
        if traced is not None:
            traced.end()  # the items exist: their root spans may be exported
        return cached, len(tasks.queued)
