"""`flexgate replay`: a lab replay of days of a site with events (flexgate.replay), settled
and written as the month's report (`flexgate report`'s CSV and HTML).

The report covers the replayed days; a replay of a whole calendar month is titled and named
by the month (`settlement-2026-06.html`), as `flexgate report --month` names it.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import shutil
import time
from datetime import date
from typing import Any

from pydantic import ValidationError

from flexgate.cli import output
from flexgate.cli.readers import BadInputError
from flexgate.cli.report import write_report
from flexgate.replay import Replay, ReplayError, ReplayResult


def run_replay(args: argparse.Namespace) -> int:
    began = time.monotonic()
    folder = args.out / "replay-site"
    if folder.exists():  # the previous replay's store and agents' state: this one starts anew
        shutil.rmtree(folder)
    try:
        replay = Replay(
            first_day=args.start,
            days=args.days,
            events=args.events,
            folder=folder,
            seed=args.seed,
            history_days=args.history_days,
            resolution_s=args.resolution_s,
            nodes=args.nodes,
            timezone=args.timezone,
            rules=args.rules,
            interval_min=args.interval_min,
        )
    except ValidationError as exc:  # the settings refuse a zone, a preset or an interval
        raise BadInputError("; ".join(e["msg"] for e in exc.errors())) from None
    except ReplayError as exc:
        raise BadInputError(str(exc)) from None
    try:
        result = asyncio.run(replay.run())
    except ReplayError as exc:
        raise BadInputError(str(exc)) from None
    title, stem = _naming(result)
    doc = write_report(args.out, stem, title, result.settlements, result.events, result.contexts)
    doc = _document(result, doc, time.monotonic() - began)
    if args.json:
        output.print_json(doc)
    else:
        _show(doc)
    return 0


def _naming(result: ReplayResult) -> tuple[str, str]:
    first, last = result.first_day, result.last_day
    month_end = date(first.year, first.month, calendar.monthrange(first.year, first.month)[1])
    if first.day == 1 and last == month_end:
        return f"Settlement report, {first:%B %Y}", f"settlement-{first:%Y-%m}"
    return (
        f"Settlement report, {first.isoformat()} to {last.isoformat()}",
        f"settlement-{first.isoformat()}-{last.isoformat()}",
    )


def _document(result: ReplayResult, report: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    for event in report["events"]:
        event["replay"] = result.runs[event["event_id"]].doc()
    return {
        "first_day": result.first_day.isoformat(),
        "last_day": result.last_day.isoformat(),
        "history_from": result.history_from.isoformat(),
        "holiday": result.holiday.isoformat(),
        "database": str(result.database),
        **report,
        "elapsed_s": elapsed_s,
    }


def _show(doc: dict[str, Any]) -> None:
    print(
        f"replayed {doc['first_day']} to {doc['last_day']} (history from {doc['history_from']}, "
        f"holiday {doc['holiday']}) in {doc['elapsed_s']:.0f} s"
    )
    for event in doc["events"]:
        run = event["replay"]
        settled = ", ".join(
            f"{name} {_kwh(r['delivered_kwh'])} kWh"
            if r["reason"] is None
            else f"{name}: no baseline"
            for name, r in event["rules"].items()
        )
        print(
            f"  {event['event_id']}  {event['start_local'][:16]}  asked "
            f"{run['requested_kw']:.1f} kW, delivered {run['delivered_kwh']:.1f} kWh; "
            f"settled: {settled}"
        )
    print(f"{doc['rows']} interval rows")
    print(f"CSV:  {doc['csv']}")
    print(f"HTML: {doc['html']}")
    print(f"store: {doc['database']}")


def _kwh(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
