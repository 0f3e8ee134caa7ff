"""A run's report as one self-contained HTML page (`conveyor report RUN --html FILE`): inline CSS and SVG
charts, no script, no external URL, so it reads the same mailed, archived or printed.

``render_html(report)`` takes ``conveyor.service.runreport.run_report``'s dict; the page is the Jinja2
template ``templates/report.html.j2`` shipped with this package. Each number shown from the reconciliation
carries ``data-field`` (its path in `conveyor reconcile RUN --json`), which tests compare against.
"""

from __future__ import annotations

import json
import time
from functools import cache
from itertools import accumulate
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from conveyor.service.money import usd
from conveyor.service.plots import bar_chart, line_chart

STATUS_ORDER = ("queued", "running", "succeeded", "awaiting_review", "failed", "dead_lettered", "rejected",
                "superseded")
THROUGHPUT_SERIES = ("attempts", "succeeded", "failed", "accepted", "published")
RECORD_CHARS = 1500
MAX_DENSE = 2000
MAX_SAMPLE_VALUES = 12  # slice values whose sampled records the page shows (the JSON has every one)


def render_html(report: dict[str, Any]) -> str:
    """The page for one run's report."""
    return _environment().get_template("report.html.j2").render(
        r=report, rec=report["reconcile"], charts=charts(report), statuses=_statuses(report["stages"]),
        max_values=MAX_SAMPLE_VALUES)


def charts(report: dict[str, Any]) -> dict[str, Markup]:
    """The page's SVG charts: throughput and cumulative cost over time, item ages, outcomes, errors by class."""
    rec, line = report["reconcile"], report["timeline"]
    buckets, per = dense(line["buckets"], line["bucket_s"]), _duration(line["bucket_s"])
    shown = [name for name in THROUGHPUT_SERIES if name == "attempts" or any(b[name] for b in buckets)]
    costs = list(accumulate(b["cost_usd"] for b in buckets))
    return {name: Markup(svg) for name, svg in {  # plots escapes every text it draws
        "throughput": line_chart({name: [(b["t"], b[name]) for b in buckets] for name in shown},
                                 title="Throughput over time", y_label=f"per {per}", empty=_no_attempts(rec)),
        "cost": line_chart({"cost (USD)": [(b["t"], c) for b, c in zip(buckets, costs, strict=True)]},
                           title="Cumulative cost", y_label="USD"),
        "ages": bar_chart([(b["label"], b["items"]) for b in report["ages"]["buckets"]],
                          title="Items by time from submission to outcome", y_label="items"),
        "outcomes": bar_chart(list(rec["outcomes"].items()), title="Items by outcome", y_label="items"),
        "errors": bar_chart(sorted(rec["attempt_errors"].items(), key=lambda kv: (-kv[1], kv[0])),
                            title="Failed attempts by error class", y_label="attempts"),
    }.items()}


def dense(buckets: list[dict[str, Any]], size: float) -> list[dict[str, Any]]:
    """The timeline with its quiet buckets as zeros, so a line does not slope across hours without work
    (at most MAX_DENSE buckets; a longer one is left as it is)."""
    if not buckets:
        return []
    first, steps = buckets[0]["t"], round((buckets[-1]["t"] - buckets[0]["t"]) / size)
    if steps >= MAX_DENSE:
        return buckets
    found = {round((b["t"] - first) / size): b for b in buckets}
    quiet = dict.fromkeys((*THROUGHPUT_SERIES, "tokens"), 0) | {"cost_usd": 0.0}
    return [found.get(step, quiet | {"t": first + step * size}) for step in range(steps + 1)]


def _no_attempts(rec: dict[str, Any]) -> str:
    """What an empty timeline means: no attempt ended yet, or none was needed (the memo answered)."""
    if rec["cached"]:
        return f"no attempt ran: {rec['cached']:,} tasks were answered from the memo"
    return "no attempt has ended yet"


@cache
def _environment() -> Environment:
    env = Environment(loader=PackageLoader("conveyor.cli", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(count=_count, usd=_usd, number=_number, utc=_utc, duration=_duration, record=_record)
    return env


def _statuses(stages: list[dict[str, Any]]) -> list[str]:
    """The task statuses some stage has, in lifecycle order (the stage table's columns)."""
    present = {status for stage in stages for status in stage["counts"]}
    return [s for s in STATUS_ORDER if s in present] + sorted(present - set(STATUS_ORDER))


def _count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _usd(value: float | None) -> str:
    """Dollars with enough digits for a fraction of a cent; None (every call unpriced) is unknown, not $0."""
    if value is None:
        return "unpriced"
    return usd(value)


def _number(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _utc(epoch: float | None) -> str:
    return "—" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _duration(seconds: float | None) -> str:
    """A bucket size or a wait, in the largest unit that keeps it whole-ish (``90`` → ``1.5 min``)."""
    if seconds is None:
        return "—"
    for unit, size in (("day", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            amount = seconds / size
            text = f"{amount:g}" if amount == int(amount) else f"{amount:.1f}"
            return f"{text} {unit}{'s' if unit == 'day' and amount != 1 else ''}"
    return f"{seconds:g} s" if seconds == int(seconds) else f"{seconds:.2f} s"


def _record(record: Any) -> str:
    """A sampled record as indented JSON, cut to RECORD_CHARS characters."""
    text = record if isinstance(record, str) else json.dumps(record, indent=2, ensure_ascii=False, default=str)
    return text if len(text) <= RECORD_CHARS else text[:RECORD_CHARS] + f"\n… ({len(text) - RECORD_CHARS:,} more)"
