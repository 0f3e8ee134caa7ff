"""Two runs side by side: ``conveyor compare RUN_A RUN_B``.

What one accepted item cost in each run (every attempt counted, so a cheap model that answers invalidly
and retries, escalates or goes to review shows its true price), how often each run accepted, sent to
review, rejected and failed, and on the items both runs accepted, how often their records agree field by
field. Items are matched by key, so runs of two pipelines compare too. Both runs are walked in key order a
chunk at a time (as ``conveyor diff`` walks them); a record is read only for an item both runs accepted,
and when the two records are equal by digest only one of them (for its field names).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.blobs import Blobs
from conveyor.service.diff import CHUNK, Pair, Side, batched, field_changes, merge_walks, walk_items
from conveyor.service.records import ABSENT, read_records
from conveyor.service.report import ACCEPTED, find_run, reconcile
from conveyor.store import RunRecord, SqlStore
from conveyor.store.diffs import RecordRef


def compare_runs(store: SqlStore, blobs: Blobs, run_a: str, run_b: str, chunk: int = CHUNK) -> dict[str, Any]:
    """``{"run_a", "run_b", "runs": [A, B], "agreement"}`` (the fields: docs/reference/json.md, ``compare``)."""
    a, b = find_run(store, run_a), find_run(store, run_b)
    return {"run_a": a.run_id, "run_b": b.run_id, "runs": [run_figures(store, a), run_figures(store, b)],
            "agreement": agreement(store, blobs, a, b, chunk).as_json()}


def run_figures(store: SqlStore, run: RunRecord) -> dict[str, Any]:
    """One run's column: its outcomes and usage as ``reconcile`` counts them, its rates over its expected
    items, its wall time and what one accepted item cost."""
    report = reconcile(store, run, limit=0)  # limit 0: no list of the items not done, only the counts
    figures = store.run_figures(run.run_id)
    items, outcomes = report["expected"], report["outcomes"]
    accepted = sum(outcomes.get(name, 0) for name in ACCEPTED)
    return {
        "run_id": run.run_id, "pipeline": run.pipeline, "status": report["status"], "items": items,
        "outcomes": outcomes, "accepted": accepted, "acceptance_rate": rate(accepted, items),
        "review_rate": rate(figures.reviewed_items, items), "rejection_rate": rate(outcomes.get("rejected", 0), items),
        "failure_rate": rate(outcomes.get("failed", 0) + outcomes.get("dead_lettered", 0), items),
        "wall_seconds": None if figures.last_finished_at is None else figures.last_finished_at - run.created_at,
        "usage": report["usage"],
        "per_accepted_item": _per_accepted_item(report["per_accepted_item"], figures.attempts, accepted),
        "models": list(figures.models),
    }


def _per_accepted_item(per_item: dict[str, Any], attempts: int, accepted: int) -> dict[str, Any]:
    """Reconcile's per accepted item (tokens, cost, seconds), with the attempts it took."""
    return {"tokens": per_item["tokens"], "cost": per_item["cost"], "seconds": per_item["seconds"],
            "attempts": attempts / accepted if accepted else None}


def rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass
class Agreement:
    """On the items both runs accepted with a record: how many, how many records are equal, and per field
    (a dotted path, as ``conveyor diff`` names it) how often the two runs' values agree."""

    items: int = 0
    identical: int = 0
    compared: Counter[str] = field(default_factory=Counter)
    agree: Counter[str] = field(default_factory=Counter)

    def count(self, fields: Sequence[tuple[str, bool]]) -> None:
        """One item's fields; its records are identical when every field agrees."""
        self.items += 1
        self.identical += all(same for _, same in fields)
        for name, same in fields:
            self.compared[name] += 1
            self.agree[name] += same

    def as_json(self) -> dict[str, Any]:
        fields = {name: {"compared": n, "agree": self.agree[name], "rate": rate(self.agree[name], n)}
                  for name, n in sorted(self.compared.items())}
        return {"items": self.items, "identical": self.identical, "rate": rate(self.identical, self.items),
                "fields": fields}


def agreement(store: SqlStore, blobs: Blobs, a: RunRecord, b: RunRecord, chunk: int = CHUNK) -> Agreement:
    """The two runs' root items merged by key, a chunk at a time; only the items both accepted are read."""
    found = Agreement()
    for batch in batched(merge_walks(walk_items(store, a, chunk), walk_items(store, b, chunk)), chunk):
        _count_batch(store, blobs, _both_accepted(batch), found)
    return found


def _both_accepted(batch: Sequence[Pair]) -> list[tuple[str, RecordRef, RecordRef]]:
    refs = ((key, _accepted_record(side_a), _accepted_record(side_b)) for key, side_a, side_b in batch)
    return [(key, ref_a, ref_b) for key, ref_a, ref_b in refs if ref_a is not None and ref_b is not None]


def _accepted_record(side: Side | None) -> RecordRef | None:
    """Where the item's record is, when the run accepted the item (it made it: ``ACCEPTED``) and has one."""
    return side.ref if side is not None and side.outcome in ACCEPTED else None


def _count_batch(store: SqlStore, blobs: Blobs, pairs: Sequence[tuple[str, RecordRef, RecordRef]],
                 found: Agreement) -> None:
    """Equal digests need one record (for its field names), different ones both."""
    equal = {key for key, ref_a, ref_b in pairs if (ref_a.digest, ref_a.kind) == (ref_b.digest, ref_b.kind)}
    records_a = read_records(store, blobs, {key: ref_a for key, ref_a, _ in pairs})
    records_b = read_records(store, blobs, {key: ref_b for key, _, ref_b in pairs if key not in equal})
    for key, _, _ in pairs:
        record_a = records_a[key]
        record_b = record_a if key in equal else records_b[key]
        found.count(list(compared_fields(record_a, record_b)))


def compared_fields(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, bool]]:
    """(field, agrees) for every field ``diff.field_changes`` walks (nested objects by dotted path, anything
    else whole, a field one record lacks as a disagreement, a record that is not an object as ``(record)``);
    whether a field agrees is ``field_changes``'s own answer for it."""
    if isinstance(a, dict) and isinstance(b, dict):
        for name in sorted(a.keys() | b.keys()):
            yield from compared_fields(a.get(name, ABSENT), b.get(name, ABSENT), f"{path}.{name}" if path else name)
        return
    yield path or "(record)", not field_changes(a, b, path)
