"""Small charts as inline SVG strings, shared by the mailed run report and the dashboard.

Pure functions, no dependencies, no I/O: ``line_chart`` (several named series over time or any number) and
``bar_chart`` (labelled values: errors by class, age buckets). The output is deterministic (same data, same
bytes), every text is escaped (labels are user data: stage names, error classes), the root carries
``role="img"``, an ``aria-label`` and a ``<title>``, and every element has a stable ``cv-*`` class so a page
can restyle it; colours are also set inline so a chart reads without any stylesheet (mail clients).

Example::

    svg = line_chart({"succeeded": [(1764650000, 3), (1764650060, 7)]}, title="Throughput", y_label="per min")
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")
# A series or bar named after what it counts has one colour wherever it is drawn (report and dashboard, whatever
# the order of the series): what succeeded is green, what failed red, as on the dashboard's status badges.
NAMED_COLORS = {"attempts": "#2563eb", "succeeded": "#16a34a", "failed": "#dc2626", "accepted": "#7c3aed",
                "published": "#0891b2", "completed": "#0891b2", "dead_lettered": "#dc2626", "rejected": "#dc2626",
                "awaiting_review": "#d97706", "cost": "#d97706", "tokens": "#4b5563"}
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"
CHAR_W = 6.4  # the rough width of one character at 11px, to lay out labels without measuring text
TITLE_H = 24
X_AXIS_H = 22
LEGEND_ROW_H = 16
LEFT = 56
RIGHT = 14
EMPTY_TEXT = "no data yet"

Point = tuple[float, float]


def line_chart(series: Mapping[str, Sequence[Point]], *, title: str, y_label: str, x_is_time: bool = True,
               width: int = 640, height: int = 220, empty: str = EMPTY_TEXT) -> str:
    """Lines for named series of (x, y) points; x is epoch seconds (shown in UTC) when ``x_is_time``.

    Points that are not finite numbers are dropped; a series of one point is drawn as a dot; when no series
    has a point the chart says ``empty`` ("no data yet")."""
    clean = {name: _finite_sorted(points) for name, points in series.items()}
    drawn = {name: points for name, points in clean.items() if points}
    if not drawn:
        return _empty(title, y_label, width, height, empty)
    legend_rows = _legend_rows(list(clean), width)
    top, bottom = TITLE_H + 6, height - X_AXIS_H - LEGEND_ROW_H * len(legend_rows)
    xs = [x for points in drawn.values() for x, _ in points]
    ys = [y for points in drawn.values() for _, y in points]
    x_lo, x_hi = (min(xs), max(xs)) if min(xs) < max(xs) else (min(xs) - 1.0, max(xs) + 1.0)
    y_ticks = nice_ticks(min(0.0, min(ys)), max(0.0, max(ys)))
    frame = _Frame(LEFT, width - RIGHT, top, bottom, x_lo, x_hi, y_ticks[0], y_ticks[-1])
    parts = [_open(title, _line_summary(drawn), width, height), _title(title, width)]
    parts += _y_axis(frame, y_ticks, y_label)
    parts += _time_axis(frame) if x_is_time else _number_axis(frame)
    for index, name in enumerate(clean):
        parts += _series(frame, index, name, clean[name])
    parts += _legend(list(clean), legend_rows, height)
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(bars: Sequence[tuple[str, float]], *, title: str, y_label: str, width: int = 640,
              height: int = 220, empty: str = EMPTY_TEXT) -> str:
    """One vertical bar per (label, value), in the order given, with the value above each bar; a label too
    long for its slot is shortened with an ellipsis (the full text stays in the bar's tooltip); no bar: the
    chart says ``empty``."""
    clean = [(label, value) for label, value in bars if math.isfinite(value)]
    if not clean:
        return _empty(title, y_label, width, height, empty)
    top, bottom = TITLE_H + 14, height - X_AXIS_H
    values = [value for _, value in clean]
    y_ticks = nice_ticks(min(0.0, min(values)), max(0.0, max(values)))
    frame = _Frame(LEFT, width - RIGHT, top, bottom, 0.0, float(len(clean)), y_ticks[0], y_ticks[-1])
    summary = "; ".join(f"{label}: {_number(value)}" for label, value in clean)
    parts = [_open(title, summary, width, height), _title(title, width)]
    parts += _y_axis(frame, y_ticks, y_label)
    slot = (frame.right - frame.left) / len(clean)
    for index, (label, value) in enumerate(clean):
        parts += _bar(frame, index, slot, label, value)
    parts.append("</svg>")
    return "\n".join(parts)


def graph_chart(stages: Sequence[Mapping[str, Any]], counts: Mapping[str, Mapping[str, float]], *,
                title: str = "Pipeline", unreached: str | None = None) -> str:
    """The pipeline's graph as boxes and arrows, a column per depth (a stage one column right of its deepest
    parent), each box its stage's name, kind (when not a map) and tasks done of all, its border coloured by
    state (also its ``data-state``): red when some failed (``failed``), amber when some wait for review
    (``review``), blue while some are open (``open``), green when the rest succeeded (``done``), grey with none
    (``none``). ``stages`` as a run records its graph (``name``, ``kind``, ``after``, ``parents``); ``counts``
    by stage and status (queued, running, succeeded, failed, ...); ``unreached``: a box's text where a stage
    has no task (one item's journey: "not reached")."""
    names = [str(s["name"]) for s in stages]
    parents = {str(s["name"]): [str(p) for p in (s.get("parents") or ([s["after"]] if s.get("after") else []))]
               for s in stages}
    kinds = {str(s["name"]): str(s.get("kind") or "map") for s in stages}
    depth: dict[str, int] = {}
    for name in names:  # a run's graph lists parents first; a parent named later is placed on its own first
        depth[name] = _depth(name, parents, depth, set())
    columns: dict[int, list[str]] = {}
    for name in names:
        columns.setdefault(depth[name], []).append(name)
    box_w, box_h, gap_x, gap_y, pad = 150, 40, 46, 14, 12
    width = pad * 2 + len(columns) * box_w + (len(columns) - 1) * gap_x
    rows = max((len(c) for c in columns.values()), default=1)
    height = TITLE_H + pad * 2 + rows * box_h + (rows - 1) * gap_y
    where = {name: (pad + d * (box_w + gap_x), TITLE_H + pad + i * (box_h + gap_y))
             for d, column in columns.items() for i, name in enumerate(column)}
    summary = f"{len(names)} stages; " + ", ".join(f"{n} after {' and '.join(parents[n])}" for n in names
                                                    if parents[n])
    parts = [_open(title, summary, width, height), _title(title, width)]
    for name in names:
        x, y = where[name]
        for parent in parents[name]:
            if parent in where:
                px, py = where[parent]
                x1, y1, x2, y2 = px + box_w, py + box_h / 2, x - 4, y + box_h / 2
                bend = gap_x / 2
                parts.append(f'<path class="cv-edge" d="M{_px(x1)},{_px(y1)} C{_px(x1 + bend)},{_px(y1)} '
                             f'{_px(x2 - bend)},{_px(y2)} {_px(x2)},{_px(y2)}" fill="none" stroke="#9ca3af" '
                             'stroke-width="1.5" marker-end="url(#cv-arrow)"/>')
    for name in names:
        x, y = where[name]
        c = counts.get(name, {})
        total = sum(float(v) for v in c.values())
        done = float(c.get("succeeded", 0))
        state = _state(c)
        color = STATE_COLOURS[state]
        kind = "" if kinds[name] == "map" else f" ({kinds[name]})"
        shown = unreached if unreached is not None and not total else f"{_number(done)} / {_number(total)} done"
        parts += [f'<g class="cv-stage" data-stage="{escape(name, quote=True)}" data-state="{state}">',
                  f'<rect x="{_px(x)}" y="{_px(y)}" width="{box_w}" height="{box_h}" rx="6" fill="#fff" '
                  f'stroke="{color}" stroke-width="2"/>',
                  f'<text x="{_px(x + 8)}" y="{_px(y + 16)}" font-size="12" style="{FONT}" fill="#111827">'
                  f'{escape(_fit(name + kind, (box_w - 16) / CHAR_W))}</text>',
                  f'<text x="{_px(x + 8)}" y="{_px(y + 32)}" font-size="11" style="{FONT}" fill="#4b5563">'
                  f'{escape(shown)}</text></g>']
    marker = ('<defs><marker id="cv-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
              'orient="auto"><path d="M0,0L10,5L0,10z" fill="#9ca3af"/></marker></defs>')
    parts.insert(1, marker)
    parts.append("</svg>")
    return "".join(parts)


STATE_COLOURS = {"failed": "#dc2626", "review": "#d97706", "open": "#2563eb", "done": "#16a34a", "none": "#9ca3af"}


def _state(counts: Mapping[str, float]) -> str:
    """A stage's state in the graph from its tasks by status (see ``graph_chart``)."""
    if any(counts.get(k) for k in ("failed", "dead_lettered", "rejected")):
        return "failed"
    if counts.get("awaiting_review"):
        return "review"
    if any(counts.get(k) for k in ("queued", "running", "open")):
        return "open"
    return "done" if counts.get("succeeded") else "none"


def _depth(name: str, parents: Mapping[str, list[str]], depth: dict[str, int], seen: set[str]) -> int:
    if name in depth:
        return depth[name]
    if name in seen:  # a cycle cannot be declared; a damaged record is drawn flat rather than looping
        return 0
    seen.add(name)
    found = [_depth(p, parents, depth, seen) for p in parents.get(name, []) if p in parents]
    return 1 + max(found) if found else 0


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"ticks need finite bounds, got {lo!r} and {hi!r}")
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        hi = lo + 1.0 if lo == 0 else lo + abs(lo)
    raw = (hi - lo) / max(1, count - 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * magnitude >= raw * (1 - 1e-9))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [_tidy(i * step) for i in range(first, last + 1)]


