"""The 3.1 mock VTN's objects and what it tells of their changes (`flexgate.lab.mockvtn31`).

`Vtn31State` holds the programs, events, vens, resources, subscriptions and reports, the
bearer tokens granted, and every counter and record the tests read; the business logic
creates, changes and deletes programs and events from any thread (`add_program`, `add_event`,
`update_event`, `delete_event`), and each change is posted to the webhooks subscribed to it
and, with a broker, published over MQTT to the topics it belongs to (`topics`). The HTTP side
(`flexgate.lab.vtn31api`) reads and stores through it.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from flexgate.specschema31 import load as load_schema
from gateway.clock import Clock, SystemClock
from gateway.openadr.oadr31 import Event, Model, Program, crud
from gateway.settings import LAB_VTN_CLIENT_ID, LAB_VTN_CLIENT_SECRET

LAB_CLIENT_ID, LAB_CLIENT_SECRET = LAB_VTN_CLIENT_ID, LAB_VTN_CLIENT_SECRET
#: The event issued after registration unless told otherwise: 25 kW less for 60 s, 10 s on.
DEFAULT_SHED_KW, DEFAULT_START_S, DEFAULT_DURATION_S = 25.0, 10.0, 60.0


def shed_event(
    program_id: str, shed_kw: float, start_s: float, duration_s: float, now: Any
) -> dict[str, Any]:
    """A CONTROL_SETPOINT of -shed_kw kW (the 3.1 form of 2.0b's LOAD_DISPATCH delta) over one
    interval, asking for DEMAND and DELTA_USAGE (the shed) reports at its end."""
    start = now + timedelta(seconds=start_s)
    return {
        "programID": program_id,
        "eventName": "flexgate-shed",
        "intervalPeriod": {"start": start.isoformat(), "duration": f"PT{duration_s:g}S"},
        "payloadDescriptors": [{"payloadType": "CONTROL_SETPOINT", "units": "KW"}],
        "reportDescriptors": [
            {"payloadType": "DEMAND", "readingType": "DIRECT_READ"},
            {"payloadType": "DELTA_USAGE", "readingType": "DIRECT_READ"},
        ],
        "intervals": [{"id": 0, "payloads": [{"type": "CONTROL_SETPOINT", "values": [-shed_kw]}]}],
    }


class Vtn31State:
    def __init__(
        self,
        clients: dict[str, str] | None = None,
        *,
        token_lifetime_s: float = 3600.0,
        clock: Clock | None = None,
        say: Callable[[str], None] = lambda _line: None,
        mqtt_broker: str | None = None,
        topic_root: str | None = None,
        mqtt_authentication: dict[str, str] | None = None,
        client_auth: frozenset[str] = frozenset({"body", "basic"}),
    ) -> None:
        self.clients = clients or {LAB_CLIENT_ID: LAB_CLIENT_SECRET}
        self.token_lifetime_s = token_lifetime_s
        self.clock = clock or SystemClock()
        self.say = say
        self.programs: dict[str, dict[str, Any]] = {}
        self.events: dict[str, dict[str, Any]] = {}
        self.vens: dict[str, dict[str, Any]] = {}
        self.resources: dict[str, dict[str, Any]] = {}
        self.subscriptions: dict[str, dict[str, Any]] = {}
        self.reports: list[dict[str, Any]] = []
        self.refused: list[str] = []  #: why each refused VEN message was refused
        self.delivered: list[tuple[str, int]] = []  #: (callback URL, HTTP status) per notification
        self.grants = 0  #: tokens granted
        self.rejected_tokens = 0  #: requests with an unknown or expired token
        self.down = False
        self.subscribable = True  #: False: POST /subscriptions is refused (a poll-only VTN)
        #: A status: POST /subscriptions stores the subscription, then answers this.
        self.subscription_failure: int | None = None
        self.subscription_posts = 0  #: POST /subscriptions asked for
        #: True: notifications are posted as a JSON string of the JSON (the reference VTN's).
        self.double_encoded = False
        self.one_at_a_time = False  #: True: no request served while a notification is posted
        self.delivery_s: list[float] = []  #: how long each notification took to be answered
        self._notifying = threading.Event()
        #: How a client may send its credentials to `/auth/token`: "body", "basic".
        self.client_auth = client_auth
        self.token_requests: list[str] = []  #: how each token request authenticated
        self.schema = load_schema()  #: the specification's schema, None without ../shared
        self._tokens: dict[str, tuple[str, float]] = {}  #: token -> (client, expires at)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._after_registration: Callable[[], None] | None = None
        self.mqtt_broker = mqtt_broker
        #: The broker URIs `GET /notifiers` offers (the one it publishes to, unless changed).
        self.mqtt_uris = [mqtt_broker] if mqtt_broker else []
        #: The broker's authentication as offered (the broker itself is not told).
        self.mqtt_authentication = mqtt_authentication or {"method": "ANONYMOUS"}
        #: Every topic this VTN names starts with it (by default unique to this VTN).
        self.topic_root = topic_root or f"openadr3/{uuid.uuid4().hex}"
        self.published: list[tuple[str, str]] = []  #: (topic, operation) per MQTT message
        self._mqtt = _publisher(mqtt_broker) if mqtt_broker else None

    def close(self) -> None:
        """Disconnect from the MQTT broker (nothing else to release)."""
        if self._mqtt is not None:
            self._mqtt.disconnect()
            self._mqtt.loop_stop()
            self._mqtt = None

    def topics(self, path: str) -> dict[str, str] | None:
        """The topic names of `/notifiers/mqtt/topics/{path}`, or None for no such path."""
        for pattern, base, create in _TOPICS:
            found = re.fullmatch(pattern, path)
            if found:
                where = f"{self.topic_root}/{base.format(*found.groups())}"
                ops = ["CREATE", "UPDATE", "DELETE"] if create else ["UPDATE", "DELETE"]
                names = {op: f"{where}/{op.lower()}" for op in ops}
                return {**names, "ALL": f"{where}/+"}
        return None

    def issue_after_registration(
        self,
        shed_kw: float = DEFAULT_SHED_KW,
        start_s: float = DEFAULT_START_S,
        duration_s: float = DEFAULT_DURATION_S,
    ) -> None:
        """Issue a `shed_event` (in a program of its own) once the first VEN has registered."""
        program = self.add_program({"programName": "flexgate-shed"})

        def issue() -> None:
            event = self.add_event(
                shed_event(program["id"], shed_kw, start_s, duration_s, self.clock.now())
            )
            self.say(f"VTN: issued event {event['id']}: {shed_kw:g} kW less for {duration_s:g} s")

        self._after_registration = issue

    # --- the HTTP side's (the event loop's thread) -------------------------------------------

    def grant(self, client: str) -> str:
        """A new bearer token for `client`, valid for `token_lifetime_s`."""
        issued = secrets.token_urlsafe(24)
        self._tokens[issued] = (client, self.clock.monotonic() + self.token_lifetime_s)
        self.grants += 1
        return issued

    def client_of(self, token: str) -> str | None:
        """The client a token was granted to, or None when unknown or expired."""
        granted = self._tokens.get(token)
        if granted is None or self.clock.monotonic() >= granted[1]:
            return None
        return granted[0]

    def notifying(self) -> bool:
        """A notification is being posted (what `one_at_a_time` waits out)."""
        return self._notifying.is_set()

    def registered(self) -> None:
        """A VEN created its ven object: the event to issue after registration, a second on
        (off the event loop: it notifies by HTTP)."""
        if self._after_registration is not None:
            timer = threading.Timer(1.0, self._after_registration)
            timer.daemon = True
            timer.start()
            self._after_registration = None

    def listed(
        self, objects: dict[str, dict[str, Any]], keep: Callable[[dict[str, Any]], bool]
    ) -> list[dict[str, Any]]:
        """The objects `keep` takes, in the order stored (the business logic adds from other
        threads)."""
        with self._lock:
            return [o for o in objects.values() if keep(o)]

    def add_report(self, report: dict[str, Any]) -> None:
        with self._lock:
            self.reports.append(report)

    def pop_subscription(self, subscription_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self.subscriptions.pop(subscription_id, None)

    # --- the business logic's side (any thread) --------------------------------------------

    def add_program(self, body: dict[str, Any]) -> dict[str, Any]:
        program = self.store(Program, body, "PROGRAM", self.programs)
        self._notify("PROGRAM", "CREATE", program)
        return program

    def add_event(self, body: dict[str, Any]) -> dict[str, Any]:
        """Store an event (checked against the 3.1 models) and notify the subscribers."""
        if str(body.get("programID")) not in self.programs:
            raise ValueError(f"no program {body.get('programID')!r}")
        event = self.store(Event, body, "EVENT", self.events)
        self._notify("EVENT", "CREATE", event)
        return event

    def update_event(self, event_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            known = self.events[event_id]
        body = {k: v for k, v in {**known, **changes}.items() if k not in _STAMPS}
        event = Event.model_validate(body).wire()
        event.update(
            id=event_id,
            objectType="EVENT",
            createdDateTime=known.get("createdDateTime"),
            modificationDateTime=_now(self.clock),
        )
        with self._lock:
            self.events[event_id] = event
        self._notify("EVENT", "UPDATE", event)
        return event

    def delete_event(self, event_id: str) -> None:
        with self._lock:
            event = self.events.pop(event_id)
        self._notify("EVENT", "DELETE", event)

    def store(
        self, model: type[Model], body: dict[str, Any], kind: str, into: dict[str, Any]
    ) -> dict[str, Any]:
        """`body` read with `model`, stamped with an id and times, and stored in `into`."""
        obj = model.model_validate(body).wire()
        stamp = _now(self.clock)
        with self._lock:
            obj.update(
                id=str(next(self._ids)),
                objectType=kind,
                createdDateTime=stamp,
                modificationDateTime=stamp,
            )
            into[obj["id"]] = obj
        return obj

    def _notify(self, kind: str, operation: str, obj: dict[str, Any]) -> None:
        """Post the change to every callback subscribed to it, now, from the caller's thread."""
        with self._lock:
            hooks = [
                op
                for sub in self.subscriptions.values()
                for op in sub["objectOperations"]
                if kind in op["objects"] and operation in {crud(o) for o in op["operations"]}
            ]
        note = {"objectType": kind, "operation": operation, "object": obj}
        self._publish(kind, operation, obj, note)
        body = json.dumps(note) if self.double_encoded else note
        if self.one_at_a_time:
            self._notifying.set()
        try:
            for hook in hooks:
                self._post_notification(hook, body, kind, operation)
        finally:
            self._notifying.clear()

    def _post_notification(self, hook: dict[str, Any], body: Any, kind: str, op: str) -> None:
        headers = {"Authorization": f"Bearer {hook.get('bearerToken') or ''}"}
        began = time.monotonic()
        try:
            answer = httpx.post(hook["callbackUrl"], json=body, headers=headers, timeout=10)
            status = answer.status_code
        except httpx.HTTPError:
            status = 0
        self.delivery_s.append(time.monotonic() - began)
        self.delivered.append((hook["callbackUrl"], status))
        self.say(f"VTN: notified {hook['callbackUrl']} of {kind} {op}: {status}")

    def _publish(self, kind: str, operation: str, obj: dict[str, Any], note: Any) -> None:
        """The notification on every MQTT topic the change belongs to."""
        if self._mqtt is None or kind not in ("EVENT", "PROGRAM"):
            return
        with self._lock:
            vens = list(self.vens)
        if kind == "EVENT":
            paths = ["events", f"programs/{obj.get('programID')}/events"]
            paths += [f"vens/{v}/events" for v in vens]
        else:
            paths = ["programs", f"programs/{obj.get('id')}", *[f"vens/{v}/programs" for v in vens]]
        body = json.dumps(note)
        for path in paths:
            topic = (self.topics(path) or {}).get(operation)
            if topic is None:  # no CREATE topic for one program
                continue
            self._mqtt.publish(topic, body, qos=1)
            self.published.append((topic, operation))
        self.say(f"VTN: published {kind} {operation} over MQTT")


_STAMPS = ("id", "objectType", "createdDateTime", "modificationDateTime")
_ID = r"([a-zA-Z0-9_-]+)"
#: The topic endpoints (`/notifiers/mqtt/topics/` + pattern): the topics' base, and whether it
#: has a CREATE topic (one object's topics have not: it exists already).
_TOPICS = (
    ("programs", "programs", True),
    (f"programs/{_ID}", "programs/{0}", False),
    ("events", "events", True),
    (f"programs/{_ID}/events", "events/programs/{0}", True),
    ("reports", "reports", True),
    (f"programs/{_ID}/reports", "reports/programs/{0}", True),
    ("subscriptions", "subscriptions", True),
    (f"programs/{_ID}/subscriptions", "subscriptions/programs/{0}", True),
    ("vens", "vens", True),
    (f"vens/{_ID}", "vens/{0}", False),
    ("resources", "resources", True),
    (f"vens/{_ID}/resources", "resources/vens/{0}", True),
    (f"vens/{_ID}/events", "events/vens/{0}", True),
    (f"vens/{_ID}/programs", "programs/vens/{0}", True),
)


def _publisher(broker: str) -> paho.Client:
    """A connected MQTT client publishing from its own thread (plain or TLS)."""
    parts = urlsplit(broker)
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise ValueError(f"{broker!r} is not an mqtt:// or mqtts:// broker URI")
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"mockvtn-{uuid.uuid4().hex[:8]}")
    if parts.scheme == "mqtts":
        client.tls_set()
    connected = threading.Event()
    client.on_connect = lambda *_args: connected.set()
    client.connect(parts.hostname, parts.port or (8883 if parts.scheme == "mqtts" else 1883))
    client.loop_start()
    if not connected.wait(10.0):
        client.loop_stop()
        raise ConnectionError(f"the MQTT broker {broker} did not accept the connection")
    return client


def _now(clock: Clock) -> str:
    return clock.now().astimezone(UTC).isoformat().replace("+00:00", "Z")
