"""An event's settlement drawn as inline SVG (no script, no file beside the page): the metered
load around the event, each rule's baseline over it, and the load the target asks for (the
first rule's baseline less the target)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any
from zoneinfo import ZoneInfo

WIDTH, HEIGHT = 960, 290
LEFT, RIGHT, TOP, BOTTOM = 60, 230, 16, 46
#: One colour per rule, in the order the settlement lists them.
RULE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")
METERED, TARGET, EVENT_SHADE = "#111111", "#d62728", "#fde9e9"
UNMET_DASH = "none"  #: the legend's mark of an interval not met: a thick bar, not a line


def _times(doc: dict[str, Any]) -> tuple[float, float]:
    return _at(doc["start"]), _at(doc["end"])


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round kW values spanning [low, high]."""
    span = max(high - low, 1e-9)
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    first = math.floor(low / step) * step
    last = math.ceil(high / step) * step
    return [first + i * step for i in range(round((last - first) / step) + 1)]


@dataclass(frozen=True)
class _Frame:
    """The plot's scales: seconds since the epoch across, kW up."""

    x_low: float
    x_high: float
    y_ticks: list[float]

    def x(self, t: float) -> float:
        return LEFT + (t - self.x_low) / max(self.x_high - self.x_low, 1) * (WIDTH - LEFT - RIGHT)

    def y(self, kw: float) -> float:
        low, high = self.y_ticks[0], max(self.y_ticks[-1], self.y_ticks[0] + 1)
        return TOP + (high - kw) / (high - low) * (HEIGHT - TOP - BOTTOM)


def _frame(settlement: dict[str, Any], shown: list[dict[str, Any]]) -> _Frame:
    rules = settlement["rules"]
    rows = [r for rule in rules for r in rule["intervals"]]
    xs = [_at(i["start"]) for i in shown + rows] + [_at(i["end"]) for i in shown + rows]
    xs += list(_times(settlement))
    values = [i["mean_kw"] for i in shown]
    for row in rows:
        values += [
            v for v in (row["baseline_kw"], row["metered_kw"], _target_load(row)) if v is not None
        ]
    if not values:
        values = [0.0, 1.0]
    margin = 0.08 * (max(values) - min(values) or abs(max(values)) or 1.0)
    return _Frame(min(xs), max(xs), _ticks(min(values) - margin, max(values) + margin))


def settlement_svg(
    settlement: dict[str, Any], context: list[dict[str, Any]], zone: ZoneInfo
) -> str:
    """The plot of one event: `context` are the meter history's intervals around it
    (`GET /v1/site/meter`), possibly none."""
    shown = [i for i in context if i.get("mean_kw") is not None]
    frame = _frame(settlement, shown)
    left, right = (frame.x(t) for t in _times(settlement))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="settlement of '
        f'{escape(settlement["event_id"])}" font-family="sans-serif" font-size="11">',
        f'<rect x="{left:.1f}" y="{TOP}" width="{right - left:.1f}" '
        f'height="{HEIGHT - TOP - BOTTOM}" fill="{EVENT_SHADE}"/>',
    ]
    parts += _axes(frame, zone)
    lines, legend = _lines(settlement["rules"], shown, frame)
    parts += lines
    for n, (colour, dash, label) in enumerate(legend):
        ly = TOP + 8 + 18 * n
        lx = WIDTH - RIGHT + 12
        parts.append(
            f'<line x1="{lx}" x2="{lx + 22}" y1="{ly}" y2="{ly}" stroke="{colour}" '
            f'stroke-width="{6 if dash == UNMET_DASH else 2}" stroke-dasharray="{dash}"/>'
            f'<text x="{lx + 28}" y="{ly + 4}">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _axes(frame: _Frame, zone: ZoneInfo) -> list[str]:
    """Grid, kW ticks and label, clock ticks on the site's clock and the axis's label."""
    parts = []
    for kw in frame.y_ticks:
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{frame.y(kw):.1f}" '
            f'y2="{frame.y(kw):.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{frame.y(kw) + 4:.1f}" text-anchor="end">{kw:g}</text>'
        )
    middle = TOP + (HEIGHT - TOP - BOTTOM) / 2
    parts.append(
        f'<text x="14" y="{middle:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle:.0f})">kW</text>'
    )
    for t in _time_ticks(frame.x_low, frame.x_high):
        label = datetime.fromtimestamp(t, zone).strftime("%H:%M")
        parts.append(
            f'<line x1="{frame.x(t):.1f}" x2="{frame.x(t):.1f}" y1="{HEIGHT - BOTTOM}" '
            f'y2="{HEIGHT - BOTTOM + 4}" stroke="#555"/>'
            f'<text x="{frame.x(t):.1f}" y="{HEIGHT - BOTTOM + 16}" '
            f'text-anchor="middle">{label}</text>'
        )
    parts.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}" '
        f'stroke="#555"/><text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 4}" '
        f'text-anchor="middle">time on the site\'s clock ({escape(zone.key)})</text>'
    )
    return parts


