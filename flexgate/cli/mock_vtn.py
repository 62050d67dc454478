"""`flexgate mock-vtn`: a utility's VTN for the lab, OpenADR 2.0b (openleadr, issuing a
scenario) or 3.1 (issuing one event). It serves until Ctrl-C.

The mock VTNs' modules load when the verb runs: the parser is built for every command."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from flexgate.cli.readers import BadInputError


def add_parser(sub: Any) -> None:
    vtn = sub.add_parser(
        "mock-vtn", help="an OpenADR 2.0b VTN (openleadr) issuing a scenario, or a 3.1 VTN"
    )
    vtn.add_argument(
        "--scenario",
        type=Path,
        metavar="FILE",
        help="events to issue, JSON like examples/scenario.json (default: one event asking "
        "for 25 kW less, 10 s after the VEN registers, for 60 s)",
    )
    vtn.add_argument(
        "--openadr",
        choices=("2.0b", "3.1"),
        default="2.0b",
        help="3.1: the OpenADR 3.1 mock VTN (OAuth2, programs, events, webhooks, reports), "
        "issuing one event asking for 25 kW less, 10 s after a VEN registers, for 60 s",
    )
    vtn.add_argument(
        "--mqtt-broker",
        metavar="URI",
        help="3.1 only: offer the MQTT notifier (GET /notifiers) on this broker, e.g. "
        "mqtt://127.0.0.1:1883, and publish every program and event change to it",
    )
    vtn.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    vtn.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    vtn.set_defaults(command=run_mock_vtn, name="mock-vtn")


def run_mock_vtn(args: argparse.Namespace) -> int:
    if args.openadr == "3.1":
        return _run_mock_vtn31(args)
    if args.mqtt_broker:
        raise BadInputError("--mqtt-broker is for the 3.1 mock VTN (--openadr 3.1)")
    from flexgate.lab.mockvtn import DEFAULT_SCENARIO, MockVtn, read_scenario

    try:
        scenario = read_scenario(args.scenario) if args.scenario else DEFAULT_SCENARIO
    except FileNotFoundError:
        raise BadInputError(f"{args.scenario}: no such file") from None
    except (ValueError, OSError) as exc:
        raise BadInputError(f"{args.scenario}: {exc}") from None
    vtn = MockVtn(
        scenario, host=args.host, port=args.port, say=lambda line: print(line, flush=True)
    ).start()
    print(f"mock VTN at {vtn.url}; waiting for a VEN (Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(1)
    finally:
        vtn.stop()


def _run_mock_vtn31(args: argparse.Namespace) -> int:
    from flexgate.lab.mockvtn31 import LAB_CLIENT_ID, MockVtn31
    from flexgate.serve import ServerThread

    if args.scenario:
        raise BadInputError("--scenario is a 2.0b scenario: the 3.1 mock VTN issues its own event")
    try:
        vtn = MockVtn31(say=lambda line: print(line, flush=True), mqtt_broker=args.mqtt_broker)
    except (ValueError, OSError) as exc:
        raise BadInputError(f"--mqtt-broker {args.mqtt_broker}: {exc}") from None
    vtn.issue_after_registration()
    mqtt = f"; MQTT notifications on {args.mqtt_broker}" if args.mqtt_broker else ""
    try:
        with ServerThread(vtn.app, host=args.host, port=args.port) as url:
            print(
                f"mock OpenADR 3.1 VTN at {url}; OAuth2 client {LAB_CLIENT_ID!r} with the lab "
                f"secret (docs/openadr.md){mqtt}; waiting for a VEN (Ctrl-C stops)",
                file=sys.stderr,
            )
            while True:
                time.sleep(1)
    finally:
        vtn.close()