class _Frame:
    """The plot area in pixels and the data range it shows."""

    def __init__(self, left: float, right: float, top: float, bottom: float, x_lo: float, x_hi: float,
                 y_lo: float, y_hi: float) -> None:
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.x_lo, self.x_hi, self.y_lo, self.y_hi = x_lo, x_hi, y_lo, y_hi

    def x(self, value: float) -> float:
        return self.left + (value - self.x_lo) / (self.x_hi - self.x_lo) * (self.right - self.left)

    def y(self, value: float) -> float:
        return self.bottom - (value - self.y_lo) / (self.y_hi - self.y_lo) * (self.bottom - self.top)


def _open(title: str, summary: str, width: int, height: int) -> str:
    label = escape(title)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="cv-chart" role="img" aria-label="{label}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" style="{FONT}">\n'
            f'<title>{label}</title>\n<desc>{escape(summary)}</desc>\n'
            f'<rect class="cv-background" x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>')


def _title(title: str, width: int) -> str:
    return (f'<text class="cv-title" x="{LEFT}" y="17" font-size="13" font-weight="600" fill="#111827">'
            f'{escape(_fit(title, (width - LEFT) / 7.2))}</text>')


def _empty(title: str, y_label: str, width: int, height: int, text: str) -> str:
    return "\n".join([
        _open(title, f"{y_label}: {text}", width, height), _title(title, width),
        f'<rect class="cv-frame" x="{LEFT}" y="{TITLE_H + 6}" width="{width - LEFT - RIGHT}" '
        f'height="{max(1, height - TITLE_H - 6 - X_AXIS_H)}" fill="none" stroke="#e5e7eb"/>',
        f'<text class="cv-empty" x="{_px((LEFT + width - RIGHT) / 2)}" y="{_px((TITLE_H + height - X_AXIS_H) / 2)}" '
        f'text-anchor="middle" font-size="12" fill="#6b7280">{escape(_fit(text, (width - LEFT) / 6.8))}</text>',
        "</svg>"])


