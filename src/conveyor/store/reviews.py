"""The review queue: answers waiting for people, and the decisions taken on them."""

from __future__ import annotations

from conveyor.store.dialect import Dialect


class ReviewQueries:
    db: Dialect
