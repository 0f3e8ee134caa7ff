"""Human output: Rich tables on stdout; progress on stderr (bars on a terminal, else a line every few seconds)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from conveyor.service.money import usd
from conveyor.service.report import all_unpriced

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class LazyConsole:
    """A Rich console made when first used: a command that prints JSON, or nothing, never loads Rich."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console(), name)


# Piped output gets room enough that ids and numbers are never cut. No emoji codes: an item key is printed as it is
# (a group item's `group:a:` in "item group:a: published" was a 🅰).
out = LazyConsole(width=None if sys.stdout.isatty() else 140, emoji=False)
err = LazyConsole(stderr=True, emoji=False)
DONE = ("succeeded", "failed", "dead_lettered")
# The task statuses `status RUN` always shows, so that a stage's row adds up to its tasks.
STAGE_COLUMNS = ("queued", "running", "awaiting_review", "succeeded", "failed", "rejected", "dead_lettered")


Status = Callable[[], dict[str, Any]]


def new_table(**options: Any) -> Table:
    from rich.table import Table

    return Table(**options)


def escape(markup: str) -> str:
    """Rich's escape of markup (``[`` in names and messages)."""
    from rich.markup import escape as rich_escape

    return rich_escape(markup)


@contextmanager
def progress(bars: bool = True, every: float | None = None) -> Iterator[Callable[[Status], None] | None]:
    """A callback that shows progress on stderr, given a function that reads the run's status: one bar
    per stage on a terminal or in a Jupyter notebook (unless ``bars`` is False), else a line every ``every``
    seconds (CONVEYOR_PROGRESS_S, default 5; 0 turns it off), so a run in CI, under nohup or in a pipe still
    says how far it got. Reading the status counts the run's tasks, so it is read at most as often as shown,
    and never so often that reading it takes more than a fiftieth of the time."""
    if not bars or not (sys.stderr.isatty() or in_notebook()):
        every = float(os.environ.get("CONVEYOR_PROGRESS_S", "5")) if every is None else every
        yield ProgressLines(every) if every > 0 else None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    board = Progress(TextColumn("{task.description:>16}"), BarColumn(), MofNCompleteColumn(),
                     TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=err.console(), transient=False)
    ids: dict[str, Any] = {}
    pace = _Pace(0.25)

    def update(read: Status) -> None:
        status = pace.read(read)
        if status is None:
            return
        for stage, counts in status["stages"].items():
            total, done = counts["total"], counts["done"]
            if stage not in ids:
                ids[stage] = board.add_task(stage, total=total or None, note="")
            board.update(ids[stage], total=total or None, completed=done)

    with board:
        yield update


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel, where Rich draws its bars as the cell's output (live with
    ipywidgets installed). Asked of Rich only in a process that loaded ipykernel."""
    return "ipykernel" in sys.modules and bool(err.console().is_jupyter)


class _Pace:
    """Reads a status when ``every`` seconds have passed, and at most a fiftieth of the time."""

    def __init__(self, every: float) -> None:
        self.every = self.gap = every
        self.last_at = time.monotonic()

    def read(self, status: Status) -> dict[str, Any] | None:
        now = time.monotonic()
        if now - self.last_at < self.gap:
            return None
        data = status()
        took = time.monotonic() - now
        self.last_at, self.gap = now, max(self.every, 50 * took)
        return data


class ProgressLines:
    """Plain progress lines: per stage done/total, the rate over the last interval, and an ETA."""

    def __init__(self, every: float) -> None:
        self.pace = _Pace(every)
        self.started = self.last_at = time.monotonic()
        self.last_done = 0

    def __call__(self, read: Status) -> None:
        status = self.pace.read(read)
        if status is None:
            return
        now = time.monotonic()
        line = progress_line(status, self.last_done, now - self.last_at, now - self.started)
        self.last_done, self.last_at = _tasks_done(status), now
        print(line, file=sys.stderr, flush=True)


def progress_line(status: dict[str, Any], done_before: int, interval: float, elapsed: float) -> str:
    """``progress r…: parse 1,200/5,000, embed 800/4,000; 850 tasks/s; ETA 0:00:07 (elapsed 0:01:02)``
    from a ``run_progress`` dict. The ETA counts the tasks still open and those each stage has not been
    given yet (one per expected item at least), at the rate of the last interval."""
    stages = [f"{stage} {c['done']:,}/{c['total']:,}" for stage, c in status["stages"].items()]
    done = _tasks_done(status)
    rate = max(0.0, done - done_before) / interval if interval > 0 else 0.0
    left = status.get("open_tasks", 0) + sum(max(0, status.get("expected", 0) - c["total"])
                                            for c in status["stages"].values())
    eta = _clock(left / rate) if rate > 0 and left else "-" if left else "0:00:00"
    return (f"progress {status['run_id']}: {', '.join(stages) or 'no tasks yet'}; {rate:,.0f} tasks/s; "
            f"ETA {eta} (elapsed {_clock(elapsed)})")


def _tasks_done(status: dict[str, Any]) -> int:
    return sum(c["done"] for c in status["stages"].values())


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def summary(data: dict[str, Any]) -> None:
    out.print(f"[bold]run {data['run_id']}[/] ({data['pipeline']})")
    table = new_table(show_header=True)
    table.add_column("outcome")
    table.add_column("items", justify="right")
    for outcome, count in data["outcomes"].items():
        table.add_row(outcome, str(count))
    out.print(table)
    out.print(f"expected {data['expected']}, unaccounted {data['unaccounted']}, "
              f"stage calls {data['stage_calls']}, cached {data['cached']}, retries {data['retries']}")
    _usage(data.get("usage"))
    _errors(data.get("attempt_errors"))
    for stage, group in (data.get("groups") or {}).items():
        if group.get("key_failed"):
            out.print(f"[yellow]group stage {escape(stage)}: {group['key_failed']:,} member(s) left out of every "
                      f"group, its by= raised on them[/] (first: {escape(_cut(group['key_error'], 120))})",
                      highlight=False)
    for entry in data["not_done"][:20]:
        classes = ", ".join(entry["error_classes"]) or ("no task yet" if entry.get("missing") else
                                                        ", ".join(sorted({t["status"] for t in entry["tasks"]})))
        error = next((t["error"] for t in entry["tasks"] if t.get("error")), None)
        why = f" — {error[:100]}" if error else ""
        out.print(f"  [yellow]{escape(entry['item_key'])}[/]: {classes}{escape(why)}", highlight=False)
    if len(data["not_done"]) > 20:
        out.print(f"  … and {len(data['not_done']) - 20} more (use --json for all)")


def reconciliation(data: dict[str, Any]) -> None:
    """``summary``, then what an accepted item cost and the quality sample, a line per item."""
    summary(data)
    per_item = data.get("per_accepted_item") or {}
    if per_item.get("items"):
        cost = "cost unpriced" if per_item["cost"] is None else usd(per_item["cost"])
        out.print(f"per accepted item ({per_item['items']:,}): {per_item['seconds']:.3f} s of attempts, "
                  f"{per_item['tokens']:,.0f} tokens, {cost}")
    for name, values in (data.get("sample") or {}).items():
        for value, entries in values.items():
            out.print(f"[bold]sample {escape(name)} = {escape(value)}[/]")
            for entry in entries:
                record = json.dumps(entry["record"], ensure_ascii=False, default=str)
                out.print(f"  {escape(entry['item_key'])} ({entry['outcome']}): {escape(_cut(record, 100))}",
                          highlight=False)


def diff(data: dict[str, Any]) -> None:
    """Counts by change, then the first changed items with their first changed fields."""
    counts = data["counts"]
    out.print(f"[bold]diff {data['run_a']} → {data['run_b']}[/] ({data['pipeline']}): "
              + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    shown = data["items"][:20]
    for entry in shown:
        outcomes = f"{entry['outcome_a'] or '-'} → {entry['outcome_b'] or '-'}"
        out.print(f"  {escape(entry['item_key'])}: {entry['change']} ({outcomes})", highlight=False)
        for field in entry["fields"][:5]:
            change = f"{_short(field['a'])} → {_short(field['b'])}"
            out.print(f"      {escape(field['field'])}: {escape(change)}", highlight=False)
        if len(entry["fields"]) > 5:
            out.print(f"      … and {len(entry['fields']) - 5} more field(s)")
        for stage, change in (entry.get("members") or {}).items():
            out.print(f"      members at {escape(stage)}: {escape(_members(change))}", highlight=False)
    more = sum(v for k, v in counts.items() if k != "unchanged") - len(shown)
    if more > 0:
        out.print(f"  … and {more:,} more changed item(s) (use --json, with a larger --limit)")


def _members(change: dict[str, Any]) -> str:
    """A group stage's member changes on one line: ``+2 (b2.txt, c1.txt), -1 (x.txt), ~1 (a1.txt)``."""
    if change.get("unknown"):
        return "not readable (a group made before its members were kept)"
    parts = []
    for sign, name in (("+", "added"), ("-", "removed"), ("~", "changed")):
        count, keys = change["counts"][name], change[name]
        if count:
            more = f", … {count - 3} more" if count > 3 else ""
            parts.append(f"{sign}{count} ({', '.join(keys[:3])}{more})")
    return ", ".join(parts)