def _y_axis(frame: _Frame, ticks: list[float], y_label: str) -> list[str]:
    parts = []
    for tick in ticks:
        y = _px(frame.y(tick))
        parts.append(f'<line class="cv-grid" x1="{_px(frame.left)}" y1="{y}" x2="{_px(frame.right)}" y2="{y}" '
                     f'stroke="#e5e7eb" stroke-width="1"/>')
        parts.append(f'<text class="cv-tick-label cv-y-tick" x="{_px(frame.left - 6)}" y="{_px(frame.y(tick) + 4)}" '
                     f'text-anchor="end" font-size="11" fill="#4b5563">{escape(_number(tick))}</text>')
    middle = _px((frame.top + frame.bottom) / 2)
    parts.append(f'<text class="cv-axis-label cv-y-label" x="12" y="{middle}" text-anchor="middle" font-size="11" '
                 f'fill="#4b5563" transform="rotate(-90 12 {middle})">'
                 f'{escape(_fit(y_label, (frame.bottom - frame.top) / CHAR_W))}</text>')
    parts.append(f'<line class="cv-axis cv-x-axis" x1="{_px(frame.left)}" y1="{_px(frame.y(max(frame.y_lo, 0.0)))}" '
                 f'x2="{_px(frame.right)}" y2="{_px(frame.y(max(frame.y_lo, 0.0)))}" stroke="#9ca3af"/>')
    return parts


