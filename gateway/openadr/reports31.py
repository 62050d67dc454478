"""OpenADR 3.1 reports the VEN sends, built from the site as `GET /v1/site` shows it.

- `interval_report`: at the end of an event interval, per reportDescriptor the event asked
  for, two resources: FACILITY (at the meter, or the estimate) and GPUS (measured by the
  agents). DEMAND is the power read at the interval's end [KW]; USAGE that power over the
  interval [KWH]; BASELINE the uncapped power [KW]; DELTA_USAGE the change from the baseline,
  negative when the site sheds [KW].
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
) -> dict[str, Any]:
    hours = (end - begin).total_seconds() / 3600.0
    types = list(dict.fromkeys(d.payload_type for d in asked if d.payload_type in REPORTED))
    resources = []
    for name, (now_key, base_key) in RESOURCES.items():
        now_kw, base_kw = float(site[now_key]), float(site[base_key])
        value = {
            "DEMAND": max(now_kw, 0.0),
            "USAGE": max(now_kw, 0.0) * hours,
            "BASELINE": base_kw,
            "DELTA_USAGE": now_kw - base_kw,
        }
        resources.append(
            {
                "resourceName": name,
                "intervalPeriod": {"start": begin.isoformat(), "duration": _iso(end - begin)},
                "intervals": [
                    {
                        "id": interval_id,
                        "payloads": [{"type": t, "values": [round(value[t], 3)]} for t in types],
                    }
                ],
            }
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
