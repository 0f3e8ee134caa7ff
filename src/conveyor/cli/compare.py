"""``conveyor compare RUN_A RUN_B``: two runs side by side, so a cheaper model is judged on what an accepted
item really costs and on whether its answers agree with the other run's (it only reads)."""

from collections.abc import Callable
from typing import Annotated, Any

import typer

from conveyor.cli.common import DEFAULT_BLOBS, Blobs, Db, Json, app, emit, store_for
from conveyor.errors import NotFound, StoreMissing
from conveyor.service.money import usd
from conveyor.store import DEFAULT_DB

LEAST_AGREEING = 5


@app.command()
def compare(
    run_a: Annotated[str, typer.Argument(help="a run")],
    run_b: Annotated[str, typer.Argument(help="the run to set beside it (any pipeline: items match by key)")],
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS, as_json: Json = False,
) -> None:
    """Two runs side by side: tokens, cost, time and attempts per accepted item, acceptance, review, rejection
    and failure rates, and how often the items both accepted agree, field by field."""
    from conveyor.blobs import open_blobs
    from conveyor.service.compare import compare_runs

    try:
        with store_for(db, create=False) as store:
            data = compare_runs(store, open_blobs(blobs), run_a, run_b)
    except StoreMissing as exc:
        raise NotFound(f"no run {run_a!r}: {exc}") from None
    emit(data, as_json, render_comparison)


# A row of the table: its label, and how a run's figure reads there.
ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("pipeline", lambda r: r["pipeline"]),
    ("status", lambda r: r["status"]),
    ("models", lambda r: ", ".join(r["models"]) or "-"),
    ("items", lambda r: f"{r['items']:,}"),
    ("accepted", lambda r: f"{r['accepted']:,}"),
    ("acceptance rate", lambda r: _percent(r["acceptance_rate"])),
    ("review rate", lambda r: _percent(r["review_rate"])),
    ("rejection rate", lambda r: _percent(r["rejection_rate"])),
    ("failure rate", lambda r: _percent(r["failure_rate"])),
    ("tokens / accepted item", lambda r: _number(r["per_accepted_item"]["tokens"], "{:,.0f}")),
    ("cost / accepted item", lambda r: _cost(r)),
    ("attempts / accepted item", lambda r: _number(r["per_accepted_item"]["attempts"], "{:.2f}")),
    ("attempt seconds / accepted item", lambda r: _number(r["per_accepted_item"]["seconds"], "{:.3f}")),
    ("wall time", lambda r: _wall(r["wall_seconds"])),
)


def render_comparison(data: dict[str, Any]) -> None:
    """A column per run, a row per figure; then the agreement and the fields that agree least."""
    from rich.table import Table

    from conveyor.cli.render import out

    table = Table(show_header=True)
    table.add_column("")
    for run in data["runs"]:
        table.add_column(run["run_id"], justify="right")
    for label, read in ROWS:
        table.add_row(label, *(read(run) for run in data["runs"]))
    out.print(table)
    agreement = data["agreement"]
    out.print(f"agreement on {agreement['items']:,} item(s) both accepted: {agreement['identical']:,} identical "
              f"({_percent(agreement['rate'])})", highlight=False)
    for name, counts in _least_agreeing(agreement["fields"]):
        out.print(f"  {name}: {counts['agree']:,}/{counts['compared']:,} agree ({_percent(counts['rate'])})",
                  markup=False, highlight=False)


def _least_agreeing(fields: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The fields that disagree at all, the lowest rate first (then the most compared, then by name)."""
    disagreeing = [(name, counts) for name, counts in fields.items() if counts["agree"] < counts["compared"]]
    disagreeing.sort(key=lambda entry: (entry[1]["rate"], -entry[1]["compared"], entry[0]))
    return disagreeing[:LEAST_AGREEING]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _wall(seconds: float | None) -> str:
    """Seconds while short, else hours, minutes and seconds (a run of a day reads as 24:00:00)."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{rest:02d}"


def _cost(run: dict[str, Any]) -> str:
    """Unpriced, never $0, when every call was to a model without a price (see Prices)."""
    per_item = run["per_accepted_item"]
    if per_item["cost"] is None:
        return "unpriced" if run["usage"].get("provider_calls") and per_item["tokens"] is not None else "-"
    return usd(per_item["cost"])