def _lines(
    rules: list[dict[str, Any]], shown: list[dict[str, Any]], frame: _Frame
) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The metered load, each rule's baseline, the first rule's target load and the intervals
    it did not meet; and their legend (colour, dash, label)."""
    x, y = frame.x, frame.y
    parts: list[str] = []
    legend: list[tuple[str, str, str]] = []
    metered = [(_at(i["start"]), _at(i["end"]), i["mean_kw"]) for i in shown]
    if not shown and rules:
        metered = [(_at(r["start"]), _at(r["end"]), r["metered_kw"]) for r in rules[0]["intervals"]]
    parts.append(_steps(metered, x, y, METERED, "", 1.5))
    legend.append((METERED, "", "metered load"))
    for n, rule in enumerate(rules):
        colour = RULE_COLOURS[n % len(RULE_COLOURS)]
        steps = [(_at(r["start"]), _at(r["end"]), r["baseline_kw"]) for r in rule["intervals"]]
        if any(kw is not None for _, _, kw in steps):
            parts.append(_steps(steps, x, y, colour, "6 3", 2.0))
            legend.append((colour, "6 3", f"baseline {rule['rule']}"))
    first = next((r for r in rules if r["baseline"] is not None), None)
    if first is not None:
        steps = [(_at(r["start"]), _at(r["end"]), _target_load(r)) for r in first["intervals"]]
        parts.append(_steps(steps, x, y, TARGET, "2 3", 2.0))
        legend.append((TARGET, "2 3", f"baseline less target ({first['rule']})"))
        short = [(_at(r["start"]), _at(r["end"])) for r in first["intervals"] if not r["met"]]
        parts += [
            f'<rect x="{x(a):.1f}" y="{HEIGHT - BOTTOM - 6}" width="{x(b) - x(a):.1f}" '
            f'height="6" fill="{TARGET}"/>'
            for a, b in short
        ]
        legend.append((TARGET, UNMET_DASH, f"target not met ({first['rule']})"))
    return parts, legend


def _target_load(row: dict[str, Any]) -> float | None:
    """The load the target asks for: the baseline less the target [kW]."""
    if row["baseline_kw"] is None:
        return None
    return float(row["baseline_kw"]) - float(row["target_kw"])


def _time_ticks(low: float, high: float) -> list[float]:
    span = high - low
    step = next((s for s in (900, 1800, 3600, 7200, 10800, 21600) if span / s <= 8), 43200)
    first = math.ceil(low / step) * step
    return [float(t) for t in range(int(first), int(high) + 1, step)]


def _steps(
    steps: list[tuple[float, float, float | None]],
    x: Any,
    y: Any,
    colour: str,
    dash: str,
    width: float,
) -> str:
    """A step line through (start, end, kW) intervals, broken where one is missing."""
    runs: list[list[str]] = []
    last_end: float | None = None
    for begins, ends, kw in steps:
        if kw is None:
            last_end = None
            continue
        point = f"{x(begins):.1f},{y(kw):.1f} {x(ends):.1f},{y(kw):.1f}"
        if last_end is not None and abs(begins - last_end) < 1:
            runs[-1].append(point)
        else:
            runs.append([point])
        last_end = ends
    return "".join(
        f'<polyline points="{" ".join(run)}" fill="none" stroke="{colour}" '
        f'stroke-width="{width}" stroke-dasharray="{dash}"/>'
        for run in runs
    )
