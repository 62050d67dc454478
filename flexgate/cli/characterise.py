"""`flexgate characterise`: ask a running gateway to probe jobs, and optionally wait for it.

The gateway's answer is printed as it comes (`--json`: one document). A refusal the request
caused (no such job, a protected one, over the budget: 404, 422) is bad input, exit 2; one the
site's state caused (an event, a probe running: 409), or a gateway that does not answer, is a
failure, exit 1, with the gateway's reason on stderr.

httpx is a gateway client's (the gateway's extra): it loads when the verb runs, as the parser
is built for every command, on a GPU node's install too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from flexgate.cli import options, output
from flexgate.cli.readers import BadInputError

if TYPE_CHECKING:
    import httpx

#: How often `--wait` asks how the probe goes [s].
POLL_S = 1.0


def add_parser(sub: Any) -> None:
    verb = sub.add_parser(
        "characterise", help="ask a running gateway to probe jobs' caps and measure their curves"
    )
    verb.add_argument(
        "jobs", nargs="*", metavar="JOB", help="the jobs to probe (none: every unmeasured job)"
    )
    verb.add_argument(
        "--gateway",
        default="http://127.0.0.1:8000",
        metavar="URL",
        help="the gateway's base URL (default http://127.0.0.1:8000)",
    )
    verb.add_argument("--token", default=None, help="the API token (default: FLEXGATE_API_TOKEN)")
    verb.add_argument("--wait", action="store_true", help="wait for the probe's end")
    verb.add_argument(
        "--timeout-s",
        type=options.positive,
        default=10.0,
        metavar="S",
        help="per request (default 10)",
    )
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=run_characterise, name="characterise")


def run_characterise(args: argparse.Namespace) -> int:
    import httpx

    token = args.token or os.environ.get("FLEXGATE_API_TOKEN", "")
    if not token:
        raise BadInputError("no API token: give --token or set FLEXGATE_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=args.gateway.rstrip("/"), timeout=args.timeout_s) as api:
        try:
            if len(args.jobs) == 1:
                answer = api.post(f"/v1/jobs/{args.jobs[0]}/characterise", headers=headers)
            else:
                body = {"jobs": args.jobs or None}
                answer = api.post("/v1/characterise", json=body, headers=headers)
        except httpx.HTTPError as exc:
            return _failed(f"the gateway at {args.gateway} did not answer: {exc}")
        if answer.status_code in (400, 404, 422):
            raise BadInputError(_detail(answer))
        if answer.status_code != 202:
            return _failed(f"{answer.status_code}: {_detail(answer)}")
        probe = answer.json()
        if args.wait:
            probe = _wait(api, probe)
    if args.json:
        output.print_json(probe)
    else:
        _show(probe)
    return 0 if probe["status"] in ("running", "completed") else 1


def _wait(api: httpx.Client, probe: dict[str, Any]) -> dict[str, Any]:
    while probe["status"] == "running":
        time.sleep(POLL_S)
        current = api.get("/v1/characterise").json()["probe"]
        if current is None or current["id"] != probe["id"]:
            break
        probe = current
    return probe


def _detail(answer: httpx.Response) -> str:
    try:
        detail = answer.json().get("detail")
    except ValueError:
        detail = answer.text
    return str(detail)


def _failed(message: str) -> int:
    print(f"flexgate characterise: failed: {message}", file=sys.stderr)
    return 1


def _show(probe: dict[str, Any]) -> None:
    print(
        f"probe {probe['id']}: {probe['status']}"
        + (f" ({probe['reason']})" if probe["reason"] else "")
    )
    for job in probe["jobs"]:
        caps = ", ".join(f"{c:g}" for c in job["caps_w"])
        print(f"  {job['id']}: caps {caps} W")
    for job in probe["skipped"]:
        print(f"  skipped {job['id']}: {job['reason']}")
    for job in probe["stopped"]:
        print(f"  stopped {job['id']}: {job['reason']}")
    if probe["curves_changed"]:
        print(f"  curves measured: {', '.join(probe['curves_changed'])} (GET /v1/jobs/ID/curve)")
