"""`make demo`: the manual-page pipeline through the acceptance boundary, review and versioned publication.

Chat goes to the provider simulator, started here in a background thread with realistic faults (5xx, cut-off,
chatty and fenced JSON, slow tails, rare hangs, a tokens-per-minute limit) and a stronger model (sim-2) to
escalate to, unless OPENAI_BASE_URL or OPENAI_API_KEY is set: then to that endpoint, with DEMO_MODEL
(gpt-4o-mini) escalating to DEMO_STRONG_MODEL (gpt-4o). Embeddings come from the local all-MiniLM-L6-v2 model.

1. The first run over a deterministic sample of this machine's manual pages (DEMO_LIMIT, default 300): format
   faults repaired, wrong names refused, low-confidence answers escalated once, the rest sent to review.
2. The review queue from the command line: a few approved (one edited), one rejected, one left to its 48-hour
   deadline, which `conveyor review expire` applies under `faketime` (49 hours later); `conveyor resume` carries
   the approved items to publication; `conveyor search` over the archive, by words and by meaning (`--semantic`:
   the query embedded with the local MiniLM the pages were embedded with); `conveyor reconcile`.
3. The same run again: every task answered from the memo, zero model requests.
4. A bumped prompt version (`--set prompt_version=...`, a run parameter): new answers, new publication versions;
   `conveyor diff` between the runs, one page's versions, a rollback.
5. A new embedding model (`--set embed_model=sim-embed`): the chunks' embeddings and the publish join run again,
   no chat call (extract is on another branch of the graph).
6. One page edited: that page's stages, its section's overview (a group) and publication run again, nothing else.

The demo's store is ./.conveyor/manpages/ (CONVEYOR_DB, CONVEYOR_BLOBS), made afresh on every run. With
CONVEYOR_BLOBS=s3://BUCKET/PREFIX set (and CONVEYOR_S3_ENDPOINT and the AWS variables, see docs/how-to/s3.md) the blobs
go to that bucket instead; the database is still made afresh.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = f"{HERE / 'pipeline.py'}:pipe"
CORPUS = Path(os.environ.get("MANPAGES", "/usr/share/man"))
STATE = Path(".conveyor")
STORE = STATE / "manpages"
DB = STORE / "conveyor.db"
MANIFEST = STATE / "manpages-sample.jsonl"
SIM_LOG = STATE / "provider-sim.jsonl"
# An S3 bucket named in CONVEYOR_BLOBS is kept; any other value is the user's own store, which the demo leaves alone.
USER_BLOBS = os.environ.get("CONVEYOR_BLOBS", "")
BLOBS = USER_BLOBS if USER_BLOBS.startswith("s3://") else str(STORE / "blobs")
LIMIT = int(os.environ.get("DEMO_LIMIT", "300"))
PER_FAMILY = 2  # pages per name family (gcloud_*, git-*, ...) in the sample, so big generated families don't crowd it
EDITED = "man1/ls.1.gz"  # the page step 6 edits
SHOWN = ("man1/ls.1.gz", "man1/gzip.1.gz", "man1/tar.1.gz", "man1/xz.1.gz", "man1/zstd.1.gz")
QUERY = "compress or decompress files"
MEANING = "make an archive smaller"  # few of its words are in the pages that answer it
PROMPTS = ("manpage-record@2", "manpage-record@3")  # the first runs' prompt, and the bumped one
# The simulator's faults and limits; the pipeline's fleet-wide budgets for sim-1 and sim-2 take 99% of them.
SIM = {"seed": 7, "tpm": 200_000, "rpm": 1_200, "latency_ms": 80.0, "latency_tail": 0.6, "error_rate_5xx": 0.02,
       "malformed_rate": 0.01, "truncated_rate": 0.01, "fenced_rate": 0.03, "hang_rate": 0.003,
       "hang_seconds": 30.0}
DEADLINE_SKIP = "+49h"  # past the stage's Review(deadline="48h")


def conveyor(*args: str, env: dict[str, str], capture: bool = False, prefix: tuple[str, ...] = (),
             shown: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [*prefix, sys.executable, "-m", "conveyor", *args]
    words = [shlex.quote(a) if len(a) < 60 else "…" + a[-40:] for a in args]
    print(f"\n$ {shown or ''}conveyor {' '.join(words)}", flush=True)
    return subprocess.run(cmd, text=True, stdout=subprocess.PIPE if capture else None, check=False, env=env)


def conveyor_json(*args: str, env: dict[str, str], ok: tuple[int, ...] = (0,), **kw: Any) -> dict[str, Any]:
    """One command's JSON; `ok`: the exit codes that still print it (3 unaccounted, 4 refused, 5 awaiting review)."""
    done = conveyor(*args, "--json", env=env, capture=True, **kw)
    if done.returncode not in ok:
        raise SystemExit(f"conveyor {args[0]} exited {done.returncode}")
    return dict(json.loads(done.stdout))


