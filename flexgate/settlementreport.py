"""The settlement report a site manager reads (`flexgate report`): a CSV of every settled
interval, and one self-contained HTML page (inline SVG, no script, no link out) with the
month's table of events and each event's plot.

Both are built from the gateway's settlement documents (`GET /v1/events/{id}/settlement`,
docs/operations.md, "Settlement"); nothing is computed again here.
"""

from __future__ import annotations

import csv
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from flexgate.settlementsvg import RULE_COLOURS, settlement_svg

CSV_COLUMNS = (
    "event_id",
    "rule",
    "start",
    "end",
    "baseline_kw",
    "unadjusted_baseline_kw",
    "metered_kw",
    "target_kw",
    "delivered_kw",
    "delivered_kwh",
    "met",
    "estimated",
    "fault",
    "gap",
    "reason",
)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1180px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 2em; }
.meta { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.bad { color: #b00020; font-weight: 600; } .good { color: #1a7f37; font-weight: 600; }
td.short { background: #fde2e2; } td.nowrap { white-space: nowrap; }
table.events { font-size: 0.85em; } table.events th, table.events td { padding: 4px 6px; }
.note { color: #555; font-size: 0.85em; } .flag { color: #8a6d00; }
details { margin: 0.4em 0 1em; }
"""


def write_csv(path: Path, settlements: list[dict[str, Any]]) -> int:
    """One row per event, rule and interval; the rows written."""
    rows = 0
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for doc in settlements:
            for rule in doc["rules"]:
                for row in rule["intervals"]:
                    writer.writerow(
                        [doc["event_id"], rule["rule"], row["start"], row["end"]]
                        + [_cell(row[c]) for c in CSV_COLUMNS[4:-1]]
                        + [rule["reason"] or ""]
                    )
                    rows += 1
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def _num(value: float | None, digits: int = 1, unit: str = "") -> str:
    return "&ndash;" if value is None else f"{value:,.{digits}f}{unit}"


def _pct(value: float | None) -> str:
    """A compliance: green when every interval met its target, red otherwise."""
    if value is None:
        return "&ndash;"
    css = "good" if value >= 0.999 else "bad"
    return f'<span class="{css}">{100 * value:.0f}%</span>'


def _pct_cell(value: float | None) -> str:
    """A table cell of a compliance, shaded when an interval fell short: the events a site
    manager must look at stand out in the month's table."""
    short = ' class="short"' if value is None or value < 0.999 else ""
    return f"<td{short}>{_pct(value)}</td>"


def _local(text: str, zone: ZoneInfo, form: str = "%a %d %b %H:%M") -> str:
    return datetime.fromisoformat(text).astimezone(zone).strftime(form)


def render_html(
    title: str,
    settlements: list[dict[str, Any]],
    events: dict[str, dict[str, Any]],
    contexts: dict[str, list[dict[str, Any]]],
) -> str:
    """The page: a summary per rule, the table of events, then each event's plot and
    intervals. `events` are the events' documents (`GET /v1/events`), `contexts` the meter
    history around each."""
    zone_name = settlements[0]["timezone"] if settlements else "UTC"
    zone = ZoneInfo(zone_name)
    rules = list(dict.fromkeys(r["rule"] for d in settlements for r in d["rules"]))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">{len(settlements)} event(s); times on the site clock, '
        f"{escape(zone_name)}; rules {escape(', '.join(rules) or 'none')}; "
        f"settlement interval {settlements[0]['interval_min'] if settlements else '-'} min.</p>",
    ]
    parts += _summary(settlements, rules)
    parts += _rule_list(settlements)
    # The definitions before the figures they define: a reader meets them first.
    parts.append(
        '<p class="note">Delivered = the rule\'s baseline less the metered load, per '
        "interval. Compliance = the share of intervals that delivered at least the target; an "
        "interval with no baseline or no reading is not met. Estimated: a sample in the "
        "interval was the model's estimate or taken while the meter faulted. The presets are "
        "flexgate's reading of the programs' rules: check them against your program's manual "
        '(docs/operations.md, "Settlement").</p>'
    )
    parts += _table(settlements, events, rules, zone)
    for doc in settlements:
        parts += _event_section(doc, events.get(doc["event_id"], {}), contexts, zone)
    parts.append("</body></html>")
    return "\n".join(parts)


def _summary(settlements: list[dict[str, Any]], rules: list[str]) -> list[str]:
    out = [
        "<h2>Summary</h2><table><tr><th class=l>rule</th><th>events settled</th>"
        "<th>delivered kWh</th><th>target kWh</th><th>intervals met</th><th>compliance</th></tr>"
    ]
    for name in rules:
        settled = [
            r
            for d in settlements
            for r in d["rules"]
            if r["rule"] == name and r["baseline"] is not None
        ]
        delivered = sum(r["totals"]["delivered_kwh"] or 0.0 for r in settled)
        target = sum(r["totals"]["target_kwh"] for r in settled)
        met = sum(r["totals"]["intervals_met"] for r in settled)
        count = sum(r["totals"]["intervals"] for r in settled)
        out.append(
            f"<tr><td class=l>{escape(name)}</td><td>{len(settled)} of {len(settlements)}</td>"
            f"<td>{_num(delivered)}</td><td>{_num(target)}</td><td>{met} of {count}</td>"
            f"{_pct_cell(met / count if count else None)}</tr>"
        )
    out.append("</table>")
    return out


def _rule_list(settlements: list[dict[str, Any]]) -> list[str]:
    """What each rule computes, in words, from the parameters the settlement names."""
    shown = {r["rule"]: r for d in settlements for r in d["rules"]}
    items = "".join(
        f"<li><b>{escape(name)}</b>: {escape(describe_rule(r['kind'], r['parameters']))}</li>"
        for name, r in shown.items()
    )
    return [f'<ul class="note">{items}</ul>'] if items else []


def describe_rule(kind: str, p: dict[str, Any]) -> str:
    """A baseline rule in words (flexmodel.baselines' parameters, docs/model.md section 11)."""
    if kind == "XOfYRule":
        days = (
            f"the last {p['y_days']} eligible days"
            if p["x_days"] == p["y_days"]
            else f"the {p['x_days']} highest-load of the last {p['y_days']} eligible days"
        )
        text = f"the mean of {days} (looking back at most {p['lookback_days']} days)"
        if p["adjustment"] != "none":
            cap = "no cap" if p["cap_percent"] is None else f"capped at ±{p['cap_percent']:g}%"
            text += (
                f", adjusted on the day ({p['adjustment']}) over the "
                f"{p['adjustment_hours']:g} h ending {p['adjustment_lead_hours']:g} h before the "
                f"start, {cap}"
            )
    elif kind == "SameDayRule":
        before = (
            f"the {p['before_hours']:g} h just before the event"
            if not p["lead_hours"]
            else f"the {p['before_hours']:g} h ending {p['lead_hours']:g} h before the event"
        )
        text = f"the mean of {before} and the {p['after_hours']:g} h after it"
    elif kind == "MeterBeforeRule":
        text = (
            f"the meter's mean over the {p['window_s']:g} s before the event's start (no "
            f"stretch over {p['max_gap_s']:g} s without a reading), from the raw samples"
        )
    elif kind == "MatchDayRule":
        text = (
            f"the mean of the {p['days']} eligible days whose load over the "
            f"{p['match_hours']:g} h ending {p['match_lead_hours']:g} h before the start is "
            f"closest to the event day's (looking back at most {p['lookback_days']} days)"
        )
    else:
        return ", ".join(f"{key} {value}" for key, value in p.items())
    share = p.get("max_estimated_share")
    if share is not None:
        text += f"; a day with over {100 * share:g}% of its intervals estimated is not used"
    return text


def _table(
    settlements: list[dict[str, Any]],
    events: dict[str, dict[str, Any]],
    rules: list[str],
    zone: ZoneInfo,
) -> list[str]:
    head = "".join(
        f'<th colspan="3" style="border-bottom: 3px solid {RULE_COLOURS[n % 5]}">'
        f"{escape(name)}</th>"
        for n, name in enumerate(rules)
    )
    sub = "<th>delivered kWh</th><th>mean delivered kW</th><th>compliance</th>" * len(rules)
    out = [
        '<h2>Events</h2><table class="events">',
        "<tr><th class=l rowspan=2>event</th><th class=l rowspan=2>when</th>"
        "<th class=l rowspan=2>status</th><th rowspan=2>target kW (mean)</th>"
        "<th rowspan=2>target kWh</th><th rowspan=2>throughput kept</th>"
        f"{head}<th class=l rowspan=2>meter marks</th></tr>",
        f"<tr>{sub}</tr>",
    ]
    out += [_event_row(doc, events.get(doc["event_id"], {}), rules, zone) for doc in settlements]
    out.append(
        '</table><p class="note">Target: the reduction the event asked for, under the first '
        "rule's baseline. Throughput kept: the jobs' throughput under the event's caps, as a "
        "share of their throughput before it. Meter marks: the first rule's intervals with an "
        "estimated sample or one read while the meter faulted. A compliance below 100% (an "
        "interval short of its target) is shaded; each event's section below gives its "
        "intervals and by how much each fell short.</p>"
    )
    return out


def _event_row(doc: dict[str, Any], event: dict[str, Any], rules: list[str], zone: ZoneInfo) -> str:
    """One event's row of the table: its target, throughput kept, each rule's delivery and
    compliance, and the first rule's meter marks."""
    by_rule = {r["rule"]: r for r in doc["rules"]}
    cells = ""
    for name in rules:
        rule = by_rule.get(name)
        if rule is None or rule["baseline"] is None:
            why = escape(rule["reason"] or "") if rule else "not asked"
            cells += f'<td colspan="3" class="l note" title="{why}">no baseline</td>'
            continue
        totals = rule["totals"]
        cells += (
            f"<td>{_num(totals['delivered_kwh'])}</td>"
            f"<td>{_num(totals['mean_delivered_kw'])}</td>{_pct_cell(totals['compliance'])}"
        )
    first = doc["rules"][0]["totals"] if doc["rules"] else None
    flags = []
    if first and first["estimated_intervals"]:
        flags.append(f"{len(first['estimated_intervals'])} estimated")
    if first and first["fault_intervals"]:
        flags.append(f"{len(first['fault_intervals'])} meter fault")
    kept = doc.get("throughput_kept")
    return (
        f'<tr><td class="l nowrap"><a href="#{escape(doc["event_id"])}">'
        f"{escape(doc['event_id'])}</a></td><td class='l nowrap'>"
        f"{_local(doc['start'], zone)}&ndash;{_local(doc['end'], zone, '%H:%M')}</td>"
        f"<td class=l>{escape(doc['status'])}</td>"
        f"<td>{_num(first['mean_target_kw'] if first else event.get('reduction_kw'))}</td>"
        f"<td>{_num(first['target_kwh'] if first else None)}</td>"
        f"<td>{'&ndash;' if kept is None else f'{100 * kept:.0f}%'}</td>{cells}"
        f'<td class="l flag">{escape(", ".join(flags) or "none")}</td></tr>'
    )


def _event_section(
    doc: dict[str, Any],
    event: dict[str, Any],
    contexts: dict[str, list[dict[str, Any]]],
    zone: ZoneInfo,
) -> list[str]:
    out = [
        f'<h2 id="{escape(doc["event_id"])}">{escape(doc["event_id"])}: '
        f"{_local(doc['start'], zone, '%A %d %B %Y, %H:%M')}&ndash;"
        f"{_local(doc['end'], zone, '%H:%M')}</h2>",
        f'<p class="meta">{escape(str(event.get("source", "")))} event, '
        f"{escape(doc['status'])}; other event days left out of the baselines: "
        f"{escape(', '.join(doc['event_days_excluded']) or 'none')}.</p>",
        settlement_svg(doc, contexts.get(doc["event_id"], []), zone),
    ]
    for rule in doc["rules"]:
        base = rule["baseline"]
        if base is None:
            out.append(
                f"<p><b>{escape(rule['rule'])}</b>: no baseline: {escape(rule['reason'] or '')}</p>"
            )
            continue
        adjustment = ""
        kind = rule["parameters"].get("adjustment")
        if base["adjusted"]:
            moved = (
                f"&times;{base['adjustment_factor']:.3f}"
                if kind == "multiplicative"
                else f"{base['adjustment_kw']:+.1f} kW"
            )
            capped = " (capped)" if base["capped"] else ""
            adjustment = f"; day-of adjustment {moved}{capped}"
        out.append(
            f"<details><summary><b>{escape(rule['rule'])}</b>: "
            f"{_num(rule['totals']['delivered_kwh'])} kWh delivered, compliance "
            f"{_pct(rule['totals']['compliance'])}; {escape(_baseline_source(rule))}"
            f"{adjustment}</summary>" + _intervals(rule, zone) + "</details>"
        )
    return out


def _baseline_source(rule: dict[str, Any]) -> str:
    """What the rule's baseline came from: the level before a fast event, or each local day's
    baseline days (an event across the site's midnight has one set per day)."""
    before = rule.get("meter_before")
    if before is not None:
        return f"level before {before['level_kw']:.1f} kW ({before['samples']} samples)"
    base = rule["baseline"]
    parts = base.get("parts")
    if not parts:
        return "baseline days " + (", ".join(base["days_used"]) or "none")
    return "; ".join(
        f"{part['day']}: baseline days {', '.join(part['baseline']['days_used']) or 'none'}"
        if part["baseline"] is not None
        else f"{part['day']}: no baseline ({part['reason']})"
        for part in parts
    )


def _intervals(rule: dict[str, Any], zone: ZoneInfo) -> str:
    rows = [
        "<table><tr><th class=l>interval</th><th>baseline kW</th><th>metered kW</th>"
        "<th>target kW</th><th>delivered kW</th><th>kWh</th><th>met</th>"
        "<th class=l>marks</th></tr>"
    ]
    for row in rule["intervals"]:
        marks = [m for m in ("estimated", "fault", "gap") if row[m]]
        rows.append(
            f"<tr><td class=l>{_local(row['start'], zone, '%H:%M')}</td>"
            f"<td>{_num(row['baseline_kw'])}</td><td>{_num(row['metered_kw'])}</td>"
            f"<td>{_num(row['target_kw'])}</td><td>{_num(row['delivered_kw'])}</td>"
            f"<td>{_num(row['delivered_kwh'], 2)}</td>"
            f"<td>{'yes' if row['met'] else _shortfall(row)}</td>"
            f'<td class="l flag">{", ".join(marks)}</td></tr>'
        )
    rows.append("</table>")
    return "".join(rows)


def _shortfall(row: dict[str, Any]) -> str:
    """An interval not met, and by how much where both figures are known (3.0 kW delivered
    against 3.0 asked reads as met unless the page says it fell 0.02 kW short)."""
    if row["delivered_kw"] is None:
        return "<span class=bad>no</span>"
    short = row["target_kw"] - row["delivered_kw"]
    figure = f"{short:.2f}" if short >= 0.01 else f"{short:.1g}"
    return f"<span class=bad>no</span> ({figure} kW short)"
