"""`flexgate replay`: a lab replay of days of a site with events (flexgate.replay), settled
and written as the month's report (`flexgate report`'s CSV and HTML).

The report covers the replayed days; a replay of a whole calendar month is titled and named
by the month (`settlement-2026-06.html`), as `flexgate report --month` names it.

The simulated site's modules (the gateway's) load when the verb runs: the parser is built for
every command, on a GPU node's install too.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import shutil
import time
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexgate.cli import options, output
from flexgate.cli.readers import BadInputError
from flexgate.cli.report import write_report

if TYPE_CHECKING:
    from flexgate.replay import ReplayResult


def add_parser(sub: Any) -> None:
    verb = sub.add_parser(
        "replay",
        help="a lab replay of days of a site with events, settled as the month's report",
        description="Synthesises the site's meter history into a gateway store (a daily "
        "cycle, noise, weekends and a holiday lower), runs each event through the gateway's "
        "loop on a simulated site, settles every event under the program's baselines and "
        "writes the report's CSV and HTML (docs/operations.md, 'Settlement').",
    )
    _add_days_and_history(verb)
    _add_site_and_settlement(verb)
    verb.add_argument("--seed", type=options.seed, default=1, metavar="N", help="default 1")
    verb.add_argument(
        "--out", type=Path, default=Path("out"), metavar="DIR", help="folder (default out)"
    )
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=run_replay, name="replay")


def _add_days_and_history(verb: Any) -> None:
    """The days replayed with their events, and the quiet history synthesised before them."""
    verb.add_argument(
        "--days",
        type=options.positive_int,
        default=30,
        metavar="N",
        help="days replayed (default 30)",
    )
    verb.add_argument(
        "--events",
        type=options.positive_int,
        default=10,
        metavar="N",
        help="events, on distinct weekdays (default 10)",
    )
    verb.add_argument(
        "--start",
        type=_day,
        default=date(2026, 6, 1),
        metavar="YYYY-MM-DD",
        help="the first day replayed (default 2026-06-01)",
    )
    verb.add_argument(
        "--history-days",
        type=options.positive_int,
        default=21,
        metavar="N",
        help="quiet days of history before it, for the baselines (default 21)",
    )
    verb.add_argument(
        "--resolution-s",
        type=int,
        choices=(60, 300),
        default=60,
        metavar="S",
        help="the synthesised history's sample period: 60 or 300 (default 60)",
    )


def _add_site_and_settlement(verb: Any) -> None:
    """The simulated site, and the baselines and interval its events are settled under."""
    verb.add_argument(
        "--nodes",
        type=options.positive_int,
        default=2,
        metavar="N",
        help="simulated nodes of 8 GPUs (default 2)",
    )
    verb.add_argument(
        "--timezone",
        default="America/New_York",
        metavar="ZONE",
        help="the site's time zone (default America/New_York)",
    )
    verb.add_argument(
        "--rules",
        default="10of10,sameday-3+2",
        metavar="PRESETS",
        help="baseline presets, comma-separated (default 10of10,sameday-3+2)",
    )
    verb.add_argument(
        "--interval-min",
        type=int,
        choices=(1, 5, 15, 30, 60),
        default=15,
        metavar="MIN",
        help="settlement interval: 1, 5, 15, 30 or 60 (default 15)",
    )


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a day as YYYY-MM-DD, got {text!r}") from None


def run_replay(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from flexgate.replay import Replay, ReplayError

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