def corpus() -> Path:
    if CORPUS.is_dir() and next(CORPUS.rglob("*.gz"), None) is not None:
        return CORPUS
    print(f"{CORPUS} has no manual pages here; using the sample pages shipped in {HERE / 'sample'}")
    return HERE / "sample"


def family(name: str) -> str:
    return re.split(r"[_\-.]", name, maxsplit=1)[0].lower()


def write_sample(root: Path, limit: int) -> str:
    """A manifest of a deterministic sample of the pages under ``root`` (keys as `--input DIR` gives them)."""
    pages: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        pages += [Path(folder, n).relative_to(root).as_posix() for n in sorted(files) if Path(folder, n).is_file()]
    english = [p for p in pages if p.split("/", 1)[0].startswith("man")] or pages
    seen: Counter[str] = Counter()
    varied = []
    for key in english:
        seen[family(Path(key).name)] += 1
        if seen[family(Path(key).name)] <= PER_FAMILY or key in SHOWN:
            varied.append(key)
    if limit <= 0 or limit >= len(pages):
        chosen, note = pages, f"all {len(pages):,} pages under {root}"
    else:
        step = max(1, len(varied) // limit)
        chosen = sorted({*varied[::step][:limit], *(k for k in SHOWN if k in varied)})
        note = (f"a sample of {len(chosen):,} of the {len(pages):,} pages under {root} (DEMO_LIMIT={limit}: "
                f"1 in {step} of the English pages, at most {PER_FAMILY} per name family; DEMO_LIMIT=0 runs "
                "them all, which takes hours here)")
    STATE.mkdir(exist_ok=True)
    with MANIFEST.open("w", encoding="utf-8") as out:
        for key in chosen:
            out.write(json.dumps({"key": key, "path": str(root / key)}) + "\n")
    return note


def simulated() -> bool:
    """The simulator serves chat unless OPENAI_BASE_URL or OPENAI_API_KEY names a real endpoint."""
    return not (os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"))


@contextlib.contextmanager
def endpoint(env: dict[str, str]) -> Iterator[str]:
    """The chat endpoint the workers use: the simulator in a thread of this process, or the one in the env."""
    if not simulated():
        env["MANPAGES_MODEL"] = os.environ.get("DEMO_MODEL", "gpt-4o-mini")
        env["MANPAGES_STRONG_MODEL"] = os.environ.get("DEMO_STRONG_MODEL", "gpt-4o")
        where = os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        yield (f"{where}, model {env['MANPAGES_MODEL']} escalating to {env['MANPAGES_STRONG_MODEL']} "
               "(real requests; this costs real tokens)")
        return
    try:
        from conveyor.providers.simulator import SimConfig, run_simulator
    except ImportError as exc:
        raise SystemExit(f"the provider simulator needs fastapi and uvicorn: make setup ({exc})") from None
    SIM_LOG.unlink(missing_ok=True)
    with run_simulator(SimConfig(**SIM, log_path=SIM_LOG)) as url:
        env.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="sim", MANPAGES_MODEL="sim-1", MANPAGES_STRONG_MODEL="sim-2")
        yield (f"the provider simulator at {url}, model sim-1 escalating to sim-2 (priced like gpt-4o-mini and "
               f"gpt-4o): {SIM['error_rate_5xx']:.0%} 5xx, {SIM['truncated_rate']:.0%} cut-off, "
               f"{SIM['malformed_rate']:.0%} chatty and {SIM['fenced_rate']:.0%} fenced JSON, {SIM['hang_rate']:.1%} "
               f"hangs, latency {SIM['latency_ms']:.0f} ms lognormal, {SIM['tpm']:,} tokens and {SIM['rpm']:,} "
               f"requests a minute; log {SIM_LOG}")


def sim_requests() -> list[dict[str, Any]]:
    if not SIM_LOG.exists():
        return []
    return [json.loads(line) for line in SIM_LOG.read_text(encoding="utf-8").splitlines() if line.strip()]


def show_run(label: str, run: dict[str, Any], seconds: float) -> None:
    outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(run["outcomes"].items(), key=lambda kv: -kv[1]))
    print(f"{label} {run['run_id']} ({seconds:.0f} s): {run['expected']:,} pages → {outcomes}; unaccounted "
          f"{run['unaccounted']}; stage calls {run['stage_calls']:,}, answered from the memo {run['cached']:,}")


