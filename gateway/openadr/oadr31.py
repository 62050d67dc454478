"""OpenADR 3.1 objects as pydantic models: the one place the 3.1 wire shapes are written down.

Derived from the OpenADR 3.1.0 specification published by the OpenADR Alliance in the
grid-coordination/openadr3-specification repository (commit
74fab56c9c5f2e7fddab4e8616523cf9d783ff14): the object definitions of the 3.1.0 OpenAPI
document as the Definition and User Guide (3.1.1 folder) describe them, the enumerations
(`3.1.0/enumerations/*.schema.yaml`: event interval payloads, units; `3.1.1/enumerations/
report-payloads.schema.yaml`) and the change log (`3.1.0/changeLog.md`: targets are plain
strings (issue 316), `programID` left the report (253), resources are top-level objects (306),
`GET /auth/server` names the token service (226)). Both sides use these models: the 3.1 VEN
(`ven31`) reads what the VTN sends through them, and the mock VTN (`flexgate.lab.mockvtn31`)
validates what the VEN sends with the same ones, so neither can drift from the specification
without a test failing.

Field names are the specification's camelCase (`by_alias`); unknown fields are ignored, as the
OpenAPI document allows them. What the specification leaves open is written where it is
decided:

- an interval's `intervalPeriod` may omit `start` (the User Guide's Example 7.4-1 does: the
  interval then follows the one before it);
- `intervalPeriod.start` "0001-01-01" means "do it now" (User Guide 7.3);
- a subscription's and a notification's operations are the CRUD names CREATE, READ, UPDATE,
  DELETE (the change log's issue 209, "change notification operations from http verbs to
  CRUD", and the notifier document `doc/OpenADR3 Object Operation Notifications via
  Additional Protocols.md`); the HTTP verbs of 3.0 (POST, GET, PUT) are read too, as the
  CRUD operation they name (`crud`), since some 3.1 implementations still send them.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

log = logging.getLogger("flexgate.ven31")

#: "The beginning of time": an event or interval that starts now (User Guide 7.3).
DO_IT_NOW = datetime(1, 1, 1, tzinfo=UTC)
#: P9999Y: "infinity" (User Guide 7.3); any duration this long or longer is open-ended.
INFINITE = timedelta(days=365 * 9000)

ObjectType = Literal["PROGRAM", "EVENT", "REPORT", "SUBSCRIPTION", "VEN", "RESOURCE"]
Operation = Literal["CREATE", "READ", "UPDATE", "DELETE", "POST", "GET", "PUT"]
_CRUD = {"POST": "CREATE", "GET": "READ", "PUT": "UPDATE"}


def crud(operation: str) -> str:
    """The CRUD name of an operation (3.0's HTTP verbs read as 3.1's names)."""
    return _CRUD.get(operation, operation)


#: The units of an eventPayloadDescriptor (3.1.0/enumerations/units.schema.yaml).
Unit = Literal[
    "KWH",
    "THERMS",
    "GHG",
    "VOLTS",
    "AMPS",
    "CELSIUS",
    "FAHRENHEIT",
    "PERCENT",
    "KW",
    "KVAH",
    "KVARH",
    "KVA",
    "KVAR",
]


def _when(value: Any) -> Any:
    """A dateTime; a bare date (as "0001-01-01" in the User Guide) is midnight UTC, and a
    time without a zone is UTC (RFC 3339 asks for one; the User Guide's examples omit it, and
    the Alliance's reference VTN stamps `YYYY-MM-DD HH:MM:SS`), said once in the log."""
    if isinstance(value, str):
        text = value.strip()
        if len(text) == 10:
            text += "T00:00:00"
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if parsed.tzinfo:
            return parsed
        if len(value.strip()) > 10:
            _say_zoneless(value)
        return parsed.replace(tzinfo=UTC)
    return value


_zoneless_said = False


def _say_zoneless(value: str) -> None:
    global _zoneless_said
    if not _zoneless_said:
        _zoneless_said = True
        log.warning(
            "a VTN timestamp without a time zone (%r): read as UTC (RFC 3339 asks for a zone); "
            "said once",
            value,
        )


def _duration(value: Any) -> Any:
    """An ISO 8601 duration; years are 365 days (P9999Y is "infinity"), months 30."""
    if not isinstance(value, str):
        return value
    text = value.strip().upper()
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    if not text.startswith("P") or len(text) < 2:
        raise ValueError(f"{value!r} is not an ISO 8601 duration (e.g. PT1H)")
    date_part, _, time_part = text[1:].partition("T")
    total = 0.0
    for part, units in (
        (date_part, {"Y": 365 * 86400, "M": 30 * 86400, "W": 7 * 86400, "D": 86400}),
        (time_part, {"H": 3600, "M": 60, "S": 1}),
    ):
        number = ""
        for char in part:
            if char.isdigit() or char == ".":
                number += char
            elif char in units and number:
                total += float(number) * units[char]
                number = ""
            else:
                raise ValueError(f"{value!r} is not an ISO 8601 duration (e.g. PT1H)")
        if number:
            raise ValueError(f"{value!r} is not an ISO 8601 duration (e.g. PT1H)")
    return timedelta(seconds=sign * min(total, INFINITE.total_seconds()))


DateTime = Annotated[datetime, BeforeValidator(_when)]
Duration = Annotated[timedelta, BeforeValidator(_duration)]
Name = Annotated[str, Field(min_length=1, max_length=128)]
ObjectID = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]*$")]


class Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        """The object as JSON, in the specification's names, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Point(Model):
    x: float  # both required by the specification's schema
    y: float


class ValuesMap(Model):
    """A payload: its type and values (an event interval's or a report interval's)."""

    type: Name
    values: list[float | int | StrictBool | str | Point]


class IntervalPeriod(Model):
    start: DateTime | None = None  #: required at the event level; see the module's notes
    duration: Duration | None = None
    randomize_start: Duration | None = Field(default=None, alias="randomizeStart")


class Interval(Model):
    id: int
    interval_period: IntervalPeriod | None = Field(default=None, alias="intervalPeriod")
    payloads: list[ValuesMap]


class EventPayloadDescriptor(Model):
    object_type: Literal["EVENT_PAYLOAD_DESCRIPTOR"] | None = Field(
        default=None, alias="objectType"
    )
    payload_type: Name = Field(alias="payloadType")
    units: str | None = None
    currency: str | None = None


class ReportDescriptor(Model):
    payload_type: Name = Field(alias="payloadType")
    reading_type: str | None = Field(default=None, alias="readingType")
    units: str | None = None
    targets: list[str] | None = None
    aggregate: bool = False
    start_interval: int = Field(default=-1, alias="startInterval")
    num_intervals: int = Field(default=-1, alias="numIntervals")
    historical: bool = True
    frequency: int = -1
    repeat: int = 1


class ReportPayloadDescriptor(Model):
    # Required (the schema's discriminator): the reference VTN refuses a report without it.
    object_type: Literal["REPORT_PAYLOAD_DESCRIPTOR"] = Field(alias="objectType")
    payload_type: Name = Field(alias="payloadType")
    reading_type: str | None = Field(default=None, alias="readingType")
    units: str | None = None
    accuracy: float | None = None
    confidence: int | None = Field(default=None, ge=0, le=100)


class Stamped(Model):
    """What the VTN adds to an object it stores."""

    id: ObjectID | None = None
    created_date_time: DateTime | None = Field(default=None, alias="createdDateTime")
    modification_date_time: DateTime | None = Field(default=None, alias="modificationDateTime")


class Program(Stamped):
    object_type: Literal["PROGRAM"] | None = Field(default=None, alias="objectType")
    program_name: Name = Field(alias="programName")
    interval_period: IntervalPeriod | None = Field(default=None, alias="intervalPeriod")
    program_descriptions: list[dict[str, Any]] | None = Field(
        default=None, alias="programDescriptions"
    )
    # The schema lets a program describe its reports' payloads too (anyOf).
    payload_descriptors: list[EventPayloadDescriptor | ReportPayloadDescriptor] | None = Field(
        default=None, alias="payloadDescriptors"
    )
    attributes: list[ValuesMap] | None = None
    targets: list[str] | None = None


class Event(Stamped):
    object_type: Literal["EVENT"] | None = Field(default=None, alias="objectType")
    program_id: ObjectID = Field(alias="programID")
    event_name: str | None = Field(default=None, alias="eventName")
    duration: Duration | None = None
    priority: int | None = Field(default=None, ge=0)
    targets: list[str] | None = None
    report_descriptors: list[ReportDescriptor] | None = Field(
        default=None, alias="reportDescriptors"
    )
    payload_descriptors: list[EventPayloadDescriptor] | None = Field(
        default=None, alias="payloadDescriptors"
    )
    interval_period: IntervalPeriod | None = Field(default=None, alias="intervalPeriod")
    intervals: list[Interval] = Field(default_factory=list)


class ReportResource(Model):
    resource_name: Name = Field(alias="resourceName")
    interval_period: IntervalPeriod | None = Field(default=None, alias="intervalPeriod")
    intervals: list[Interval]


class Report(Stamped):
    object_type: Literal["REPORT"] | None = Field(default=None, alias="objectType")
    event_id: ObjectID = Field(alias="eventID")
    client_name: Name = Field(alias="clientName")
    report_name: str | None = Field(default=None, alias="reportName")
    payload_descriptors: list[ReportPayloadDescriptor] | None = Field(
        default=None, alias="payloadDescriptors"
    )
    resources: list[ReportResource]


class ObjectOperation(Model):
    objects: list[ObjectType] = Field(min_length=1)
    operations: list[Operation] = Field(min_length=1)
    callback_url: Annotated[str, Field(min_length=1)] = Field(alias="callbackUrl")
    bearer_token: str | None = Field(default=None, alias="bearerToken")


class Subscription(Stamped):
    object_type: Literal["SUBSCRIPTION"] | None = Field(default=None, alias="objectType")
    client_name: Name = Field(alias="clientName")
    program_id: ObjectID | None = Field(default=None, alias="programID")
    object_operations: list[ObjectOperation] = Field(alias="objectOperations", min_length=1)
    targets: list[str] | None = None


class Ven(Stamped):
    """A ven object. A VEN creates its own with objectType VEN_VEN_REQUEST; `targets` and
    `clientID` are the VTN's (granted by its business logic)."""

    object_type: Literal["VEN", "VEN_VEN_REQUEST", "BL_VEN_REQUEST"] | None = Field(
        default=None, alias="objectType"
    )
    ven_name: Name = Field(alias="venName")
    client_id: str | None = Field(default=None, alias="clientID")
    attributes: list[ValuesMap] | None = None
    targets: list[str] | None = None


