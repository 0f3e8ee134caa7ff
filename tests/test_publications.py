"""The built-in publication target, on both backends: versions replace each other atomically, an unchanged
re-run publishes nothing, rollbacks are recorded versions, a failed replacement leaves the old one live,
a SIGKILL never leaves half a version, and search takes any user text literally."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.errors import NotFound, UserError
from conveyor.service.publications import publications, rollback, search
from conveyor.store import CHILD_MARK, NewPublication, SqlStore, fulltext, open_store
from tests.helpers import SRC, cli, cli_json, make_docs, query, submit_and_work, write_pipeline

# VERSION is the parse stage's version; GEN what it makes (the record's word, vectors and fields); NOISE a part
# of parse's output that the record ignores; FAIL makes parse refuse every item.
PIPELINE = """
    import os
    from conveyor import Pipeline, TerminalError
    from conveyor.acceptance import Record

    pipe = Pipeline("pubs")
    WORDS = {"1": "apple", "2": "banana", "3": "cherry"}

    @pipe.stage(version=os.environ.get("VERSION", "1"))
    def parse(ctx, source: bytes) -> dict:
        if os.environ.get("FAIL"):
            raise TerminalError("parse refuses this generation")
        return {"title": source.decode(), "gen": os.environ.get("GEN", "1"), "noise": os.environ.get("NOISE", "")}

    @pipe.stage(after=parse, kind="publish", into="docs")
    def publish(ctx, doc: dict) -> Record:
        gen = doc["gen"]
        return Record(fields={"title": doc["title"], "gen": gen}, text=f"{doc['title']} {WORDS[gen]}",
                      vectors=[[float(gen), 0.5], [1.0, -2.0, 0.25]])
