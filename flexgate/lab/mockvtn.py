"""A mock VTN for the lab and for trying a site: openleadr's own VTN, issuing a scenario.

A scenario is JSON (docs/openadr.md):

    {"vtn_id": "MOCK_VTN", "poll_s": 1, "report_s": 10,
     "events": [{"signal_name": "LOAD_DISPATCH", "signal_type": "delta",
                 "start_offset_s": 10, "ramp_up_s": 5, "startafter_s": 0,
                 "intervals": [{"duration_s": 30, "value": -25}, {"duration_s": 30, "value": -10}],
                 "cancel_after_s": null}]}

Any VEN may register (its VEN id is its name). Each event is issued once the first VEN has
registered, starting `start_offset_s` later; `cancel_after_s` cancels it that long after it
was issued. With `report_s`, the VTN asks for the VEN's TELEMETRY_USAGE values at that
granularity. Everything the VTN sends and hears is printed.

openleadr 0.5.36's `add_event` drops the ramp-up period (it recomputes the active period from
the intervals after setting it) and has no way to give `startafter`: both are written onto the
queued event right after `add_event`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from openleadr import OpenADRServer, utils

from gateway.openadr.xml import harden_parser

EVENT_FIELDS = {
    "signal_name",
    "signal_type",
    "start_offset_s",
    "ramp_up_s",
    "startafter_s",
    "intervals",
    "cancel_after_s",
}


DEFAULT_SCENARIO: dict[str, Any] = {
    "vtn_id": "MOCK_VTN",
    "poll_s": 1,
    "report_s": 10,
    "events": [
        {
            "signal_name": "LOAD_DISPATCH",
            "signal_type": "delta",
            "start_offset_s": 10,
            "intervals": [{"duration_s": 60, "value": -25}],
        }
    ],
}


def read_scenario(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    check_scenario(doc)
    return dict(doc)


def check_scenario(doc: Any) -> None:
    """Refuse a scenario that cannot be issued, naming the problem."""
    if not isinstance(doc, dict) or not isinstance(doc.get("events"), list) or not doc["events"]:
        raise ValueError("a scenario needs a non-empty 'events' list")
    unknown = set(doc) - {"vtn_id", "poll_s", "report_s", "events"}
    if unknown:
        raise ValueError(f"scenario: unknown field(s) {sorted(unknown)}")
    for i, event in enumerate(doc["events"]):
        where = f"events[{i}]"
        if not isinstance(event, dict):
            raise ValueError(f"{where} must be an object")
        if set(event) - EVENT_FIELDS:
            raise ValueError(f"{where}: unknown field(s) {sorted(set(event) - EVENT_FIELDS)}")
        for name in ("signal_name", "signal_type", "intervals"):
            if name not in event:
                raise ValueError(f"{where}: missing '{name}'")
        if not event["intervals"] or not all(
            isinstance(iv, dict) and iv.get("duration_s", 0) > 0 and "value" in iv
            for iv in event["intervals"]
        ):
            raise ValueError(f"{where}: intervals need a positive 'duration_s' and a 'value'")


class MockVtn:
    """openleadr's VTN on its own thread and event loop, issuing a scenario."""

    def __init__(
        self,
        scenario: dict[str, Any],
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        say: Callable[[str], None] = print,
    ) -> None:
        check_scenario(scenario)
        harden_parser()  # the VTN side parses VEN messages with openleadr's parser too
        self.scenario = scenario
        self.say = say
        self.loop = asyncio.new_event_loop()
        self.server = OpenADRServer(
            vtn_id=scenario.get("vtn_id", "MOCK_VTN"),
            http_host=host,
            http_port=port,
            requested_poll_freq=timedelta(seconds=float(scenario.get("poll_s", 1))),
            show_fingerprint=False,
            ven_lookup=self._lookup,
        )
        self.registered: dict[str, str] = {}  #: VEN id -> registration id
        self.server.add_handler("on_create_party_registration", self._register)
        if scenario.get("report_s"):
            self.server.add_handler("on_register_report", self._register_report)
        self.url = f"http://{host}:{port}/OpenADR2/Simple/2.0b"
        self.issued: list[dict[str, Any]] = []  #: {"event_id", "start", "end", "answer"}
        self._thread = threading.Thread(target=self._run, name="mock-vtn", daemon=True)
        self._ven: str | None = None

    async def _register(self, registration_info: dict[str, Any]) -> tuple[str, str]:
        ven_id = str(registration_info.get("ven_name", "ven"))
        self.registered[ven_id] = f"reg-{ven_id}"
        self.say(f"VTN: registered VEN '{ven_id}'")
        if self._ven is None:
            self._ven = ven_id
            self.loop.call_later(0.5, self._issue_all)
        return ven_id, self.registered[ven_id]

    def _lookup(self, ven_id: str) -> dict[str, str]:
        """A VEN this VTN does not know is asked to register again (oadrRequestReregistration)."""
        known = self.registered.get(ven_id)
        return {"ven_id": ven_id, "registration_id": known} if known else {}

    async def _register_report(
        self,
        ven_id: str,
        resource_id: str,
        measurement: str,
        unit: str,
        scale: str,
        min_sampling_interval: timedelta,
        max_sampling_interval: timedelta,
    ) -> tuple[Callable[[list[tuple[datetime, float]]], None], timedelta]:
        """Ask for every value the VEN offers, every `report_s` seconds, and print it."""
        unit_name = f"{'' if scale in (None, 'none') else scale}{unit or ''}"

        def received(values: list[tuple[datetime, float]]) -> None:
            for when, value in values:
                at = f"{when:%H:%M:%S}"
                self.say(
                    f"VTN: report from '{ven_id}': {resource_id} = {value} {unit_name} at {at}"
                )

        wanted = timedelta(seconds=float(self.scenario["report_s"]))
        return received, min(max(wanted, min_sampling_interval), max_sampling_interval)

    def _issue_all(self) -> None:
        assert self._ven is not None
        for spec in self.scenario["events"]:
            self._issue(self._ven, spec)

    def issue(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Issue one more event to the registered VEN now, from any thread; its record."""
        check_scenario({"events": [spec]})
        if self._ven is None:
            raise RuntimeError("no VEN has registered yet")
        ven_id = self._ven
        return asyncio.run_coroutine_threadsafe(self._issue_async(ven_id, spec), self.loop).result(
            10
        )

    async def _issue_async(self, ven_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self._issue(ven_id, spec)

    def _issue(self, ven_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        start = datetime.now(UTC) + timedelta(seconds=float(spec.get("start_offset_s", 0)))
        intervals, cursor = [], start
        for iv in spec["intervals"]:
            length = timedelta(seconds=float(iv["duration_s"]))
            intervals.append(
                {"dtstart": cursor, "duration": length, "signal_payload": float(iv["value"])}
            )
            cursor += length
        record: dict[str, Any] = {
            "start": start,
            "end": cursor,
            "answer": None,
            "signal": f"{spec['signal_name']}/{spec['signal_type']}",
        }

        def answered(ven_id: str, event_id: str, opt_type: str) -> None:
            record["answer"] = opt_type
            self.say(f"VTN: VEN '{ven_id}' answered {opt_type} to {event_id}")

        event_id = self.server.add_event(
            ven_id=ven_id,
            signal_name=spec["signal_name"],
            signal_type=spec["signal_type"],
            intervals=intervals,
            callback=answered,
        )
        record["event_id"] = event_id
        self._patch(
            ven_id, event_id, float(spec.get("ramp_up_s", 0)), float(spec.get("startafter_s", 0))
        )
        self.issued.append(record)
        self.say(
            f"VTN: sent {record['signal']} event {event_id} from {start:%H:%M:%S} "
            f"to {cursor:%H:%M:%S}: {[iv['value'] for iv in spec['intervals']]}"
        )
        if spec.get("cancel_after_s") is not None:
            self.loop.call_later(float(spec["cancel_after_s"]), self._cancel, ven_id, event_id)
        return record

    def _patch(self, ven_id: str, event_id: str, ramp_up_s: float, startafter_s: float) -> None:
        """Put back the ramp-up and add the startafter that openleadr's add_event leaves out."""
        event = utils.find_by(self.server.events[ven_id], "event_descriptor.event_id", event_id)
        period = utils.getmember(event, "active_period")
        if ramp_up_s:
            utils.setmember(period, "ramp_up_period", timedelta(seconds=ramp_up_s))
        if startafter_s:
            # openleadr's template writes tolerance.startafter inside <tolerate>.
            utils.setmember(period, "tolerance", {"startafter": timedelta(seconds=startafter_s)})

    def _cancel(self, ven_id: str, event_id: str) -> None:
        self.server.cancel_event(ven_id, event_id)
        self.say(f"VTN: cancelled event {event_id}")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        with contextlib.redirect_stdout(io.StringIO()):  # openleadr's banner; we say the URL
            self.loop.run_until_complete(self.server.run())
        self.loop.run_forever()

    def start(self) -> MockVtn:
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
