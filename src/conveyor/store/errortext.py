"""Full-text search over the error messages of tasks: "the items whose error says 429", among a million.

Only the tasks that carry an error class are indexed (failed, dead-lettered, rejected, waiting for review:
the rows of the partial index ``tasks_unsettled``), so the index stays the size of the trouble, not of the run.

SQLite: an FTS5 table over ``tasks.last_error`` (external content: the message is stored once), kept by
triggers whose WHEN clause is false for a task without an error class. A trigger costs the statements it is
compiled into about 1 us a row even when its WHEN clause is false (SQLite calls its program for every row), so
the hot path's statements leave them out: the update trigger fires only on an UPDATE that sets ``error_class``
or ``last_error`` (the success of a task without an error sets neither: store/tasks.py ``mark_succeeded``), and
there is no insert trigger (migration 33 dropped it): the two statements that insert a task with an error (a
refusal answered from the memo, an unreadable input) index their new rows themselves (``index_new_errors``).
PostgreSQL: a GIN index over the message's tsvector restricted to those tasks; it follows the rows by itself.
Schema migration 26 makes either (``{task_error_text}``).

A user's words never become query syntax (store/fulltext.py): every word must be found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conveyor.store.fulltext import fts5_query

if TYPE_CHECKING:
    from conveyor.store.dialect import Dialect

ERROR_TEXT_CHARS = 20_000  # characters of a message PostgreSQL's index reads (a tsvector is bounded)
_INDEXED = "{row}.error_class IS NOT NULL AND {row}.last_error IS NOT NULL"

SQLITE_ERROR_TEXT = f"""
CREATE VIRTUAL TABLE task_error_text USING fts5(last_error, content='tasks', content_rowid='id');
INSERT INTO task_error_text (rowid, last_error) SELECT id, last_error FROM tasks t WHERE {_INDEXED.format(row='t')};
CREATE TRIGGER task_error_text_insert AFTER INSERT ON tasks WHEN {_INDEXED.format(row='new')} BEGIN
    INSERT INTO task_error_text (rowid, last_error) VALUES (new.id, new.last_error);
END;
CREATE TRIGGER task_error_text_update AFTER UPDATE OF error_class, last_error ON tasks
WHEN old.error_class IS NOT NULL OR new.error_class IS NOT NULL BEGIN
    INSERT INTO task_error_text (task_error_text, rowid, last_error) SELECT 'delete', old.id, old.last_error
        WHERE {_INDEXED.format(row='old')};
    INSERT INTO task_error_text (rowid, last_error) SELECT new.id, new.last_error WHERE {_INDEXED.format(row='new')};
END;
CREATE TRIGGER task_error_text_delete AFTER DELETE ON tasks WHEN {_INDEXED.format(row='old')} BEGIN
    INSERT INTO task_error_text (task_error_text, rowid, last_error) VALUES ('delete', old.id, old.last_error);
END"""

# SQLite: the entries of the tasks inserted with an error after the task ``?`` (the largest id before the insert:
# the store has one writer, so every row its insert made has a larger id; a row revived by the insert's conflict
# clause keeps its id, and the update trigger indexes it). Migration 33 dropped the insert trigger that did this.
SQLITE_NEW_ERRORS = f"""INSERT INTO task_error_text (rowid, last_error) SELECT id, last_error FROM tasks t
WHERE id > ? AND {_INDEXED.format(row='t')}"""
SQLITE_DROP_INSERT_TRIGGER = "DROP TRIGGER IF EXISTS task_error_text_insert"

POSTGRES_ERROR_TEXT = (f"CREATE INDEX tasks_error_text ON tasks USING GIN "
                       f"(to_tsvector('simple', left(last_error, {ERROR_TEXT_CHARS}))) WHERE error_class IS NOT NULL")


def newest_task(db: Dialect) -> int:
    """The largest task id so far (0: none), for ``index_new_errors`` after an insert; 0 on PostgreSQL (unused)."""
    return int(db.execute("SELECT COALESCE(MAX(id), 0) FROM tasks")[0][0]) if db.name == "sqlite" else 0


def index_new_errors(db: Dialect, after: int) -> None:
    """SQLite: index the messages of the tasks inserted with an error since ``newest_task`` answered ``after``, in
    the same transaction. Nothing on PostgreSQL, whose index follows the rows."""
    if db.name == "sqlite":
        db.execute(SQLITE_NEW_ERRORS, (after,))


def error_text_clause(db: Dialect, query: str) -> tuple[str, list[Any]]:
    """A condition on task ``t``: every word of ``query`` is in its error message."""
    if db.name == "postgres":
        return (f"t.error_class IS NOT NULL AND to_tsvector('simple', left(t.last_error, {ERROR_TEXT_CHARS})) "
                "@@ plainto_tsquery('simple', ?)", [query])
    return "t.id IN (SELECT rowid FROM task_error_text WHERE task_error_text MATCH ?)", [fts5_query(query)]