"""
DOCS = ["doc0000.txt", "doc0001.txt", "doc0002.txt"]


class Project:
    """A pipeline file, its documents and a store, run through `conveyor run` (a fresh process each time)."""

    def __init__(self, tmp_path: Path, store_url: str) -> None:
        self.tmp_path, self.url = tmp_path, store_url
        self.target = write_pipeline(tmp_path, PIPELINE)
        self.docs = make_docs(tmp_path / "docs", len(DOCS), fmt="document number {i}")

    def run(self, **env: str) -> dict[str, Any]:
        return cli_json("run", self.target, "--input", str(self.docs), "--workers", "0", *self.db(),
                        "--blobs", str(self.tmp_path / "blobs"), cwd=self.tmp_path, env=env)

    def db(self) -> list[str]:
        return ["--db", self.url]

    def store(self) -> SqlStore:
        return open_store(self.url)


@pytest.fixture
def project(tmp_path: Path, store_url: str) -> Project:
    return Project(tmp_path, store_url)


@pytest.fixture
def opened(project: Project) -> Iterator[SqlStore]:
    store = project.store()
    yield store
    store.close()


def live_counts(url: str) -> dict[str, int]:
    return {key: int(n) for key, n in query(
        url, "SELECT item_key, COUNT(*) FROM publications WHERE live = 1 GROUP BY collection, item_key")}


def hits(store: SqlStore, words: str, collection: str | None = None) -> list[tuple[str, int]]:
    return sorted((h["item_key"], h["version"]) for h in search(store, words, collection, 50)["results"])


def content(store: SqlStore, item: str, version: int) -> tuple[Any, ...]:
    found = store.publication_content("docs", item, version)
    assert found is not None
    return json.loads(found.fields or "null"), found.text, found.vectors


# --- (a) a new version replaces the live one; search sees only it ------------------------------------

def test_a_replacement_is_the_one_live_version_and_search_finds_only_its_words(
    project: Project, opened: SqlStore,
) -> None:
    assert project.run()["outcomes"] == {"published": 3}
    assert project.run(VERSION="2", GEN="2")["outcomes"] == {"published": 3}

    assert live_counts(project.url) == {doc: 1 for doc in DOCS}
    listing = publications(opened, DOCS[0])
    assert listing["live_version"] == 2 and [v["version"] for v in listing["versions"]] == [2, 1]
    assert [v["live"] for v in listing["versions"]] == [True, False]
    assert listing["versions"][1]["fields"] == {"title": "document number 0", "gen": "1"}
    assert hits(opened, "banana") == [(doc, 2) for doc in DOCS]
    assert hits(opened, "apple") == []
    assert hits(opened, "document number 1") == [(DOCS[1], 2)]


def test_each_version_names_its_run_and_the_stage_versions_that_made_it(project: Project, opened: SqlStore) -> None:
    first = project.run()["run_id"]
    second = project.run(VERSION="2", GEN="2")["run_id"]

    newest, oldest = publications(opened, DOCS[0], "docs")["versions"]
    assert (newest["run_id"], oldest["run_id"]) == (second, first)
    assert newest["provenance"]["pipeline"] == "pubs" and newest["created_by"] == "conveyor"
    stages = {s["stage"]: s["version"] for s in newest["provenance"]["stages"]}
    assert stages == {"parse": "2", "publish": "1"}
    assert {s["stage"]: s["version"] for s in oldest["provenance"]["stages"]} == {"parse": "1", "publish": "1"}
    assert all(s["config_hash"] for s in newest["provenance"]["stages"])


# --- (b) an unchanged re-run publishes nothing new ----------------------------------------------------

def test_an_unchanged_rerun_publishes_nothing(project: Project, opened: SqlStore) -> None:
    project.run()
    again = project.run()
    assert again["stage_calls"] == 0 and again["outcomes"] == {"published": 3}
    # The publish stage runs again (its input changed) but stages the same record: still no new version.
    noisy = project.run(VERSION="2", NOISE="other")
    assert noisy["stage_calls"] == 6

    assert query(project.url, "SELECT COUNT(*) FROM publications")[0][0] == 3
    assert live_counts(project.url) == {doc: 1 for doc in DOCS}
    assert publications(opened, DOCS[2])["live_version"] == 1


# --- (c) rollback of an item is a recorded version ------------------------------------------------------

def test_rollback_restores_the_replaced_content_as_a_new_version_and_back_again(
    project: Project, opened: SqlStore,
) -> None:
    project.run()
    project.run(VERSION="2", GEN="2")
    item = DOCS[0]

    done = rollback(opened, item, by="ana", reason="gen 2 titles are wrong")
    assert done["rolled_back"] == [{"item_key": item, "collection": "docs", "from_version": 2, "to_version": 3,
                                    "action": "rollback"}]
    assert content(opened, item, 3) == content(opened, item, 1)
    assert content(opened, item, 1)[2] == [[1.0, 0.5], [1.0, -2.0, 0.25]]
    third = publications(opened, item)["versions"][0]
    assert (third["version"], third["action"], third["live"], third["restores"]) == (3, "rollback", True, 1)
    assert (third["created_by"], third["reason"]) == ("ana", "gen 2 titles are wrong")
    assert hits(opened, "apple") == [(item, 3)] and (item, 2) not in hits(opened, "banana")

    again = rollback(opened, item, by="ana")["rolled_back"][0]
    assert (again["from_version"], again["to_version"]) == (3, 4)
    assert content(opened, item, 4) == content(opened, item, 2)
    assert publications(opened, item)["versions"][0]["restores"] == 2
    assert hits(opened, "banana") == [(doc, 4 if doc == item else 2) for doc in DOCS]
    assert live_counts(project.url) == {doc: 1 for doc in DOCS}


def test_rolling_back_a_first_version_retracts_the_item(project: Project, opened: SqlStore) -> None:
    project.run()
    done = rollback(opened, DOCS[1], by="ana", reason="should not be public")["rolled_back"][0]

    assert (done["action"], done["from_version"], done["to_version"]) == ("retract", 1, 2)
    listing = publications(opened, DOCS[1])
    assert listing["live_version"] is None and listing["versions"][0]["fields"] is None
    assert hits(opened, "apple") == [(DOCS[0], 1), (DOCS[2], 1)]
    with pytest.raises(UserError, match=f"item '{DOCS[1]}' has no live version"):
        rollback(opened, DOCS[1])


# --- (d) rollback of a run -------------------------------------------------------------------------------

def test_rollback_of_a_run_rolls_back_every_item_it_published(project: Project, opened: SqlStore) -> None:
    project.run()
    second = project.run(VERSION="2", GEN="2")["run_id"]

    done = rollback(opened, run_id=second, reason="bad model")
    assert sorted((r["item_key"], r["from_version"], r["to_version"], r["action"]) for r in done["rolled_back"]) == [
        (doc, 2, 3, "rollback") for doc in DOCS]
    assert hits(opened, "apple") == [(doc, 3) for doc in DOCS] and hits(opened, "banana") == []
    assert all(content(opened, doc, 3) == content(opened, doc, 1) for doc in DOCS)
    assert rollback(opened, run_id=second)["rolled_back"] == [], "the run publishes no live version any more"
    with pytest.raises(NotFound, match="no run 'r-none'"):
        rollback(opened, run_id="r-none")


def test_rollback_of_a_run_larger_than_the_item_locks_of_a_transaction(store: SqlStore) -> None:
    count = fulltext.MAX_ITEM_LOCKS + 200
    for gen in (1, 2):
        with store.transaction():
            assert store.publish([
                NewPublication("bulk", f"k{i}", "manual", f"r{gen}", i, f"d{gen}", json.dumps({"gen": gen}),
                               f"bulk gen{gen}", [[float(gen)]], time.time()) for i in range(count)]) == count

    assert len(store.rollback_run("r2", "ana", None, time.time())) == count
    assert len(search(store, "gen1", limit=count + 1)["results"]) == count
    assert search(store, "gen2")["results"] == []


def test_a_fanout_childs_provenance_names_its_ancestors_stages(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, FANOUT, "fanout.py")
    done = submit_and_work(target, make_docs(tmp_path / "docs", 1, fmt="one two"), store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        listing = publications(store, f"doc0000.txt{CHILD_MARK}1")
    finally:
        store.close()

    assert listing["collection"] == "words" and listing["versions"][0]["fields"] == {"word": "two"}
    assert listing["versions"][0]["run_id"] == done.run_id
    stages = [(s["stage"], s["item_key"], s["version"]) for s in listing["versions"][0]["provenance"]["stages"]]
    assert stages == [("split", "doc0000.txt", "4"), ("publish", f"doc0000.txt{CHILD_MARK}1", "1")]


FANOUT = """
    from conveyor import Pipeline
    from conveyor.acceptance import Record

    pipe = Pipeline("words")

    @pipe.stage(version="4", kind="fanout")
    def split(ctx, source: bytes) -> list[str]:
        return source.decode().split()

    @pipe.stage(after=split, kind="publish", into="words")
    def publish(ctx, word: str) -> Record:
        return Record(fields={"word": word})