def _short(value: Any) -> str:
    return _cut(json.dumps(value, ensure_ascii=False, default=str), 50)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _usage(usage: dict[str, Any] | None) -> None:
    if not usage or not usage.get("provider_calls"):
        return
    line = (f"model calls {usage['provider_calls']}, tokens {usage['prompt_tokens']:,} in / "
            f"{usage['completion_tokens']:,} out, {_cost(usage)}")
    if usage.get("tokens_per_accepted_item") is not None:
        per_item = usage.get("cost_per_accepted_item")
        line += (f" (per accepted item: {usage['tokens_per_accepted_item']:,.0f} tokens"
                 + (f", {usd(per_item)})" if per_item is not None else ")"))
    out.print(line)


def _cost(usage: dict[str, Any]) -> str:
    """A model without a price is "unpriced", never $0: its cost is unknown, not nothing."""
    if all_unpriced(usage):
        return "cost unpriced"
    unpriced = usage.get("unpriced_calls", 0)
    note = f" (+{unpriced} unpriced call{'s' if unpriced != 1 else ''})" if unpriced else ""
    return f"cost {usd(usage['cost'])}{note}"


def status(data: dict[str, Any]) -> None:
    if "runs" in data:
        _runs(data["runs"])
        return
    table = new_table(title=f"run {data['run_id']} ({data['pipeline']}): {data['status']}, {data['expected']} items, "
                            f"{data['stage_calls']} stage calls, {data['cached']} cached, {data['retries']} retries")
    activity = data.get("stage_activity") or {}
    # Every status a stage's tasks are in gets a column (superseded ones too, once a replay made some).
    columns = (*STAGE_COLUMNS, *sorted({k for c in data["stages"].values() for k in c} - set(STAGE_COLUMNS)))
    table.add_column("stage")
    for column in (*(c.replace("_", " ") for c in columns),
                   *(("calls", "cached", "oldest queued") if activity else ())):
        table.add_column(column, justify="right")
    for stage, counts in data["stages"].items():
        table.add_row(stage, *(str(counts.get(k, 0)) for k in columns), *_activity(activity.get(stage)))
    out.print(table)
    if data.get("outcomes"):
        out.print("items: " + ", ".join(f"{k} {v}" for k, v in data["outcomes"].items()))
    if data.get("note"):
        out.print(f"note: {escape(data['note'])}")
    for wait in data.get("waiting_for_workers") or []:
        out.print(f"[yellow]waiting:[/] {escape(wait['message'])}")
    for stage in data.get("groups_waiting") or []:
        out.print(f"groups of {escape(stage)}: made once every item of the run has settled before it "
                  "(items awaiting review or still running hold them back)")
    waiting = data.get("provider_batch_waiting")
    if waiting:
        out.print("waiting on provider batches: " + ", ".join(f"{stage} {n:,}" for stage, n in waiting.items())
                  + f" (conveyor provider-batches --run {data['run_id']})")
    budget = data.get("budget")
    if budget:
        out.print(f"budget {usd(budget['usd'])}: {usd(budget['spent'])} spent, {usd(budget['reserved'])} reserved")
    _usage(data.get("usage"))
    _errors(data.get("attempt_errors"))
    for r in data.get("replays") or []:
        note = f": {escape(r['note'])}" if r["note"] else ""
        out.print(f"replay {r['id']} by {escape(r['by'])} ({r['reason']}{note}): {r['reopened']} re-opened, "
                  f"{r['superseded']} superseded")


