"""`flexgate report`: a month's (or one event's) settlement from a running gateway, written as
a CSV of intervals and an HTML page (flexgate.settlementreport).

It reads `GET /v1/events`, each event's `GET /v1/events/{id}/settlement` and the meter
history around it (`GET /v1/site/meter`). A month is the site's: an event belongs to it by
its local day. An unknown event (404) or a refused parameter (422) is bad input, exit 2; a
gateway that does not answer, a failure, exit 1.

httpx is a gateway client's (the gateway's extra): it loads when the verb runs, as the parser
is built for every command, on a GPU node's install too.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from flexgate.cli import options, output
from flexgate.cli.readers import BadInputError
from flexgate.settlementreport import render_html, write_csv

if TYPE_CHECKING:
    import httpx

#: The meter history drawn either side of an event.
CONTEXT = timedelta(hours=2)


class GatewayFailedError(Exception):
    """The gateway did not answer, or answered a failure."""


def add_parser(sub: Any) -> None:
    verb = sub.add_parser(
        "report",
        help="a month's or an event's settlement from a running gateway, as CSV and HTML",
        description="Reads each event's settlement under the program's baselines from a "
        "running gateway (GET /v1/events/ID/settlement) and writes a CSV of its intervals and "
        "a self-contained HTML page with plots (docs/operations.md, 'Settlement').",
    )
    which = verb.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--month",
        type=_month_option,
        metavar="YYYY-MM",
        help="every event on the site's days of it",
    )
    which.add_argument("--event", metavar="ID", help="one event")
    verb.add_argument(
        "--gateway",
        default="http://127.0.0.1:8000",
        metavar="URL",
        help="the gateway's base URL (default http://127.0.0.1:8000)",
    )
    verb.add_argument(
        "--token",
        default=None,
        help="the read token (default: FLEXGATE_READ_TOKEN, else FLEXGATE_API_TOKEN, else none)",
    )
    verb.add_argument(
        "--rules", metavar="PRESETS", help="baseline presets, comma-separated (default: the site's)"
    )
    verb.add_argument(
        "--interval-min",
        type=int,
        choices=(1, 5, 15, 30, 60),
        metavar="MIN",
        help="settlement interval: 1, 5, 15, 30 or 60 (default: the site's)",
    )
    verb.add_argument(
        "--out", type=Path, default=Path("out"), metavar="DIR", help="folder (default out)"
    )
    verb.add_argument(
        "--timeout-s",
        type=options.positive,
        default=30.0,
        metavar="S",
        help="per request (default 30)",
    )
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=run_report, name="report")


def _month_option(text: str) -> str:
    try:
        datetime.strptime(text, "%Y-%m")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a month as YYYY-MM, got {text!r}") from None
    return text


def run_report(args: argparse.Namespace) -> int:
    import httpx

    token = (
        args.token
        or os.environ.get("FLEXGATE_READ_TOKEN")
        or os.environ.get("FLEXGATE_API_TOKEN", "")
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {k: v for k, v in (("rules", args.rules), ("interval_min", args.interval_min)) if v}
    try:
        with httpx.Client(
            base_url=args.gateway.rstrip("/"), timeout=args.timeout_s, headers=headers
        ) as api:
            events = {e["id"]: e for e in _get(api, "/v1/events")["events"]}
            if args.event is not None:
                if args.event not in events:
                    raise BadInputError(f"no event '{args.event}' at {args.gateway}")
                settlements = [_settle(api, args.event, params)]
                title, stem = f"Settlement of event {args.event}", f"settlement-{args.event}"
            else:
                settlements = _month(api, events.values(), args.month, params)
                month = datetime.strptime(args.month, "%Y-%m").strftime("%B %Y")
                title, stem = f"Settlement report, {month}", f"settlement-{args.month}"
            contexts = {d["event_id"]: _context(api, d) for d in settlements}
    except GatewayFailedError as exc:
        print(f"flexgate report: failed: {exc}", file=sys.stderr)
        return 1
    doc = write_report(args.out, stem, title, settlements, events, contexts)
    if args.json:
        output.print_json(doc)
    else:
        print(f"{len(settlements)} event(s), {doc['rows']} interval rows")
        print(f"CSV:  {doc['csv']}")
        print(f"HTML: {doc['html']}")
    return 0


def write_report(
    out: Path,
    stem: str,
    title: str,
    settlements: list[dict[str, Any]],
    events: dict[str, dict[str, Any]],
    contexts: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """`out/stem.csv` and `out/stem.html`; the report's JSON document (`--json`)."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, html_path = out / f"{stem}.csv", out / f"{stem}.html"
    rows = write_csv(csv_path, settlements)
    html_path.write_text(render_html(title, settlements, events, contexts), encoding="utf-8")
    return {
        "csv": str(csv_path),
        "html": str(html_path),
        "rows": rows,
        "events": [summary(d) for d in settlements],
    }


def _get(api: httpx.Client, path: str, params: dict[str, Any] | None = None) -> Any:
    import httpx

    try:
        answer = api.get(path, params=params)
    except httpx.HTTPError as exc:
        raise GatewayFailedError(f"the gateway at {api.base_url} did not answer: {exc}") from None
    if answer.status_code in (404, 422):
        raise BadInputError(str(_detail(answer)))
    if answer.status_code != 200:
        raise GatewayFailedError(f"{path}: {answer.status_code}: {_detail(answer)}")
    return answer.json()


def _detail(answer: httpx.Response) -> Any:
    try:
        return answer.json().get("detail")
    except ValueError:
        return answer.text


def _settle(api: httpx.Client, event_id: str, params: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = _get(api, f"/v1/events/{event_id}/settlement", params)
    return doc


def _month(
    api: httpx.Client, events: Any, month: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """The settlements of the events on the site's days of `month` (YYYY-MM): the events
    starting within a day of it by UTC are settled, and kept by their local day."""
    first = datetime.strptime(month, "%Y-%m")
    after = (first + timedelta(days=32)).replace(day=1)
    near = [
        e
        for e in events
        if first - timedelta(days=1)
        <= datetime.fromisoformat(e["start"]).replace(tzinfo=None)
        < after + timedelta(days=1)
        and not e.get("test")
    ]
    settled = [_settle(api, e["id"], params) for e in near]
    return [d for d in settled if d["event_day"].startswith(month)]


def _context(api: httpx.Client, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The meter history's intervals around the event, at the settlement's length (30 min
    for hours), or none where the gateway keeps none."""
    length = {60: "30m"}.get(doc["interval_min"], f"{doc['interval_min']}m")
    start = datetime.fromisoformat(doc["start"]) - CONTEXT
    end = datetime.fromisoformat(doc["end"]) + CONTEXT
    params = {"start": start.isoformat(), "end": end.isoformat(), "interval": length}
    try:
        history: list[dict[str, Any]] = _get(api, "/v1/site/meter", params)["intervals"]
    except BadInputError:
        return []
    return history


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    zone = ZoneInfo(doc["timezone"])
    return {
        "event_id": doc["event_id"],
        "event_day": doc["event_day"],
        "start_local": datetime.fromisoformat(doc["start"]).astimezone(zone).isoformat(),
        "throughput_kept": doc["throughput_kept"],
        "rules": {
            r["rule"]: {
                "reason": r["reason"],
                "delivered_kwh": r["totals"]["delivered_kwh"],
                "mean_delivered_kw": r["totals"]["mean_delivered_kw"],
                "mean_target_kw": r["totals"]["mean_target_kw"],
                "compliance": r["totals"]["compliance"],
            }
            for r in doc["rules"]
        },
    }