"""


# --- (e) a failed replacement never commits ------------------------------------------------------------

def test_a_replacement_whose_stage_fails_leaves_the_old_version_live(project: Project, opened: SqlStore) -> None:
    project.run()
    failed = project.run(VERSION="2", GEN="2", FAIL="1")
    assert failed["outcomes"] == {"failed": 3}

    assert live_counts(project.url) == {doc: 1 for doc in DOCS}
    assert all(publications(opened, doc)["live_version"] == 1 for doc in DOCS)
    assert query(project.url, "SELECT COUNT(*) FROM publications")[0][0] == 3
    assert hits(opened, "apple") == [(doc, 1) for doc in DOCS] and hits(opened, "banana") == []


# --- (f) SIGKILL never leaves half a version --------------------------------------------------------------

ITEMS = 40
CHAOS = """
    import json, random, sys, time
    from conveyor.errors import UserError
    from conveyor.store import NewPublication, fulltext, open_store

    ITEMS = {items}
    if len(sys.argv) > 4:  # fewer item locks: PostgreSQL takes whole collections instead
        fulltext.MAX_ITEM_LOCKS = int(sys.argv[4])
    store = open_store(sys.argv[1])
    rng = random.Random()
    gen = int(sys.argv[3])
    while True:
        gen += 1
        rows = [NewPublication("docs", f"item{{i}}", "chaos", f"run{{gen}}", gen, f"d{{i}}-{{gen}}",
                               json.dumps({{"item": i, "gen": gen}}), f"item{{i}} w{{i}}x{{gen}} " + "filler " * 50,
                               [[float(gen), float(i)]] * (1 + gen % 3), time.time())
                for i in rng.sample(range(ITEMS), 25)]
        with store.transaction():
            store.publish(rows)
        if gen % 4 == 0:
            store.rollback_run(f"run{{gen - 1}}", "chaos", "undo", time.time())
        if gen % 3 == 0:
            try:
                store.rollback_item("docs", f"item{{rng.randrange(ITEMS)}}", "chaos", None, time.time())
            except UserError:
                pass
        with open(sys.argv[2], "a") as progress:
            progress.write(f"{{gen}}\\n")
