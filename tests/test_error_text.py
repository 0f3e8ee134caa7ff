"""The words of the error messages (store/errortext.py): every way a task gets an error is indexed, and a task that
succeeds after an error has none left to find. On SQLite the index is kept by an update trigger and by the two
inserts of a task with an error (migration 33 dropped the insert trigger); a success sets no column the trigger
watches (store/tasks.py mark_succeeded)."""

from __future__ import annotations

from pathlib import Path

from conveyor.runtime import target as target_module
from conveyor.service.selection import Selection, select_report
from conveyor.store import open_store
from tests.helpers import query, submit_and_work, write_pipeline

PIPE = """
    from pathlib import Path
    from conveyor import Pipeline, Retry, TerminalError

    pipe = Pipeline("errtext", retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> str:
        text = source.decode()
        if "broken" in text:
            raise TerminalError("the grommet cannot be parsed", error_class="unparseable")
        tried = Path(__file__).parent / "tried"
        if "flaky" in text and not tried.exists():
            tried.write_text("once")
            raise RuntimeError("the sprocket timed out")
        return text

    @pipe.stage(after=parse)
    def shout(ctx, text: str) -> str:
        return text.upper()
"""


def _found(store_url: str, run_id: str, words: str) -> list[tuple[str, str]]:
    store = open_store(store_url)
    try:
        report = select_report(store, Selection(runs=(run_id,), error_text=words), 1000, False)
    finally:
        store.close()
    return sorted((i["item_key"], i["stage"]) for i in report["items"])


def test_every_error_is_found_by_its_words_and_a_success_clears_its_own(tmp_path: Path, store_url: str) -> None:
    target_module._cache.clear()
    target = write_pipeline(tmp_path, PIPE)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text('{"key": "a", "text": "alpha fine"}\n{"key": "b", "text": "broken one"}\n'
                        '{"key": "c", "text": "flaky two"}\n{"key": "d", "path": "missing.txt"}\n')
    first = submit_and_work(target, manifest, store_url, tmp_path / "blobs").run_id
    assert _found(store_url, first, "grommet") == [("b", "parse")]  # failed by its attempt (the update trigger)
    assert _found(store_url, first, "exist") == [("d", "parse")]  # unreadable, inserted failed (INSERT_BAD)
    # Retried once, then succeeded: its error is gone from the row and from the index, its successor ran.
    assert _found(store_url, first, "sprocket") == []
    assert query(store_url, "SELECT status, error_class, last_error FROM tasks WHERE run_id = ? AND item_key = 'c' "
                 "AND stage = 'parse'", first) == [("succeeded", None, None)]
    assert query(store_url, "SELECT COUNT(*) FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.run_id = ? "
                 "AND t.item_key = 'c' AND t.stage = 'parse'", first) == [(2,)]
    assert query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status = 'succeeded' AND "
                 "(error_class IS NOT NULL OR last_error IS NOT NULL)", first) == [(0,)]
    # Again: the refusal is answered from the memo, a new row inserted failed (INSERT_FAILED), found by its words.
    second = submit_and_work(target, manifest, store_url, tmp_path / "blobs").run_id
    assert query(store_url, "SELECT status, cached FROM tasks WHERE run_id = ? AND item_key = 'b'", second) == [
        ("failed", 1)]
    assert _found(store_url, second, "grommet") == [("b", "parse")]
    assert _found(store_url, second, "exist") == [("d", "parse")]
    assert _found(store_url, first, "grommet") == [("b", "parse")]
    if store_url.startswith("sqlite"):  # one index entry per task with an error, none for any other
        indexed = query(store_url, "SELECT rowid FROM task_error_text WHERE task_error_text MATCH 'grommet OR exist'")
        erred = query(store_url, "SELECT id FROM tasks WHERE error_class IS NOT NULL AND last_error IS NOT NULL")
        assert sorted(indexed) == sorted(erred) and len(erred) == 4