class Resource(Stamped):
    object_type: Literal["RESOURCE", "VEN_RESOURCE_REQUEST", "BL_RESOURCE_REQUEST"] | None = Field(
        default=None, alias="objectType"
    )
    resource_name: Name = Field(alias="resourceName")
    ven_id: ObjectID = Field(alias="venID")
    client_id: str | None = Field(default=None, alias="clientID")
    attributes: list[ValuesMap] | None = None
    targets: list[str] | None = None


class Notification(Model):
    """What a VTN posts to a subscription's callback URL."""

    object_type: ObjectType = Field(alias="objectType")
    operation: Operation
    object: dict[str, Any]
    targets: list[str] | None = None


class MqttAuthentication(Model):
    """How a VTN's MQTT broker authenticates a client (the notifier document's section 12):
    ANONYMOUS, OAUTH2_BEARER_TOKEN (the REST token as the password; `username` as given, or
    the client's id where it says "{clientID}"), or CERTIFICATE (mutual TLS)."""

    method: Literal["ANONYMOUS", "OAUTH2_BEARER_TOKEN", "CERTIFICATE"]
    username: str | None = None


class MqttBinding(Model):
    """The MQTT notifier binding of `GET /notifiers` (section 7.2): the broker's URIs, its
    authentication, the message serialization (JSON, the only one defined)."""

    uris: list[Annotated[str, Field(min_length=1)]] = Field(alias="URIS", min_length=1)
    authentication: MqttAuthentication
    serialization: Literal["JSON"] = "JSON"


class Notifiers(Model):
    """`GET /notifiers`: the notifier bindings a VTN offers (WEBHOOK is always true)."""

    webhook: bool = Field(default=True, alias="WEBHOOK")
    mqtt: MqttBinding | None = Field(default=None, alias="MQTT")


class Topics(Model):
    """`GET /notifiers/{binding}/topics/...`: a topic name per operation, and optionally one
    (a wildcard) for ALL of them (section 8.1)."""

    topics: dict[Literal["CREATE", "UPDATE", "DELETE", "ALL"], Annotated[str, Field(min_length=1)]]


class AuthServerInfo(Model):
    """`GET /auth/server`: where the VTN's OAuth2 token service is."""

    token_url: Annotated[str, Field(min_length=1)] = Field(alias="tokenURL")


class Problem(Model):
    """An error answer (RFC 7807), as the VTN sends one."""

    type: str = "about:blank"
    title: str | None = None
    status: int | None = None
    detail: str | None = None
    instance: str | None = None


def first_error(exc: Exception) -> str:
    """A validation error in one line: where, then what (the models' reasons)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    error = errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    message = str(error.get("msg", exc)).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