"""


def _chaos_round(script: Path, url: str, progress: Path, start: int, rng: random.Random) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    before = len(progress.read_text().split()) if progress.exists() else 0
    proc = subprocess.Popen([sys.executable, str(script), url, str(progress), str(start)], env=env)
    try:
        deadline = time.monotonic() + 60
        while (len(progress.read_text().split()) if progress.exists() else 0) <= before:
            assert proc.poll() is None, f"the publisher exited {proc.returncode}"
            assert time.monotonic() < deadline, "the publisher made no progress"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _check_item(store: SqlStore, item: int) -> int:
    """The item's versions are 1..n, at most one is live, each has all of its content, and search finds
    exactly the live version's words. Returns how many versions it has."""
    key = f"item{item}"
    versions = store.publication_versions("docs", key)
    assert [v.version for v in versions] == list(range(len(versions), 0, -1))
    live = [v for v in versions if v.live]
    assert len(live) <= 1
    gens = set()
    for v in versions:
        found = store.publication_content("docs", key, v.version)
        assert found is not None
        if v.action == "retract":
            assert (found.fields, found.text, found.vectors, v.live) == (None, None, [], False)
            continue
        gen = json.loads(found.fields or "{}")["gen"]
        gens.add(gen)
        assert found.text is not None and f"w{item}x{gen} " in found.text
        assert found.vectors == [[float(gen), float(item)]] * (1 + gen % 3) and v.vectors == 1 + gen % 3
    live_gen = json.loads(live[0].fields or "{}")["gen"] if live else None
    for gen in gens:
        expected = [(key, live[0].version)] if gen == live_gen else []
        assert hits(store, f"w{item}x{gen}") == expected, (key, gen)
    return len(versions)


def test_sigkill_never_leaves_a_version_half_written(tmp_path: Path, store: SqlStore, store_url: str) -> None:
    script = tmp_path / "chaos.py"
    script.write_text(textwrap.dedent(CHAOS.format(items=ITEMS)))
    progress, rng = tmp_path / "progress", random.Random()
    for round_ in range(6):
        _chaos_round(script, store_url, progress, 1000 * (round_ + 1), rng)

    assert len(progress.read_text().split()) >= 6
    assert all(n == 1 for n in live_counts(store_url).values())
    versions = sum(_check_item(store, i) for i in range(ITEMS))
    assert versions >= ITEMS
    orphans = query(store_url, "SELECT COUNT(*) FROM publication_vectors v WHERE NOT EXISTS "
                               "(SELECT 1 FROM publications p WHERE p.id = v.publication_id)")
    assert orphans[0][0] == 0


def test_two_publishers_of_the_same_items_never_collide(tmp_path: Path, store: SqlStore, store_url: str) -> None:
    script = tmp_path / "chaos.py"
    script.write_text(textwrap.dedent(CHAOS.format(items=ITEMS)))
    env = {**os.environ, "PYTHONPATH": SRC}
    # The first takes a lock per item; the second locks the whole collection (its batches exceed its limit).
    procs = [subprocess.Popen([sys.executable, str(script), store_url, str(tmp_path / f"progress{n}"), str(start),
                               locks], env=env, stderr=subprocess.PIPE)
             for n, (start, locks) in enumerate(((100_000, "1000"), (200_000, "10")))]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"progress{n}").exists() and len((tmp_path / f"progress{n}").read_text().split())
                      >= 20 for n in range(2)):
            assert all(p.poll() is None for p in procs), "a publisher stopped: " + b"".join(
                p.stderr.read() for p in procs if p.poll() is not None and p.stderr).decode()
            assert time.monotonic() < deadline, "the publishers made no progress"
            time.sleep(0.05)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if proc.stderr:
                proc.stderr.close()

    assert all(n == 1 for n in live_counts(store_url).values())
    assert sum(_check_item(store, i) for i in range(ITEMS)) >= ITEMS


# --- (g) search takes user text literally -----------------------------------------------------------------

def _publish(store: SqlStore, collection: str, item: str, text: str) -> None:
    with store.transaction():
        store.publish([NewPublication(collection, item, "manual", "r-manual", 1, f"{collection}/{item}/{text}",
                                      json.dumps({"item": item}), text, [[0.0]], time.time())])


@pytest.mark.parametrize("words", [
    "-", '"', '"unbalanced', "OR", "apple OR", "NOT apple", "apple AND", "a* (b) NEAR(c, d) ^e", "col:apple",
    "'; DROP TABLE publications; --", "state-of-the-art", "¶ ∑ 日本語", "apple -banana", "%s ? $1",
])
def test_search_takes_punctuation_and_operators_literally(store: SqlStore, words: str) -> None:
    _publish(store, "docs", "a", "a state-of-the-art apple pie")
    _publish(store, "docs", "b", "banana bread; NOT to be confused with apple")

    found = hits(store, words)  # never raises
    assert all(version == 1 for _, version in found)
    assert query_ok(store)


def query_ok(store: SqlStore) -> bool:
    return len(hits(store, "apple")) == 2 and hits(store, "state-of-the-art") == [("a", 1)]


