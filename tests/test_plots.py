"""The inline SVG charts: well-formed, escaped, accessible, deterministic, and sensible at the edges."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from conveyor.service.plots import bar_chart, line_chart, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_764_650_000.0  # 2025-12-02 04:33:20 UTC


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [el for el in root.iter() if cls in (el.get("class") or "").split()]


def texts(root: ET.Element, cls: str) -> list[str]:
    return [el.text or "" for el in by_class(root, cls)]


def test_a_line_chart_is_accessible_svg_with_a_line_and_a_legend_entry_per_series() -> None:
    root = parse(line_chart({"succeeded": [(T0, 3), (T0 + 60, 7), (T0 + 120, 5)], "failed": [(T0, 1), (T0 + 60, 0)]},
                            title="Throughput", y_label="attempts per minute"))
    assert root.get("role") == "img" and root.get("aria-label") == "Throughput"
    assert root.find(f"{SVG}title").text == "Throughput"  # type: ignore[union-attr]
    assert len(by_class(root, "cv-line")) == 2
    assert texts(root, "cv-legend-label") == ["succeeded", "failed"]
    assert texts(root, "cv-y-label") == ["attempts per minute"]
    assert len(by_class(root, "cv-point")) == 5


def test_user_text_is_escaped_everywhere() -> None:
    nasty = '<script>alert("x")</script> & co'
    line = line_chart({nasty: [(T0, 1), (T0 + 60, 2)]}, title=nasty, y_label=nasty)
    bars = bar_chart([(nasty, 3.0)], title=nasty, y_label=nasty)
    for svg in (line, bars):
        assert "<script>" not in svg
        root = parse(svg)
        assert root.get("aria-label") == nasty
        assert not [el for el in root.iter() if el.tag.endswith("script")]
    assert texts(parse(line), "cv-legend-label") == [nasty]
    assert [g.get("data-label") for g in by_class(parse(bars), "cv-bar-group")] == [nasty]


def test_no_points_make_a_readable_empty_chart() -> None:
    for svg in (line_chart({}, title="Cost", y_label="USD"),
                line_chart({"a": [], "b": []}, title="Cost", y_label="USD"),
                line_chart({"a": [(math.nan, 1.0), (T0, math.inf)]}, title="Cost", y_label="USD"),
                bar_chart([], title="Cost", y_label="USD")):
        root = parse(svg)
        assert texts(root, "cv-empty") == ["no data yet"]
        assert root.get("aria-label") == "Cost"


def test_the_empty_text_can_say_why() -> None:
    for svg in (line_chart({}, title="t", y_label="y", empty="no attempt: 3 answers from the <memo>"),
                bar_chart([], title="t", y_label="y", empty="no attempt: 3 answers from the <memo>")):
        assert texts(parse(svg), "cv-empty") == ["no attempt: 3 answers from the <memo>"]


def test_one_point_is_drawn_as_a_dot_with_its_time() -> None:
    root = parse(line_chart({"accepted": [(T0, 4.0)]}, title="Accepted", y_label="items"))
    assert not by_class(root, "cv-line")
    [dot] = by_class(root, "cv-point")
    assert dot.find(f"{SVG}title").text == "accepted: 4"  # type: ignore[union-attr]
    assert "04:33:20" in texts(root, "cv-x-tick-label")
    assert "4" in texts(root, "cv-y-tick")


def test_points_stay_inside_the_plot_area() -> None:
    width, height = 500, 200
    root = parse(line_chart({"a": [(T0 + i * 60, (i * 37) % 11) for i in range(30)]}, title="t", y_label="y",
                            width=width, height=height))
    for dot in by_class(root, "cv-point"):
        assert 0 < float(dot.get("cx", "-1")) <= width and 0 < float(dot.get("cy", "-1")) < height


@pytest.mark.parametrize(("span", "expected"), [
    (120, "04:34:00"),  # seconds: HH:MM:SS
    (3 * 3600, "06:00"),  # hours: HH:MM
    (36 * 3600, "12-02 12:00"),  # more than a day: with the date
    (20 * 86400, "2025-12-08"),  # weeks: dates
])
def test_time_axis_labels_fit_the_span(span: float, expected: str) -> None:
    root = parse(line_chart({"a": [(T0, 1), (T0 + span, 2)]}, title="t", y_label="y"))
    labels = texts(root, "cv-x-tick-label")
    assert expected in labels
    assert 2 <= len(labels) <= 7
    assert texts(root, "cv-x-label") == ["UTC"]


def test_numeric_x_axis() -> None:
    root = parse(line_chart({"a": [(0, 1), (10, 2)]}, title="t", y_label="y", x_is_time=False))
    assert texts(root, "cv-x-tick-label") == ["0", "2", "4", "6", "8", "10"]
    assert not by_class(root, "cv-x-label")


def test_bars_keep_their_order_values_and_shorten_long_labels() -> None:
    long = "a_very_long_error_class_name_that_cannot_fit_under_its_bar"
    bars = [(f"{long}{i}", float(i)) for i in range(12)] + [("dns", 2500.0)]
    root = parse(bar_chart(bars, title="Errors", y_label="attempts"))
    assert texts(root, "cv-bar-value")[-2:] == ["11", "2500"]
    labels = texts(root, "cv-bar-label")
    assert labels[-1] == "dns" and labels[0].endswith("…") and len(labels[0]) < len(long)
    # the full label stays in the tooltip
    assert by_class(root, "cv-bar")[0].find(f"{SVG}title").text == f"{long}0: 0"  # type: ignore[union-attr]
    heights = [float(rect.get("height", "0")) for rect in by_class(root, "cv-bar")]
    assert heights[0] == 0 and heights[-1] == max(heights)


def test_output_is_deterministic() -> None:
    series = {"b": [(T0 + 60, 2.0), (T0, 1.0)], "a": [(T0, 0.5)]}
    assert line_chart(series, title="t", y_label="y") == line_chart(dict(series), title="t", y_label="y")
    assert bar_chart([("x", 1.0)], title="t", y_label="y") == bar_chart([("x", 1.0)], title="t", y_label="y")


def test_many_series_wrap_the_legend() -> None:
    root = parse(line_chart({f"stage_number_{i}": [(T0, i), (T0 + 60, i + 1)] for i in range(12)}, title="t",
                            y_label="y", width=400))
    ys = {float(el.get("y", "0")) for el in by_class(root, "cv-legend-label")}
    assert len(ys) > 1
    assert len(by_class(root, "cv-line")) == 12


@pytest.mark.parametrize(("lo", "hi", "ticks"), [
    (0, 7, [0, 2, 4, 6, 8]),
    (0, 0.3, [0, 0.1, 0.2, 0.3]),
    (-3, 17, [-5, 0, 5, 10, 15, 20]),
    (0, 0, [0, 0.25, 0.5, 0.75, 1]),
    (0, 1_234_567, [0, 500_000, 1_000_000, 1_500_000]),
    (0, 0.00042, [0, 0.0002, 0.0004, 0.0006]),
])
def test_nice_ticks_are_round_and_cover_the_range(lo: float, hi: float, ticks: list[float]) -> None:
    assert nice_ticks(lo, hi) == ticks


def test_nice_ticks_refuse_non_finite_bounds() -> None:
    with pytest.raises(ValueError, match="finite"):
        nice_ticks(0, math.inf)


def test_negative_values_get_an_axis_below_zero() -> None:
    root = parse(bar_chart([("gain", 3.0), ("loss", -2.0)], title="t", y_label="y"))
    assert texts(root, "cv-y-tick") == ["-2", "0", "2", "4"]
    assert texts(root, "cv-bar-value") == ["3", "-2"]


def test_tick_labels_do_not_run_past_the_right_edge() -> None:
    width = 640
    root = parse(line_chart({"a": [(T0 - 20, 1), (T0 + 100, 2)]}, title="t", y_label="y", width=width))
    for label in by_class(root, "cv-x-tick-label"):
        x, text = float(label.get("x", "0")), label.text or ""
        right = x if label.get("text-anchor") == "end" else x + len(text) * 6.4 / 2
        assert right <= width, text
    assert by_class(root, "cv-x-tick-label")[-1].get("text-anchor") == "end"


def test_a_series_has_its_colour_whatever_its_place_and_succeeded_is_green() -> None:
    def strokes(series: dict[str, list[tuple[float, float]]]) -> dict[str, str]:
        root = parse(line_chart(series, title="t", y_label="y"))
        return {str(group.get("data-series")): str(group[0].get("stroke")) for group in by_class(root, "cv-series")}

    points = [(T0, 1.0), (T0 + 60, 2.0)]
    report = strokes({name: points for name in ("attempts", "succeeded", "failed", "accepted", "published")})
    dashboard = strokes({name: points for name in ("succeeded", "failed", "accepted", "published")})
    assert report["succeeded"] == dashboard["succeeded"] == "#16a34a", "succeeded is green, never red"
    assert report["failed"] == dashboard["failed"] == "#dc2626"
    assert len(set(report.values())) == 5, "the series stay apart"
    bars = parse(bar_chart([("published", 3.0), ("failed", 1.0)], title="t", y_label="items"))
    assert [bar.get("fill") for bar in by_class(bars, "cv-bar")] == ["#0891b2", "#dc2626"]


def test_the_graph_chart_draws_every_stage_and_edge_with_counts_and_escapes_names() -> None:
    from conveyor.service.plots import graph_chart

    stages = [{"name": "parse", "kind": "map", "after": None},
              {"name": "<b>", "kind": "fanout", "after": "parse"},
              {"name": "embed", "kind": "map", "after": "<b>"},
              {"name": "vectors", "kind": "gather", "after": "embed"},
              {"name": "extract", "kind": "map", "after": "parse"},
              {"name": "publish", "kind": "publish", "after": "extract", "parents": ["extract", "vectors"]}]
    svg = graph_chart(stages, {"parse": {"succeeded": 3}, "embed": {"succeeded": 5, "failed": 1}})
    assert svg.count('class="cv-stage"') == 6 and svg.count('class="cv-edge"') == 6
    assert "&lt;b&gt; (fanout)" in svg and "<b>" not in svg
    assert "3 / 3 done" in svg and "5 / 6 done" in svg
    assert graph_chart(stages, {}) == graph_chart(stages, {})  # deterministic
