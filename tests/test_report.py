"""`flexgate report` (issue 38, item 5): a month's settlement read from a running gateway,
written as a CSV of intervals and a self-contained HTML page. The site is
tests/gateway/test_settlement.py's: the event ev-1 (2026-11-18) and the other event ev-0
(2026-11-16, on a 500 kW day: the 10of10 adjustment is capped, nothing is delivered)."""

from __future__ import annotations

import csv
import json
import re

from flexgate.cli import main
from tests.gateway.test_meter_history import running_gateway
from tests.gateway.test_settlement import HOLIDAY, site_database


def test_a_month_and_an_event_are_reported_as_csv_and_html(tmp_path, capsys):
    database_url = site_database(tmp_path)
    out = tmp_path / "out"
    options = {"settlement_holidays": HOLIDAY.isoformat()}
    with running_gateway(tmp_path, database_url, **options) as (api, _):
        gateway = str(api.base_url)
        month = ["report", "--month", "2026-11", "--gateway", gateway, "--out", str(out)]
        assert main([*month, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert main(["report", "--event", "ev-1", "--gateway", gateway, "--out", str(out)]) == 0
        shown = capsys.readouterr().out
        assert main(["report", "--event", "nope", "--gateway", gateway, "--out", str(out)]) == 2
        assert "no event 'nope'" in capsys.readouterr().err
        bad = ["report", "--event", "ev-1", "--gateway", gateway, "--rules", "9of9"]
        assert main(bad) == 2
        assert "rules: preset '9of9'" in capsys.readouterr().err
        assert main(["report", "--month", "2026-10", "--gateway", gateway, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["events"] == []
    assert (doc["csv"], doc["html"]) == (
        str(out / "settlement-2026-11.csv"),
        str(out / "settlement-2026-11.html"),
    )
    assert [e["event_id"] for e in doc["events"]] == ["ev-0", "ev-1"]
    ev0, ev1 = doc["events"]
    assert ev1["rules"]["10of10"]["compliance"] == 0.75
    assert ev0["rules"]["10of10"]["compliance"] == 0.0
    with open(doc["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert doc["rows"] == len(rows) == 2 * 2 * 4  # events, rules, 15-minute intervals
    first = rows[8]  # ev-1 under 10of10, 14:00
    assert (first["event_id"], first["rule"], first["start"]) == (
        "ev-1",
        "10of10",
        "2026-11-18T14:00:00+00:00",
    )
    assert (first["baseline_kw"], first["metered_kw"], first["target_kw"]) == ("110", "70", "35")
    assert (first["delivered_kw"], first["delivered_kwh"], first["met"]) == ("40", "10", "true")
    assert [r["estimated"] for r in rows[8:12]] == ["false", "true", "true", "false"]
    capped = rows[0]  # ev-0: the 10of10 adjustment x5 capped at +20%: 120 kW against 500
    assert (capped["baseline_kw"], capped["delivered_kw"]) == ("120", "-380")
    page = (out / "settlement-2026-11.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 2
    assert not re.search(r"<script|<link|src=", page)  # self-contained
    assert "Settlement report, November 2026" in page
    assert "75%" in page
    # What a site manager reads: every figure's unit in its heading, the events short of
    # their target shaded, each interval not met with its shortfall, the plots' axes named.
    for heading in ("target kWh", "delivered kWh", "mean delivered kW", "target kW (mean)"):
        assert f"<th>{heading}</th>" in page or f"<th rowspan=2>{heading}</th>" in page, heading
    assert '<td class="short"><span class="bad">75%</span></td>' in page  # ev-1, 3 of 4 met
    assert '<td class="short"><span class="bad">0%</span></td>' in page  # ev-0
    assert "<span class=bad>no</span> (5.00 kW short)" in page  # ev-1 14:30: 30 kW of 35
    assert "<span class=bad>no</span> (400.00 kW short)" in page  # ev-0: -380 kW of 20
    assert "2 estimated, 1 meter fault" in page
    assert page.count("time on the site's clock (UTC)") == 2
    # the intervals not met under the first rule, marked along each plot's axis: 1 + 4
    assert page.count('height="6" fill="#d62728"') == 5
    assert "target not met (10of10)" in page
    assert (
        "<b>10of10</b>: the mean of the last 10 eligible days (looking back at most 45 days), "
        "adjusted on the day (multiplicative) over the 3 h ending 1 h before the start, "
        "capped at ±20%; a day with over 10% of its intervals estimated is not used"
    ) in page
    assert (
        "<b>sameday-3+2</b>: the mean of the 3 h just before the event and the 2 h after it"
    ) in page
    assert "(capped)" in page
    assert "settlement-ev-1.html" in shown
    one = (out / "settlement-ev-1.csv").read_text().splitlines()
    assert len(one) == 1 + 2 * 4


def test_the_other_presets_are_described_in_words():
    from dataclasses import asdict

    from flexgate.settlementreport import describe_rule
    from flexmodel.baselines import preset

    def words(name: str) -> str:
        rule = preset(name)
        return describe_rule(type(rule).__name__, asdict(rule))

    assert words("high5of10").startswith(
        "the mean of the 5 highest-load of the last 10 eligible days (looking back at most 45 "
        "days), adjusted on the day (additive) over the 3 h ending 1 h before the start, no cap"
    )
    assert words("matchday-3").startswith(
        "the mean of the 3 eligible days whose load over the 3 h ending 1 h before the start is "
        "closest to the event day's (looking back at most 45 days)"
    )
    assert words("meterbefore-300s") == (
        "the meter's mean over the 300 s before the event's start (no stretch over 10 s "
        "without a reading), from the raw samples"
    )


def test_an_event_s_baseline_source_is_named_per_day_and_for_a_level_before():
    """A night event's summary names each local day's baseline days (or why that day has
    none), a meter-before rule's the level before: not the first day's days alone, not an
    empty list."""
    from flexgate.settlementreport import _baseline_source

    def part(day, days, reason=None):
        base = None if days is None else {"days_used": days}
        return {"day": day, "reason": reason, "baseline": base}

    night = {
        "baseline": {
            "days_used": ["2026-10-22"],
            "parts": [
                part("2026-10-23", ["2026-10-22", "2026-10-21"]),
                part("2026-10-24", None, "3 eligible days, 10 needed"),
            ],
        }
    }
    assert _baseline_source(night) == (
        "2026-10-23: baseline days 2026-10-22, 2026-10-21; "
        "2026-10-24: no baseline (3 eligible days, 10 needed)"
    )
    fast = {"baseline": {"days_used": []}, "meter_before": {"level_kw": 105.04, "samples": 300}}
    assert _baseline_source(fast) == "level before 105.0 kW (300 samples)"
    assert _baseline_source({"baseline": {"days_used": ["2026-10-22"]}}) == (
        "baseline days 2026-10-22"
    )
