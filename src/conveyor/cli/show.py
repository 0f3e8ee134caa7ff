"""``conveyor show RUN ITEM``: one item's tasks, outputs, attempts, provenance and replay reasons (only reads)."""

import json
import time
from typing import Annotated, Any

import typer

from conveyor.cli.common import DEFAULT_BLOBS, Blobs, Db, Json, app, emit, store_for
from conveyor.errors import NotFound, StoreMissing
from conveyor.service.money import usd
from conveyor.store import DEFAULT_DB

OUTPUT_LINES = 6  # lines of an output a block shows (--json has it whole, up to its cut)
ERROR_WIDTH = 160  # characters of an error's first line
HASHES = ("config_hash", "code", "source")


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="the run id (`conveyor status` lists them)")],
    item_key: Annotated[str, typer.Argument(help="a root item's key (its fan-out children come with it) or a "
                                            "child's (doc.pdf¶3)")],
    stage: Annotated[str | None, typer.Option("--stage", help="only this stage's tasks")] = None,
    logs: Annotated[bool, typer.Option("--logs", help="under each attempt, the lines its stage logged through "
                                       "ctx.log (--json has them always)")] = False,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
) -> None:
    """One item of a run: its tasks per stage with status, output, provenance, replay reason and every attempt."""
    from conveyor.blobs import open_blobs
    from conveyor.service.show import show_item

    try:
        with store_for(db, create=False) as store:
            data = show_item(store, open_blobs(blobs), run_id, item_key, stage)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_id!r}: {exc}") from None
    emit(data, as_json, lambda shown: render_item(shown, logs))


def render_item(data: dict[str, Any], logs: bool = False) -> None:
    """A head line for the item, then one block per task (``logs``: each attempt's log lines under it)."""
    from conveyor.cli.render import out

    source = data["source"]
    read = (f"source {source['digest'][:12]}… ({source['size']:,} bytes)" if source["digest"]
            else "no readable source")
    out.print(f"run {data['run_id']} ({data['pipeline']}), item {data['item_key']}: {data['outcome'] or 'no task'}; "
              f"{read}", markup=False, highlight=False)
    if data["meta"]:
        _line(f"meta: {json.dumps(data['meta'], ensure_ascii=False)}")
    if data["trace_id"]:
        _line(f"trace: {data['trace_id']}")
    if not data["tasks"]:
        _line("no tasks")
    for task in data["tasks"]:
        out.print()
        for line in task_lines(task, logs):
            _line(line)


def task_lines(task: dict[str, Any], logs: bool = False) -> list[str]:
    """A task's block: head, error, provenance, replay reason, output, attempt history (with each attempt's
    log lines, when ``logs``)."""
    cached = ", cached" if task["cached"] else ""
    tier = f", tier {task['tier']}" if task["tier"] else ""
    edge = _edge(task)
    head = f"{task['stage']}{edge} {task['item_key']}: {task['status']}"
    lines = [f"{head} ({task['attempts']} attempt(s){cached}{tier})"]
    if task["error"]:
        lines.append(f"  error [{task['error_class']}]: {_cut(task['error'].splitlines()[0], ERROR_WIDTH)}")
    lines.append(f"  provenance: {provenance_line(task['provenance'])}")
    if task["replay"]:
        lines.append(replay_line(task["replay"]))
    lines += _output_lines(task)
    for a in task["history"]:
        lines.append(f"  {attempt_line(a)}")
        if logs:
            lines += log_lines(a)
    return lines


def log_lines(a: dict[str, Any]) -> list[str]:
    """An attempt's log lines, ``    +0.120s INFO page 3 has no text`` (a message's further lines indented under
    it), then how many lines were past its bound."""
    shown = []
    for line in a.get("logs") or []:
        first, *more = str(line["message"]).splitlines() or [""]
        shown.append(f"    +{line['t']:.3f}s {line['level']} {first}")
        shown += [f"      {m}" for m in more]
    if a.get("logs_dropped"):
        shown.append(f"    … {a['logs_dropped']:,} more line(s) dropped (an attempt keeps its first lines, up to "
                     "200 and 64 KiB)")
    return shown


def _edge(task: dict[str, Any]) -> str:
    """`` ← a, b`` (the stages it comes after) with its kind where it is not a plain map: the journey as a graph."""
    after = task.get("after") or []
    kind = task.get("kind")
    shown = f" ({kind})" if kind not in (None, "map") else ""
    return f"{shown} \u2190 {', '.join(after)}" if after else shown


def provenance_line(doc: dict[str, Any]) -> str:
    """``stage_version=2, parser=1.2, schema=3, config_hash=44136fa355b3, code=de12d1df06b0, source=8c5fb85562c1``:
    what a stage declared or set first, the hashes shortened."""
    hashes = [k for k in HASHES if doc.get(k)]
    named = [k for k in doc if k not in HASHES and doc[k] is not None]
    return ", ".join([*(f"{k}={_value(doc[k])}" for k in named), *(f"{k}={str(doc[k])[:12]}" for k in hashes)])


def replay_line(replay: dict[str, Any]) -> str:
    note = f" ({replay['note']})" if replay["note"] else ""
    by = f" by {replay['by']}" if replay["by"] else ""
    return f"  replayed {_when(replay['at'])}{by}: {replay['reason']}{note}"


def _output_lines(task: dict[str, Any]) -> list[str]:
    if task["output_error"]:
        return [] if task["status"] != "succeeded" else [f"  output: {task['output_error']}"]
    text = json.dumps(task["output"], ensure_ascii=False, indent=2).splitlines()
    shown = [f"    {line}" for line in text[:OUTPUT_LINES]]
    if len(text) > OUTPUT_LINES:
        shown.append(f"    … {len(text) - OUTPUT_LINES:,} more line(s) (--json shows them)")
    return ["  output:", *shown]


def attempt_line(a: dict[str, Any]) -> str:
    """``#2 retry [timeout] on w1 at 2026-12-01 09:30Z, 1.20 s; 2 call(s), 300/40 tokens, $0.0010 (gpt-4o): ...``,
    or for a replay's mark ``replayed by replay:ana at 2026-12-01 10:00Z: reprocess: new prompt``."""
    mark = not a["attempt"]  # a replay's (or requeue's) note in the history, not an execution
    line = a["outcome"] if mark else f"#{a['attempt']} {a['outcome']}"
    if a["error_class"]:
        line += f" [{a['error_class']}]"
    if a["worker"]:
        line += f" {'by' if mark else 'on'} {a['worker']}"
    line += f" at {_when(a['started_at'])}"
    if a["duration"] is not None:
        line += f", {a['duration']:.2f} s"
    if a["provider_calls"]:
        line += (f"; {a['provider_calls']} call(s), {a['prompt_tokens']:,}/{a['completion_tokens']:,} tokens, "
                 + usd(a["cost"]) + (f" ({a['model']})" if a["model"] else ""))
    if a["message"] and a["message"].strip() and a["outcome"] not in ("succeeded", "cached"):
        line += f": {_cut(a['message'].strip().splitlines()[0], ERROR_WIDTH)}"
    return line


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(at)) if at is not None else "?"


def _value(value: Any) -> str:
    return _cut(",".join(map(str, value)) if isinstance(value, list) else str(value), 40)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _line(text: str) -> None:
    from conveyor.cli.render import out

    out.print(text, markup=False, highlight=False, soft_wrap=True)