def test_search_operators_are_words_not_syntax(store: SqlStore) -> None:
    _publish(store, "docs", "a", "a state-of-the-art apple pie")
    _publish(store, "docs", "b", "banana bread; NOT to be confused with apple")
    _publish(store, "notes", "c", "apple notes")

    assert hits(store, "apple NOT") == [("b", 1)], "NOT is a word that must occur"
    assert hits(store, "apple OR banana") == [], "no text holds the word 'or'"
    assert hits(store, "apple -banana") == [("b", 1)], "'-banana' is the word banana, not a negation"
    assert hits(store, "apple", "notes") == [("c", 1)]


@pytest.mark.parametrize("words", ["", "   ", "\t\n"])
def test_an_empty_search_is_a_user_error(store: SqlStore, words: str) -> None:
    with pytest.raises(UserError, match="the search query is empty"):
        search(store, words)


def test_a_search_limit_below_one_is_a_user_error(store: SqlStore) -> None:
    with pytest.raises(UserError, match="--limit 0"):
        search(store, "apple", limit=0)


def test_an_item_in_several_collections_needs_one_named(store: SqlStore) -> None:
    _publish(store, "docs", "a", "apple")
    _publish(store, "notes", "a", "apple notes")

    with pytest.raises(UserError, match=re.escape("published in 2 collections (docs, notes); pass --collection")):
        publications(store, "a")
    assert publications(store, "a", "notes")["versions"][0]["fields"] == {"item": "a"}
    with pytest.raises(NotFound, match="never been published in collection 'other'"):
        publications(store, "a", "other")
    assert rollback(store, "a", collection="docs")["rolled_back"][0]["action"] == "retract"
    assert publications(store, "a", "notes")["live_version"] == 1


# --- (h) the command line ---------------------------------------------------------------------------------

def test_cli_json_shapes(project: Project) -> None:
    project.run()
    second = project.run(VERSION="2", GEN="2")["run_id"]
    cwd, db = project.tmp_path, project.db()

    listing = cli_json("publications", DOCS[0], *db, cwd=cwd)
    assert set(listing) == {"item_key", "collection", "live_version", "versions"}
    assert set(listing["versions"][0]) == {"version", "action", "live", "digest", "run_id", "created_at",
                                           "created_by", "reason", "fields", "vectors", "restores", "provenance"}
    assert set(listing["versions"][0]["provenance"]) == {"run_id", "pipeline", "task_id", "created_by", "reason",
                                                         "stages"}
    assert set(listing["versions"][0]["provenance"]["stages"][0]) == {"stage", "item_key", "version", "config_hash"}

    found = cli_json("search", "banana", "--collection", "docs", "--limit", "2", *db, cwd=cwd)
    assert set(found) == {"query", "collection", "results"} and len(found["results"]) == 2
    assert set(found["results"][0]) == {"item_key", "collection", "version", "run_id", "score", "snippet", "fields"}
    assert "[banana]" in found["results"][0]["snippet"] and found["results"][0]["run_id"] == second

    one = cli_json("rollback", DOCS[0], "--reason", "wrong", "--by", "ana", *db, cwd=cwd)
    assert set(one) == {"rolled_back", "run_id", "by", "reason"} and (one["by"], one["reason"]) == ("ana", "wrong")
    assert set(one["rolled_back"][0]) == {"item_key", "collection", "from_version", "to_version", "action"}
    run = cli_json("rollback", "--run", second, *db, cwd=cwd)
    assert sorted(r["item_key"] for r in run["rolled_back"]) == DOCS[1:] and run["run_id"] == second


@pytest.mark.parametrize(("args", "message"), [
    (["rollback", "doc0000.txt", "--run", "r1"], "roll back either an ITEM or a run (--run RUN), not both"),
    (["rollback"], "name what to roll back"),
    (["publications", "nope.txt"], "item 'nope.txt' has never been published"),
    (["rollback", "nope.txt"], "item 'nope.txt' has never been published"),
    (["search", " "], "the search query is empty"),
])
def test_cli_user_errors_are_one_line(project: Project, args: list[str], message: str) -> None:
    project.run()
    proc = cli(*args, *project.db(), "--json", cwd=project.tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_read_only_commands_create_no_store(tmp_path: Path) -> None:
    db = ["--db", f"sqlite:///{tmp_path}/none/conveyor.db"]
    assert cli_json("search", "apple", *db, cwd=tmp_path)["results"] == []
    proc = cli("publications", "a", *db, cwd=tmp_path)
    assert proc.returncode == 2 and "has never been published" in proc.stderr
    assert not (tmp_path / "none").exists()
