"""OpenADR 3.1 reports the VEN sends, built from the site as `GET /v1/site` shows it.

- `interval_report`: at the end of an event interval, per reportDescriptor the event asked
  for, two resources: FACILITY (at the meter, or the estimate) and GPUS (measured by the
  agents). DEMAND is the power read at the interval's end [KW]; USAGE that power over the
  interval [KWH]; BASELINE the uncapped power [KW]; DELTA_USAGE the change from the baseline,
  negative when the site sheds [KW]. Under the program's rule (`FLEXGATE_REPORT_BASELINE`,
  `programbaseline`), FACILITY's figures are the event's settlement over the interval instead:
  DEMAND the metered mean [KW], USAGE its energy [KWH], BASELINE the rule's [KW], DELTA_USAGE
  the metered less the baseline [KW]; each payload in an interval of its own with a
  DATA_QUALITY (`ESTIMATED` where the meter history was, else `OK`), and a figure the rule or
  the history cannot give left out (and logged by the reporter).
- `refusal_report`: an event not acted on, or refused: OPERATING_STATE `RUNNING_OPTED_OUT`
  for the AGGREGATED_REPORT resource, with the reason in the reportName (OpenADR 3 has no
  opt-out message).

Every report is a `Report` of the 3.1 models, so a shape the specification does not allow
fails here, before it is sent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.openadr.oadr31 import Event, Report, ReportDescriptor
from gateway.openadr.programbaseline import Figures

#: The report payload types the VEN fills, and their units.
REPORTED = {"DEMAND": "KW", "USAGE": "KWH", "BASELINE": "KW", "DELTA_USAGE": "KW"}
#: Each report resource and the `GET /v1/site` figures it reads: (now, baseline) [kW].
RESOURCES = {
    "FACILITY": ("facility_power_kw", "baseline_facility_kw"),
    "GPUS": ("gpu_power_kw", "baseline_gpu_kw"),
}
NAME_CHARS = 128


def interval_report(
    event: Event,
    client_name: str,
    asked: list[ReportDescriptor],
    interval_id: int,
    begin: datetime,
    end: datetime,
    site: dict[str, Any],
    settled: Figures | None = None,
) -> dict[str, Any]:
    """The interval's report; with `settled` (the program's rule), FACILITY's figures are the
    settlement's."""
    types = list(dict.fromkeys(d.payload_type for d in asked if d.payload_type in REPORTED))
    period = {"start": begin.isoformat(), "duration": _iso(end - begin)}
    resources = []
    for name, keys in RESOURCES.items():
        if name == "FACILITY" and settled is not None:
            intervals = _settled_intervals(types, interval_id, period, settled)
        else:
            intervals = [_site_interval(types, interval_id, keys, site, end - begin)]
        if intervals:
            resources.append(
                {"resourceName": name, "intervalPeriod": period, "intervals": intervals}
            )
    report = {
        "eventID": event.id,
        "clientName": client_name,
        "reportName": f"flexgate {event.id} interval {interval_id}",
        "payloadDescriptors": [
            {
                "objectType": "REPORT_PAYLOAD_DESCRIPTOR",  # required by the specification
                "payloadType": t,
                "readingType": "DIRECT_READ",
                "units": REPORTED[t],
            }
            for t in types
        ],
        "resources": resources,
    }
    return Report.model_validate(report).wire()


def _site_interval(
    types: list[str], interval_id: int, keys: tuple[str, str], site: dict[str, Any], span: Any
) -> dict[str, Any]:
    """One interval of the site as `GET /v1/site` shows it at the interval's end."""
    now_kw, base_kw = float(site[keys[0]]), float(site[keys[1]])
    value = {
        "DEMAND": max(now_kw, 0.0),
        "USAGE": max(now_kw, 0.0) * span.total_seconds() / 3600.0,
        "BASELINE": base_kw,
        "DELTA_USAGE": now_kw - base_kw,
    }
    return {
        "id": interval_id,
        "payloads": [{"type": t, "values": [round(value[t], 3)]} for t in types],
    }


def _settled_intervals(
    types: list[str], interval_id: int, period: dict[str, str], settled: Figures
) -> list[dict[str, Any]]:
    """One interval per payload type the settlement gives, each with its DATA_QUALITY (the
    User Guide's way, 7.8, to qualify one payload of several); a type it cannot give is left
    out."""
    metered = settled.metered_kw
    value = {
        "DEMAND": metered,
        "USAGE": None if metered is None else metered * settled.hours,
        "BASELINE": settled.baseline_kw,
        "DELTA_USAGE": settled.delta_kw,
    }
    measured = "ESTIMATED" if settled.estimated else "OK"
    quality = {"DEMAND": measured, "USAGE": measured, "BASELINE": "OK", "DELTA_USAGE": measured}
    return [
        {
            "id": interval_id,
            "intervalPeriod": period,
            "payloads": [
                {"type": t, "values": [round(v, 3)]},
                {"type": "DATA_QUALITY", "values": [quality[t]]},
            ],
        }
        for t in types
        if (v := value[t]) is not None
    ]


def refusal_report(event_id: str, client_name: str, reason: str) -> dict[str, Any] | None:
    """None when the event's id is not one a report can name."""
    report = {
        "eventID": event_id,
        "clientName": client_name,
        "reportName": f"not acted on: {reason}"[:NAME_CHARS],
        "resources": [
            {
                "resourceName": "AGGREGATED_REPORT",
                "intervals": [
                    {
                        "id": 0,
                        "payloads": [{"type": "OPERATING_STATE", "values": ["RUNNING_OPTED_OUT"]}],
                    }
                ],
            }
        ],
    }
    try:
        return Report.model_validate(report).wire()
    except ValueError:
        return None


def _iso(span: Any) -> str:
    return f"PT{span.total_seconds():g}S"