def show_model_use(run: dict[str, Any], requests: list[dict[str, Any]]) -> None:
    """Tokens, cost and retries as conveyor recorded them, then the simulator's log."""
    usage = run.get("usage", {})
    errors = run.get("attempt_errors") or {}
    print(f"  model use: {usage.get('provider_calls', 0):,} provider calls (chat and local embeddings), "
          f"{usage.get('prompt_tokens', 0):,} + {usage.get('completion_tokens', 0):,} tokens, "
          f"${float(usage.get('cost') or 0.0):.4f}; refused or failed attempts by class: "
          + (", ".join(f"{k} {v}" for k, v in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"))
    chat = [r for r in requests if r.get("endpoint") == "chat"]
    if chat:
        models = Counter(r["model"] for r in chat)
        faults = Counter(r["fault"] for r in chat if r.get("fault"))
        statuses = Counter(r["status"] for r in chat)
        print(f"  the simulator's log: {len(chat):,} chat requests ("
              + ", ".join(f"{m} {n:,}" for m, n in sorted(models.items())) + "); faults: "
              + ", ".join(f"{k} {faults.get(k, 0)}" for k in ("fenced", "truncated", "malformed", "5xx", "hang"))
              + f"; 429s {statuses.get(429, 0)}")


def extract_attempts(run_id: str) -> list[sqlite3.Row]:
    """The extract stage's attempts of a run, in order (read-only: no command lists attempts by outcome yet)."""
    db = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return db.execute(
            "SELECT t.item_key, a.outcome, a.tier, a.repaired, a.error_class, a.message FROM attempts a "
            "JOIN tasks t ON t.id = a.task_id WHERE a.run_id = ? AND t.stage = 'extract' ORDER BY a.id",
            (run_id,)).fetchall()
    finally:
        db.close()


def show_acceptance(run_id: str) -> None:
    """What the acceptance boundary did with the first run's answers."""
    attempts = extract_attempts(run_id)
    by_item: dict[str, list[sqlite3.Row]] = defaultdict(list)
    for a in attempts:
        by_item[a["item_key"]].append(a)
    repaired = [k for k, rows in by_item.items() if any(a["outcome"] == "succeeded" and a["repaired"] for a in rows)]
    retried = Counter(a["error_class"] for a in attempts if a["outcome"] == "retry" and a["error_class"] in
                      ("invalid_format",))
    escalated = {k: rows for k, rows in by_item.items() if any(a["outcome"] == "escalated" for a in rows)}
    why = Counter(next(a["error_class"] for a in rows if a["outcome"] == "escalated") for rows in escalated.values())
    then = Counter("answered from the memo" if rows[-1]["outcome"] == "cached" else rows[-1]["outcome"]
                   for rows in escalated.values())
    print("\nthe acceptance boundary (extract's attempts in the store):")
    print(f"  repaired: {len(repaired)} answers were broken only in their format (a ```json fence, a trailing "
          f"comma); the fence and the comma were removed and they were accepted, marked repaired"
          + (f" (e.g. {repaired[0]})" if repaired else ""))
    print(f"  invalid_format: {retried.get('invalid_format', 0)} cut-off or chatty answers refused and asked again "
          "at the same tier")
    print(f"  escalated to the stronger model: {len(escalated)} ("
          + ", ".join(f"{k} {v}" for k, v in why.most_common()) + "); there: "
          + ", ".join(f"{k} {v}" for k, v in then.most_common()))
    wrong = next(((k, a["message"]) for k, rows in escalated.items() for a in rows
                  if a["outcome"] == "escalated" and a["error_class"] == "invalid_content"), None)
    if wrong:
        print(f"  e.g. {wrong[0]}: {wrong[1]} (the check: found_in the page's NAME line)")


def show_asked_again(first: str, again: str) -> None:
    """The pages the unchanged re-run did not answer from the memo, and how they ended the first time."""
    db = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT t.item_key, t.status, f.status FROM tasks t JOIN tasks f ON f.run_id = ? AND "
            "f.item_key = t.item_key AND f.stage = t.stage WHERE t.run_id = ? AND t.stage = 'extract' AND "
            "t.cached = 0", (first, again)).fetchall()
    finally:
        db.close()
    for item, now, before in rows:
        print(f"  asked again: {item} ({before} in the first run, which the memo does not answer), now {now}")


def review_queue(run_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    queue = conveyor_json("review", "list", "--run", run_id, env=env)["reviews"]
    if not queue:
        print("  nothing waits for review")
    for e in queue:
        print(f"  {e['id']:>3}  {e['item_key']:<28} {e['reason_class']} (confidence {e['confidence']}) at tier "
              f"{e['tier']}; deadline in 48 h, then {e['on_deadline']}")
    return list(queue)


def decide(queue: list[dict[str, Any]], env: dict[str, str]) -> None:
    """Approve most (one with an edit), reject one, leave the last to its deadline."""
    ids = [str(e["id"]) for e in queue]
    late = ids[-1:] if len(ids) >= 2 else []
    rejected = ids[-2:-1] if len(ids) >= 3 else []
    rest = [i for i in ids if i not in late + rejected]
    edited = rest[:1] if len(rest) >= 3 else []
    approved = [i for i in rest if i not in edited]
    if edited:
        conveyor("review", "edit", edited[0], "--fields", '{"confidence": 1.0}', "--why",
                 "checked against the page", "--by", "ann", env=env)
    if approved:
        conveyor("review", "approve", *approved, "--by", "ann", env=env)
    if rejected:
        conveyor("review", "reject", *rejected, "--why", "the summary does not describe the page", "--by", "bob",
                 env=env)
    if late:
        print(f"\nreview {late[0]} is left alone: its stage declares Review(deadline=\"48h\", on_deadline=\"reject\"), "
              f"and `conveyor review expire` applies deadlines; here it runs {DEADLINE_SKIP[1:]} later:")
        expire(env)


def expire(env: dict[str, str]) -> None:
    """`conveyor review expire` with the clock moved past the deadline: under faketime, else in this process."""
    if shutil.which("faketime"):
        conveyor("review", "expire", env=env, prefix=("faketime", "-f", DEADLINE_SKIP),
                 shown=f"faketime -f {DEADLINE_SKIP} ")
        return
    print("(faketime is not installed: the same service call with an injected clock, now + 49 h)")
    from conveyor.service.review import expire_deadlines
    from conveyor.store import open_store

    store = open_store(f"sqlite:///{DB}")
    try:
        print(f"  deadline outcomes applied: {expire_deadlines(store, now=time.time() + 49 * 3600)['decided']}")
    finally:
        store.close()


def versions_of(item: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """The item's publication versions, newest first (none when it was never published)."""
    done = subprocess.run([sys.executable, "-m", "conveyor", "publications", item, "--json"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False, env=env)
    return list(json.loads(done.stdout)["versions"]) if done.returncode == 0 else []


def show_versions(item: str, env: dict[str, str]) -> None:
    conveyor("publications", item, env=env)
    for v in versions_of(item, env):
        summary = (v["fields"] or {}).get("summary") or ""
        shown = summary if len(summary) <= 90 else summary[:89] + "…"
        print(f"  v{v['version']}{' (live)' if v['live'] else ''}: {shown!r}")


def show_stage_calls(run_id: str, requests: list[dict[str, Any]]) -> None:
    """The stage functions the run called, by stage (the rest answered from the memo), and its chat requests."""
    with sqlite3.connect(f"file:{DB}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT t.stage, COUNT(DISTINCT t.id) FROM attempts a JOIN tasks t ON t.id = a.task_id "
                          "WHERE a.run_id = ? AND a.invoked = 1 GROUP BY t.stage ORDER BY t.stage", (run_id,))
        called = ", ".join(f"{stage} {count}" for stage, count in rows) or "none"
    chats = sum(1 for r in requests if r.get("endpoint") == "chat")
    print(f"  stages called: {called}; chat requests to the simulator {chats}")


def edit_page(key: str) -> Path:
    """A copy of the sample manifest in which page ``key`` is an edited copy (its NAME line says more)."""
    source = json.loads(next(line for line in MANIFEST.read_text().splitlines() if json.loads(line)["key"] == key))
    original = gzip.decompress(Path(source["path"]).read_bytes()).decode("utf-8", "replace")
    copy = STATE / "edited" / key
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(gzip.compress(original.replace("list directory contents",
                                                    "list the files and folders in a directory").encode(),
                                   mtime=0))
    edited = STATE / "manpages-edited.jsonl"
    with edited.open("w", encoding="utf-8") as out:
        for line in MANIFEST.read_text().splitlines():
            entry = json.loads(line)
            path = str(copy.resolve()) if entry["key"] == key else entry["path"]
            out.write(json.dumps({"key": entry["key"], "path": path}) + "\n")
    print(f"  {key}: its NAME line now reads \"list the files and folders in a directory\" (a copy: {copy})")
    return edited


def show_diff(first: str, second: str, env: dict[str, str]) -> None:
    if conveyor("diff", first, second, "--limit", "2", env=env).returncode == 2:
        print("  (`conveyor diff` is not available in this build)")


def run(env: dict[str, str], label: str, *more: str, manifest: Path = MANIFEST) -> dict[str, Any]:
    started = time.monotonic()
    out = conveyor_json("run", TARGET, "--input", str(manifest), "--workers", "2", *more, env=env, ok=(0, 3, 4, 5))
    show_run(label, out, time.monotonic() - started)
    return out


def main() -> int:
    started = time.monotonic()
    note = write_sample(corpus(), LIMIT)
    shutil.rmtree(STORE, ignore_errors=True)  # the story starts from an empty store every time
    STORE.mkdir(parents=True)
    print(f"input: {note}\nstore: {STORE}/ (made afresh), blobs: {BLOBS}")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false",
               CONVEYOR_DB=f"sqlite:///{DB}", CONVEYOR_BLOBS=BLOBS)
    env.pop("MANPAGES_PROMPT_VERSION", None)  # the prompt is a run parameter: its default, unless --set
    with endpoint(env) as where:
        print(f"chat: {where}\nembeddings: all-MiniLM-L6-v2 on this machine's CPU (one thread per worker)")

        print(f"\n== 1. the first run (prompt {PROMPTS[0]})")
        run1 = run(env, "first run")
        if run1["cached"]:
            print("  (answered from the memo in a fresh store: pages whose bytes are identical are paid for once)")
        show_model_use(run1, sim_requests())
        show_acceptance(run1["run_id"])

        print("\n== 2. review, publication, search, reconciliation")
        queue = review_queue(run1["run_id"], env)
        decide(queue, env)
        resumed = conveyor_json("resume", run1["run_id"], "--workers", "2", env=env, ok=(0, 3, 4, 5))
        print(f"  the approved items went on to publication: {resumed['stage_calls'] - run1['stage_calls']} "
              f"stage calls; outcomes now {resumed['outcomes']}")
        conveyor("search", QUERY, "--limit", "5", env=env)
        conveyor("search", "--semantic", MEANING, "--collection", "manuals", "--limit", "5", env=env)
        conveyor("reconcile", run1["run_id"], env=env)

        print("\n== 3. the same run again, nothing changed")
        before = len(sim_requests())
        again = run(env, "second run")
        print(f"  model requests: {len(sim_requests()) - before} (simulator log), provider calls "
              f"{again['usage']['provider_calls']}")
        show_asked_again(run1["run_id"], again["run_id"])

        print(f"\n== 4. a bumped prompt (--set prompt_version={PROMPTS[1]}, recorded with the run)")
        before = len(sim_requests())
        bumped = run(env, "third run", "--set", f"prompt_version={PROMPTS[1]}")
        print(f"  model requests: {len(sim_requests()) - before}; parse and embed answered from the memo, extract "
              f"asked again")
        show_diff(run1["run_id"], bumped["run_id"], env)
    item = next((k for k in SHOWN if len(versions_of(k, env)) >= 2), None)
    if item is not None:
        show_versions(item, env)
        conveyor("rollback", item, "--reason", f"keep the {PROMPTS[0]} record for now", env=env)
        show_versions(item, env)
    with endpoint(env):
        print("\n== 5. a new embedding model (--set embed_model=sim-embed, the simulator's): the graph keeps the "
              "chat out of it")
        swapped = run(env, "fourth run", "--set", "embed_model=sim-embed")
        show_stage_calls(swapped["run_id"], sim_requests())
        print("\n== 6. one page edited: that page, its section's overview, and nothing else")
        edited = run(env, "fifth run", manifest=edit_page(EDITED))
        show_stage_calls(edited["run_id"], sim_requests())
    print(f"\ndemo took {time.monotonic() - started:.0f} s. The store: CONVEYOR_DB=sqlite:///{DB} "
          f"CONVEYOR_BLOBS={BLOBS} conveyor status | review list | search \"WORDS\"")
    ok = all(r["unaccounted"] == 0 for r in (run1, again, bumped, swapped, edited))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
