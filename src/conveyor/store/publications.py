"""The built-in publication target: versioned records with their full-text entries and vectors."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.store.dialect import Dialect
from conveyor.store.records import NewPublication


class PublicationQueries:
    db: Dialect

    def publish(self, rows: Sequence[NewPublication]) -> int:
        """Publish each row as its item's new live version, inside the caller's transaction."""
        raise NotImplementedError("being built in this session")