def _time_axis(frame: _Frame) -> list[str]:
    span = frame.x_hi - frame.x_lo
    step = next((s for s in TIME_STEPS if span / s <= 6), _day_multiple(span))
    pattern = _time_pattern(step, span)
    first = math.ceil(frame.x_lo / step) * step
    ticks = [first + i * step for i in range(int((frame.x_hi - first) // step) + 1)]
    return [_x_tick(frame, tick, time.strftime(pattern, time.gmtime(tick))) for tick in ticks] + [
        _x_caption(frame, "UTC")]


TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _day_multiple(span: float) -> int:
    days = span / 86400 / 6
    return 86400 * math.ceil(nice_ticks(0.0, max(1.0, days), 2)[1])


def _time_pattern(step: float, span: float) -> str:
    """HH:MM:SS for seconds, HH:MM within a day, the date as well past a day, the date alone in days."""
    if step < 60:
        return "%H:%M:%S"
    if step < 86400:
        return "%H:%M" if span <= 86400 else "%m-%d %H:%M"
    return "%Y-%m-%d"


def _number_axis(frame: _Frame) -> list[str]:
    ticks = [t for t in nice_ticks(frame.x_lo, frame.x_hi, 6) if frame.x_lo - 1e-9 <= t <= frame.x_hi + 1e-9]
    return [_x_tick(frame, tick, _number(tick)) for tick in ticks]


def _x_tick(frame: _Frame, value: float, label: str) -> str:
    """A tick and its label; a label that would run past the right edge ends at its tick instead."""
    x = _px(frame.x(value))
    anchor = "end" if frame.x(value) + len(label) * CHAR_W / 2 > frame.right + RIGHT else "middle"
    return (f'<line class="cv-tick cv-x-tick" x1="{x}" y1="{_px(frame.bottom)}" x2="{x}" y2="{_px(frame.bottom + 4)}" '
            f'stroke="#9ca3af"/>\n<text class="cv-tick-label cv-x-tick-label" x="{x}" y="{_px(frame.bottom + 16)}" '
            f'text-anchor="{anchor}" font-size="11" fill="#4b5563">{escape(label)}</text>')


def _x_caption(frame: _Frame, text: str) -> str:
    return (f'<text class="cv-axis-label cv-x-label" x="{_px(frame.right)}" y="{_px(frame.top - 4)}" '
            f'text-anchor="end" font-size="10" fill="#9ca3af">{escape(text)}</text>')


def color_of(name: str, index: int) -> str:
    """A series' colour: NAMED_COLORS by its first word (``cost (USD)`` is a cost), else the palette's."""
    return NAMED_COLORS.get(name.split(" ")[0]) or PALETTE[index % len(PALETTE)]


def _series(frame: _Frame, index: int, name: str, points: list[Point]) -> list[str]:
    color = color_of(name, index)
    cls = f"cv-series cv-series-{index}"
    if not points:
        return []
    parts = [f'<g class="{cls}" data-series="{escape(name)}">']
    if len(points) > 1:
        path = " ".join(f"{_px(frame.x(x))},{_px(frame.y(y))}" for x, y in points)
        parts.append(f'<polyline class="cv-line" points="{path}" fill="none" stroke="{color}" stroke-width="2" '
                     f'stroke-linejoin="round"/>')
    if len(points) <= 40:
        parts += [f'<circle class="cv-point" cx="{_px(frame.x(x))}" cy="{_px(frame.y(y))}" r="2.5" fill="{color}">'
                  f'<title>{escape(name)}: {escape(_number(y))}</title></circle>' for x, y in points]
    parts.append("</g>")
    return parts


def _legend_rows(names: list[str], width: int) -> list[list[tuple[int, str, float]]]:
    """The legend's entries (series index, name, x offset) in rows that fit the width."""
    rows: list[list[tuple[int, str, float]]] = [[]]
    x = float(LEFT)
    for index, name in enumerate(names):
        shown = _fit(name, 40)
        entry_w = 18 + len(shown) * CHAR_W + 14
        if rows[-1] and x + entry_w > width - RIGHT:
            rows.append([])
            x = float(LEFT)
        rows[-1].append((index, shown, x))
        x += entry_w
    return rows


def _legend(names: list[str], rows: list[list[tuple[int, str, float]]], height: int) -> list[str]:
    parts = ['<g class="cv-legend">']
    for row_no, row in enumerate(rows):
        y = height - LEGEND_ROW_H * (len(rows) - row_no) + 4
        for index, shown, x in row:
            color = color_of(names[index], index)
            parts.append(f'<rect class="cv-legend-swatch cv-series-{index}" x="{_px(x)}" y="{_px(y)}" width="12" '
                         f'height="4" fill="{color}"/>')
            parts.append(f'<text class="cv-legend-label" x="{_px(x + 16)}" y="{_px(y + 5)}" font-size="11" '
                         f'fill="#374151">{escape(shown)}</text>')
    parts.append("</g>")
    return parts


def _bar(frame: _Frame, index: int, slot: float, label: str, value: float) -> list[str]:
    bar_w = max(1.0, min(slot * 0.7, 80.0))
    x = frame.left + index * slot + (slot - bar_w) / 2
    base, tip = frame.y(max(frame.y_lo, 0.0)), frame.y(value)
    y, h = min(base, tip), abs(base - tip)
    color = NAMED_COLORS.get(label, PALETTE[0])
    shown = _fit(label, slot / CHAR_W)
    center = _px(x + bar_w / 2)
    return [
        f'<g class="cv-bar-group" data-label="{escape(label)}">',
        f'<rect class="cv-bar" x="{_px(x)}" y="{_px(y)}" width="{_px(bar_w)}" height="{_px(h)}" fill="{color}">'
        f'<title>{escape(label)}: {escape(_number(value))}</title></rect>',
        f'<text class="cv-bar-value" x="{center}" y="{_px(y - 4)}" text-anchor="middle" font-size="11" '
        f'fill="#111827">{escape(_number(value))}</text>',
        f'<text class="cv-bar-label" x="{center}" y="{_px(frame.bottom + 16)}" text-anchor="middle" font-size="11" '
        f'fill="#4b5563">{escape(shown)}</text>',
        "</g>"]


def _line_summary(series: Mapping[str, list[Point]]) -> str:
    return "; ".join(f"{name}: {len(points)} points, last {_number(points[-1][1])}" for name, points in series.items())


def _finite_sorted(points: Sequence[Point]) -> list[Point]:
    return sorted((float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y))


def _fit(text: str, max_chars: float) -> str:
    limit = max(2, int(max_chars))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tidy(value: float) -> float:
    """Round away float noise (0.30000000000000004 -> 0.3) so tick labels and output stay stable."""
    return 0.0 if value == 0 else float(f"{value:.12g}")


def _number(value: float) -> str:
    """A short label: integers plainly, thousands as k/M, small values with a few significant digits."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    if value == int(value):
        return str(int(value))
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if magnitude >= 0.001 else f"{value:.2e}"


def _px(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")
