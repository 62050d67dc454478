"""Example payloads from the OpenADR 3.1 User Guide, as test fixtures.

Source: grid-coordination/openadr3-specification, `3.1.1/User_Guide.md` ("OpenADR 3.1.0
User Guide", revision 3.1.0, 08/07/2025), commit 74fab56c9c5f2e7fddab4e8616523cf9d783ff14.
Each fixture is one example's JSON body, named by its example number; only the examples the
tests use are written down. The User Guide shows request bodies (what business logic POSTs);
the VTN adds `id`, `objectType` and the timestamps, so `as_read` adds those as a VTN would.
"""

from __future__ import annotations

import copy
from typing import Any

#: Example 7.2-3: Create Minimal event (a PRICE: not acted on).
MINIMAL_PRICE_EVENT = {
    "eventName": "simplePriceEvent",
    "programID": "0",
    "intervalPeriod": {"start": "2023-02-10T00:00:00.000Z", "duration": "PT1H"},
    "intervals": [{"id": 0, "payloads": [{"type": "PRICE", "values": [0.17]}]}],
}

#: Example 7.4-1: Create event with variable intervals (the second one's own duration).
VARIABLE_INTERVALS_EVENT = {
    "eventName": "variableIntervalsEvent",
    "programID": "44",
    "intervalPeriod": {"start": "2023-02-10T00:00:00.000Z", "duration": "PT1H"},
    "intervals": [
        {"id": 0, "payloads": [{"type": "PRICE", "values": [0.17]}]},
        {
            "id": 1,
            "intervalPeriod": {"duration": "PT2H"},
            "payloads": [{"type": "PRICE", "values": [0.22]}],
        },
    ],
}

#: Example 8.2-1: Create Simple event (SIMPLE level 1 for 4 hours).
SIMPLE_EVENT = {
    "eventName": "simpleEvent",
    "programID": "44",
    "intervalPeriod": {"start": "2025-03-14T00:00:00.000Z", "duration": "PT4H"},
    "payloadDescriptors": [{"payloadType": "SIMPLE"}],
    "intervals": [{"id": 0, "payloads": [{"type": "SIMPLE", "values": [1]}]}],
}

#: Example 8.5-1: Create load control event (DISPATCH_SETPOINT 0 kW for 4 hours).
LOAD_CONTROL_EVENT = {
    "eventName": "loadControlEvent",
    "programID": "44",
    "intervalPeriod": {"start": "2025-03-14T00:00:00.000Z", "duration": "PT4H"},
    "payloadDescriptors": [{"payloadType": "DISPATCH_SETPOINT", "units": "KW"}],
    "intervals": [{"id": 0, "payloads": [{"type": "DISPATCH_SETPOINT", "values": [0]}]}],
}

#: Example 8.9.3-2: Create setpoint event (CONTROL_SETPOINT -0.15 kW, open-ended).
SETPOINT_EVENT = {
    "eventName": "setpoint_Event",
    "programID": "44",
    "intervalPeriod": {"start": "2023-02-10T00:00:00.000Z", "duration": "P9999Y"},
    "payloadDescriptors": [{"payloadType": "CONTROL_SETPOINT", "units": "KW"}],
    "intervals": [{"id": 0, "payloads": [{"type": "CONTROL_SETPOINT", "values": [-0.15]}]}],
}

#: Example 8.10.1-1: Create capacity limit event (import limits 10 then 8 kW, 30 min each;
#: export limits, which flexgate does not act on; report descriptors, abridged to one).
CAPACITY_LIMIT_EVENT = {
    "eventName": "capacity_limit_Event",
    "programID": "44",
    "intervalPeriod": {"start": "2023-02-10T00:00:00.000Z", "duration": "PT30M"},
    "reportDescriptors": [
        {
            "payloadType": "READING",
            "readingType": "DIRECT_READ",
            "units": "KW",
            "startInterval": -1,
            "numIntervals": -1,
            "historical": True,
            "frequency": -1,
            "repeat": 1,
        }
    ],
    "payloadDescriptors": [
        {"payloadType": "IMPORT_CAPACITY_LIMIT", "units": "KW"},
        {"payloadType": "EXPORT_CAPACITY_LIMIT", "units": "KW"},
    ],
    "intervals": [
        {
            "id": 0,
            "payloads": [
                {"type": "IMPORT_CAPACITY_LIMIT", "values": [10.0]},
                {"type": "EXPORT_CAPACITY_LIMIT", "values": [4.0]},
            ],
        },
        {
            "id": 1,
            "payloads": [
                {"type": "IMPORT_CAPACITY_LIMIT", "values": [8.0]},
                {"type": "EXPORT_CAPACITY_LIMIT", "values": [6.0]},
            ],
        },
    ],
}

#: Example 8.10.2-4: Create capacity reservation event (targeted at "VEN-99").
CAPACITY_RESERVATION_EVENT = {
    "eventName": "capacity_reservation_Event",
    "programID": "44",
    "intervalPeriod": {"start": "0001-01-01", "duration": "PT0H"},
    "reportDescriptors": [{"payloadType": "CAPACITY_RESERVATION"}],
    "payloadDescriptors": [
        {"payloadType": "CAPACITY_RESERVATION", "units": "KW"},
        {"payloadType": "CAPACITY_RESERVATION_FEE", "units": "USD"},
    ],
    "intervals": [
        {
            "id": 0,
            "intervalPeriod": {"start": "0001-01-01", "duration": "PT0H"},
            "payloads": [
                {"type": "CAPACITY_RESERVATION", "values": [242]},
                {"type": "CAPACITY_RESERVATION_FEE", "values": [0.11]},
            ],
        }
    ],
    "targets": ["VEN-99"],
}

#: Example 7.7-2: Create aggregated report (what a VEN sends).
AGGREGATED_REPORT = {
    "reportName": "aggregatedReport",
    "eventID": "1",
    "clientName": "myClient",
    "resources": [
        {
            "resourceName": "AGGREGATED_REPORT",
            "intervals": [{"id": 0, "payloads": [{"type": "USAGE", "values": [0.012]}]}],
        }
    ],
}

#: Example 7.2-1: Create Minimal program.
MINIMAL_PROGRAM = {"programName": "minimalProgram"}


def as_read(body: dict[str, Any], event_id: str = "1", stamp: str = "2023-02-09T12:00:00Z"):
    """The event as a VTN hands it out: with its id, objectType and timestamps."""
    out = copy.deepcopy(body)
    out.update(id=event_id, objectType="EVENT", createdDateTime=stamp, modificationDateTime=stamp)
    return out