def _activity(stage: dict[str, Any] | None) -> tuple[str, ...]:
    """Stage calls, memo answers and the age of the oldest task waiting (status RUN)."""
    if stage is None:
        return ()
    age = stage["oldest_queued_age_s"]
    return str(stage["calls"]), str(stage["cached"]), "-" if age is None else _duration(age)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def utc(epoch: float) -> str:
    """A time as the commands print it: ``2026-12-04 23:41:07Z``."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))


def workers(data: dict[str, Any]) -> None:
    if not data["workers"]:
        out.print("no live workers (`--all` lists stopped ones too): `conveyor worker TARGET` or `conveyor run` "
                  "starts some")
        return
    table = new_table(title="workers")
    for column in ("worker", "state", "pipeline", "run", "started", "last beat", "held", "done", "serves"):
        table.add_column(column, justify="right" if column in ("last beat", "held", "done") else "left",
                         no_wrap=column == "worker")
    for w in data["workers"]:
        started = utc(w["started_at"])
        serves = ", ".join(f"{stage} v{version} {config[:8]}" for stage, (version, config) in
                           (w.get("serves") or {}).items())
        table.add_row(escape(w["worker"]), w["state"], escape(w["pipeline"]), escape(w["run"] or "any"), started,
                      f"{_duration(w['heartbeat_age_s'])} ago", str(w["tasks_held"]), str(w["tasks_done"]),
                      escape(serves or "-"))
    out.print(table)


def queue_depth(data: dict[str, Any]) -> None:
    if not data["stages"]:
        out.print("no task is ready to run or running")
        return
    table = new_table(title="queue depth")
    for column in ("pipeline", "stage", "runnable", "oldest waited", "running"):
        table.add_column(column, justify="left" if column in ("pipeline", "stage") else "right")
    for s in data["stages"]:
        table.add_row(escape(s["pipeline"]), escape(s["stage"]), str(s["runnable"]), _duration(s["oldest_age_s"]),
                      str(s["running"]))
    out.print(table)


def alerts(data: dict[str, Any]) -> None:
    if data.get("webhook_secret"):
        out.print(f"alert webhooks are signed with {data['webhook_secret']}")
    if not data["alerts"]:
        out.print("no alerts evaluated yet: declare them with Pipeline(..., alerts=Alerts(...)); workers evaluate "
                  "them every 30 s")
        return
    table = new_table(title="alerts")
    for column in ("pipeline", "alert", "state", "value", "threshold", "since", "fired"):
        table.add_column(column, justify="right" if column in ("value", "threshold", "fired") else "left")
    for a in data["alerts"]:
        since = utc(a["since"])
        state = "[bold red]firing[/]" if a["state"] == "firing" else "ok"
        table.add_row(escape(a["pipeline"]), a["alert"], state, f"{a['value']:g}", f"{a['threshold']:g}", since,
                      str(a["firings"]))
    out.print(table)


def _errors(errors: dict[str, int] | None) -> None:
    if errors:
        out.print("failed attempts by class: " + ", ".join(f"{k} {v}" for k, v in errors.items())
                  + (f" ({errors['rate_limited']} answered 429)" if "rate_limited" in errors else ""))


def _runs(runs: list[dict[str, Any]]) -> None:
    if not runs:
        out.print("no runs yet: start one with `conveyor run TARGET --input PATH`")
        return
    table = new_table(title="recent runs")
    table.add_column("run", no_wrap=True, min_width=24)
    for column in ("pipeline", "status", "items", "tasks done", "failed", "dead", "calls", "cached"):
        table.add_column(column, justify="left" if column in ("pipeline", "status") else "right")
    for run in runs:
        totals: dict[str, int] = {}
        for counts in run["stages"].values():
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
        done = sum(totals.get(k, 0) for k in DONE)
        table.add_row(run["run_id"], run["pipeline"], run["status"], str(run["expected"]),
                      f"{done}/{sum(totals.values())}", str(totals.get("failed", 0)),
                      str(totals.get("dead_lettered", 0)), str(run["stage_calls"]), str(run["cached"]))
    out.print(table)


def dlq(data: dict[str, Any]) -> None:
    """The dead letters; ``replayed`` says when (UTC) and why an entry was queued again (``--all`` lists those)."""
    table = new_table(title=f"{len(data['entries'])} dead letter(s)")
    for column in ("id", "run", "item", "stage", "error class", "attempts", "error", "replayed"):
        table.add_column(column)
    for e in data["entries"]:
        first = (e["error"] or "").splitlines()[0][:80] if e["error"] else ""
        replayed = "" if e["replayed_at"] is None else (
            f"{time.strftime('%Y-%m-%d %H:%MZ', time.gmtime(e['replayed_at']))}: {e['replay_reason'] or ''}".strip())
        table.add_row(str(e["id"]), e["run_id"], escape(e["item_key"]), e["stage"], e["error_class"] or "",
                      str(e["attempts"]), escape(first), escape(replayed))
    out.print(table)


def dlq_entry(data: dict[str, Any]) -> None:
    out.print(f"[bold]dead letter {data['id']}[/]: {data['item_key']} at stage {data['stage']} "
              f"({data['error_class']}, {data['attempts']} attempts)")
    if data["replayed_at"]:
        out.print(f"replayed: {data['replay_reason']}")
    out.print(data["error"] or "", markup=False, highlight=False)
    for a in data["attempt_history"]:
        out.print(f"  attempt {a['attempt']}: {a['outcome']} {a['error_class'] or ''} on {a['worker']}")


def provider_batches(data: dict[str, Any]) -> None:
    """The provider batch lane's batches, then its requests by state and the run's waiting tasks."""
    if not data["batches"]:
        out.print("no provider batch yet (stages declare batch=True, or run with --provider-batch)")
    else:
        table = new_table(title="provider batches, newest first")
        for column in ("id", "provider batch", "model", "state", "status", "requests", "answered", "failed",
                       "retried", "direct"):
            table.add_column(column, justify="right" if column in ("requests", "answered", "failed", "retried",
                                                                    "direct") else "left")
        for b in data["batches"]:
            table.add_row(str(b["id"]), b["provider_batch_id"] or "(creating)", b["model"], b["state"],
                          b["status"] or "", str(b["requests"]), str(b["answered"]), str(b["failed"]),
                          str(b["retried"]), str(b["direct"]))
        out.print(table)
    if data["requests"]:
        out.print("requests: " + ", ".join(f"{n:,} {state}" for state, n in sorted(data["requests"].items())))
    if data["run_id"]:
        waiting = data["waiting"]
        out.print(f"run {data['run_id']}: " + (", ".join(f"{n:,} tasks of {stage} waiting"
                                                        for stage, n in sorted(waiting.items()))
                                               or "no task waiting on a batch"))


def quota(data: dict[str, Any]) -> None:
    if not data["models"]:
        out.print("no provider model has been called under a declared limit yet")
        return
    table = new_table(title=f"the fleet's use of each limited model over the last {data['window_s']:g} s")
    for column in ("model", "tokens", "requests", "in flight", "interactive", "paused"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for m in data["models"]:
        paused = f"{m['paused_for_s']:.1f} s" if m.get("paused_for_s") else ""
        table.add_row(m["key"], f"{m['tokens']:,}", str(m["requests"]), str(m["in_flight"]),
                      "yes" if m.get("interactive_active") else "", paused)
    out.print(table)


def selection(data: dict[str, Any]) -> None:
    """The selected tasks as a table, then the counts."""
    if not data["count"]:
        out.print("no task matches these filters")
        return
    table = new_table(title=f"{data['count']:,} task(s)" + (f", the first {len(data['items']):,}" if data["truncated"]
                                                             else ""))
    for column in ("run", "item", "stage", "status", "error class", "provenance"):
        table.add_column(column)
    for t in data["items"]:
        shown = {k: v for k, v in t["provenance"].items() if k not in ("config_hash", "code", "source") and v}
        table.add_row(t["run_id"], escape(t["item_key"]), t["stage"], t["status"], t["error_class"] or "",
                      escape(", ".join(f"{k}={v}" for k, v in shown.items())))
    out.print(table)
    counts = data.get("counts")
    if counts:
        out.print("by stage: " + (", ".join(f"{k} {v:,}" for k, v in counts["stages"].items()) or "none"))
        out.print(f"items: {counts['items']:,}; by outcome: "
                  + (", ".join(f"{k} {v:,}" for k, v in counts["outcomes"].items()) or "none"))


def replay(data: dict[str, Any]) -> None:
    """What a replay re-opened (or would), per stage, and what processing it came to."""
    head = "dry run: would re-open" if data["dry_run"] else f"replay {data['replay_id']} re-opened"
    out.print(f"[bold]{head} {data['reopened']:,} task(s)[/] of {data['selected']:,} selected ({data['reason']}"
              + (f": {escape(data['note'])}" if data["note"] else "") + ")"
              + (f", superseding {data['superseded']:,} downstream" if data["superseded"] else ""))
    table = new_table()
    for column in ("stage", "re-open", "memo answers", "will run", "superseded"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage, c in data["stages"].items():
        table.add_row(stage, f"{c['reopen']:,}", f"{c['memo']:,}", f"{c['run']:,}", f"{c['superseded']:,}")
    if data["stages"]:
        out.print(table)
    if data["skipped"]:
        out.print("left as they are: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in data["skipped"].items()))
        if data["skipped"].get("source_changed"):
            out.print("  (their sources changed since the run read them: replay with --reason source-corrected)")
    if data.get("hint"):
        out.print(f"note: {data['hint']}")
    forecast = data.get("forecast")
    if forecast:
        _forecast(forecast)
    for summary_ in data.get("processed") or []:
        reconciliation(summary_)


def _forecast(forecast: dict[str, Any]) -> None:
    cost = forecast.get("cost")
    seconds = forecast.get("seconds")
    line = (f"forecast: {forecast['tokens']:,.0f} tokens" if forecast.get("tokens") is not None else "forecast:")
    if cost is not None:
        line += f", {usd(cost)}"
        if forecast.get("cost_margin") is not None:
            line += f" (± {usd(forecast['cost_margin'])})"
    if seconds is not None:
        line += f", about {_clock(seconds)}"
        low, high = forecast.get("seconds_range") or (seconds, seconds)
        if high > low:  # at a quota's minute: either side may happen
            line += f" ({_clock(low)} to {_clock(high)})"
    out.print(line + f" ({forecast['basis']})")


def dry_run(data: dict[str, Any]) -> None:
    """What a run would do: per stage, the tasks, what the memo answers and what would run; the forecast."""
    out.print(f"[bold]dry run[/]: {data['items']:,} item(s) of {escape(str(data['input']))}"
              + (f", {data['bad_input']:,} without a readable source" if data["bad_input"] else ""))
    table = new_table()
    for column in ("stage", "tasks", "memo answers", "would run"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage, c in data["stages"].items():
        estimated = " (estimated)" if c["estimated"] else ""
        table.add_row(stage, f"{c['tasks']:,}", f"{c['memo']:,}", f"{c['run']:,}{estimated}")
    out.print(table)
    if data.get("sampled"):
        s = data["sampled"]
        out.print(f"measured on a sample of {s['items']} item(s) run for real: {s['provider_calls']} model call(s), "
                  f"{s['tokens']:,} tokens, {usd(s['cost'])}")
    _forecast(data["forecast"])
