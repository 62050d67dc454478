"""An OpenADR 3.1 mock VTN for the lab and the tests: a FastAPI app on a real uvicorn server.

- OAuth2 client credentials: `GET /auth/server` names `POST /auth/token`, which grants a
  bearer token (lifetime `token_lifetime_s`, on the clock given) to the clients it knows
  (HTTP Basic or form fields); every other path needs a token it granted and has not expired.
- programs, events (read by VENs; created, changed and deleted by the business logic: the
  Python methods `add_program`, `add_event`, `update_event`, `delete_event`), vens and
  resources (a VEN creates its own), subscriptions, with webhook delivery of each change to
  the callbacks that asked for it (the subscription's bearer token on each), and reports,
  stored.
- **MQTT** (with `mqtt_broker`, e.g. mqtt://127.0.0.1:1883): `GET /notifiers` offers the MQTT
  binding (that broker, ANONYMOUS unless `mqtt_authentication` says otherwise; the broker
  itself checks nothing) beside WEBHOOK, the `/notifiers/mqtt/topics/...` endpoints name the
  topics (every one the notifier document lists, all under `topic_root`, unique per VTN by
  default so VTNs can share a broker), and every PROGRAM and EVENT change is published
  (QoS 1, not retained) to each topic it belongs to: all objects of its kind, its program's,
  and each VEN's (the mock has no object privacy). The message is the webhook's notification.
- **Validation**: every object a VEN sends is checked against the specification's own schema
  (`openadr3.yaml`, `flexgate.specschema31`) where `../shared` is beside the clone, and read
  with the 3.1 models (`gateway.openadr.oadr31`); one either refuses is answered with a 400
  problem naming the field, recorded in `refused`. The token request is checked too
  (`clientCredentialRequest` when the credentials are in the form body; `client_auth` names
  the ways this VTN accepts, and one request using both is refused, RFC 6749 2.3). Every
  object this VTN sends is built through the models.
- **Subscriptions** as the Definition asks: the callback URL must answer the echo challenge
  (`GET <callbackUrl>?echo=<value>`: 200 and the value in the body) before one is stored.
  `subscription_failure` (a status) makes it behave like the Alliance's reference VTN when
  its echo test fails: the subscription is stored, and the VEN is answered that status.
  `double_encoded` posts notifications as the reference VTN does (a JSON string of JSON), and
  `one_at_a_time` serves no request while a notification is being posted (as the reference
  VTN, which posts them synchronously from the request that caused them).

Every VEN reads every event (no object privacy): the VEN's own target check decides. The
VTN can be taken down and brought back (`down`): it then answers 503 to everything. For the
lab and `flexgate mock-vtn --openadr 3.1`, `issue_after_registration` issues an event (by
default `shed_event`) one second after the first VEN creates its ven object, by then subscribed.
"""

from __future__ import annotations

import asyncio
import base64
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
from urllib.parse import parse_qs, urlsplit

import httpx
import paho.mqtt.client as paho
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import ValidationError

from flexgate.specschema31 import load as load_schema
from gateway.clock import Clock, SystemClock
from gateway.openadr.oadr31 import (
    Event,
    Model,
    Program,
    Report,
    Resource,
    Subscription,
    Ven,
    crud,
    first_error,
)
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


class MockVtn31:
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
        self.app = self._build()

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

    # --- the business logic's side (any thread) --------------------------------------------

    def add_program(self, body: dict[str, Any]) -> dict[str, Any]:
        program = self._store(Program, body, "PROGRAM", self.programs)
        self._notify("PROGRAM", "CREATE", program)
        return program

    def add_event(self, body: dict[str, Any]) -> dict[str, Any]:
        """Store an event (checked against the 3.1 models) and notify the subscribers."""
        if str(body.get("programID")) not in self.programs:
            raise ValueError(f"no program {body.get('programID')!r}")
        event = self._store(Event, body, "EVENT", self.events)
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

    def _store(
        self, model: type[Model], body: dict[str, Any], kind: str, into: dict[str, Any]
    ) -> dict[str, Any]:
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

    # --- the REST API ----------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI(title="flexgate mock VTN (OpenADR 3.1)")

        @app.middleware("http")
        async def gate(request: Request, call_next: Any) -> Any:
            if self.down:
                return _problem(503, "the VTN is down")
            while self._notifying.is_set():  # one_at_a_time: busy posting a notification
                await asyncio.sleep(0.01)
            path = request.url.path
            if path in ("/auth/server", "/auth/token"):
                return await call_next(request)
            token = request.headers.get("authorization", "").removeprefix("Bearer ")
            granted = self._tokens.get(token)
            if granted is None or self.clock.monotonic() >= granted[1]:
                self.rejected_tokens += 1
                return _problem(401, "no valid bearer token (unknown or expired)")
            request.state.client = granted[0]
            return await call_next(request)

        self._serve_auth(app)
        self._serve_notifiers(app)
        self._serve_programs_and_events(app)
        self._serve_vens(app)
        self._serve_subscriptions(app)
        self._serve_reports(app)
        return app

    def _serve_auth(self, app: FastAPI) -> None:
        """The OAuth2 token endpoint and its discovery (RFC 6749 client credentials)."""

        @app.get("/auth/server")
        async def auth_server(request: Request) -> dict[str, str]:
            return {"tokenURL": f"{str(request.base_url).rstrip('/')}/auth/token"}

        @app.post("/auth/token")
        async def token(request: Request) -> JSONResponse:
            # The form by hand: FastAPI's form parsing needs python-multipart.
            form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
            basic = request.headers.get("authorization", "").startswith("Basic ")
            in_body = "client_id" in form or "client_secret" in form
            how = "both" if basic and in_body else "basic" if basic else "body"
            self.token_requests.append(how)
            if how == "both":  # RFC 6749 2.3: "MUST NOT use more than one authentication method"
                return self._auth_refusal("invalid_request", "credentials sent two ways")
            if how not in self.client_auth:
                return self._auth_refusal("invalid_request", f"credentials by {how} refused")
            if how == "body" and (why := self._schema_problem("clientCredentialRequest", form)):
                return self._auth_refusal("invalid_request", why)
            client, secret = _basic(request.headers.get("authorization", ""))
            client = client or str(form.get("client_id", ""))
            secret = secret or str(form.get("client_secret", ""))
            if form.get("grant_type") != "client_credentials":
                return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
            known = self.clients.get(client)
            if known is None or not secrets.compare_digest(known, secret):
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            issued = secrets.token_urlsafe(24)
            self._tokens[issued] = (client, self.clock.monotonic() + self.token_lifetime_s)
            self.grants += 1
            return JSONResponse(
                {
                    "access_token": issued,
                    "token_type": "Bearer",
                    "expires_in": self.token_lifetime_s,
                }
            )

    def _serve_notifiers(self, app: FastAPI) -> None:
        """The notifiers offered (webhooks; MQTT with a broker) and their topics."""

        @app.get("/notifiers")
        async def notifiers() -> dict[str, Any]:
            offered: dict[str, Any] = {"WEBHOOK": True}
            if self.mqtt_uris:
                offered["MQTT"] = {
                    "URIS": self.mqtt_uris,
                    "authentication": self.mqtt_authentication,
                    "serialization": "JSON",
                }
            return offered

        @app.get("/notifiers/{binding}/topics/{path:path}")
        async def topics(binding: str, path: str) -> JSONResponse:
            if binding.upper() != "MQTT" or not self.mqtt_broker:
                return _problem(404, f"no notifier binding {binding!r} with topics")
            names = self.topics(path.strip("/"))
            if names is None:
                return _problem(404, f"no topics for {path!r}")
            return JSONResponse({"topics": names})

    def _serve_programs_and_events(self, app: FastAPI) -> None:
        """Programs and events, by pages."""

        @app.get("/programs")
        async def programs(skip: int = 0, limit: int = 50) -> list[dict[str, Any]]:
            with self._lock:  # the business logic adds from other threads
                return list(self.programs.values())[skip : skip + limit]

        @app.get("/events")
        async def events(
            programID: str | None = None,
            skip: int = 0,
            limit: int = 50,
        ) -> list[dict[str, Any]]:
            with self._lock:
                found = [e for e in self.events.values() if programID in (None, e.get("programID"))]
            return found[skip : skip + limit]

    def _serve_vens(self, app: FastAPI) -> None:
        """Ven objects and their resources."""

        @app.get("/vens")
        async def vens(
            request: Request,
            venName: str | None = None,
            skip: int = 0,
            limit: int = 50,
        ) -> list[dict[str, Any]]:
            mine = [
                v
                for v in self.vens.values()
                if v.get("clientID") == request.state.client and venName in (None, v["venName"])
            ]
            return mine[skip : skip + limit]

        @app.post("/vens")
        async def create_ven(request: Request) -> JSONResponse:
            ven = await self._read(request, Ven, "venRequest")
            if isinstance(ven, JSONResponse):
                return ven
            if ven.object_type != "VEN_VEN_REQUEST":
                return self._refuse(400, "objectType: a VEN creates a VEN_VEN_REQUEST")
            stored = self._store(Ven, ven.wire(), "VEN", self.vens)
            stored["clientID"] = request.state.client
            self.say(f"VTN: ven {stored['id']} '{stored['venName']}' created")
            if self._after_registration is not None:  # off this loop: it notifies by HTTP
                timer = threading.Timer(1.0, self._after_registration)
                timer.daemon = True
                timer.start()
                self._after_registration = None
            return JSONResponse(stored, status_code=201)

        @app.get("/resources")
        async def resources(
            venID: str | None = None,
            skip: int = 0,
            limit: int = 50,
        ) -> list[dict[str, Any]]:
            with self._lock:
                found = [r for r in self.resources.values() if venID in (None, r["venID"])]
            return found[skip : skip + limit]

        @app.post("/resources")
        async def create_resource(request: Request) -> JSONResponse:
            resource = await self._read(request, Resource, "resourceRequest")
            if isinstance(resource, JSONResponse):
                return resource
            if resource.ven_id not in self.vens:
                return self._refuse(400, f"venID: no ven {resource.ven_id!r}")
            stored = self._store(Resource, resource.wire(), "RESOURCE", self.resources)
            return JSONResponse(stored, status_code=201)

    def _serve_subscriptions(self, app: FastAPI) -> None:
        """Subscriptions to notifications."""

        @app.post("/subscriptions")
        async def subscribe(request: Request) -> JSONResponse:
            self.subscription_posts += 1
            if not self.subscribable:
                return _problem(403, "subscriptions are not offered by this VTN")
            subscription = await self._read(request, Subscription, "subscriptionRequest")
            if isinstance(subscription, JSONResponse):
                return subscription
            if self.subscription_failure is None:
                for operation in subscription.object_operations:
                    if why := await _echo_problem(operation.callback_url):
                        return self._refuse(400, f"callbackUrl: {why}")
            stored = self._store(
                Subscription, subscription.wire(), "SUBSCRIPTION", self.subscriptions
            )
            stored["clientID"] = request.state.client
            if self.subscription_failure is not None:
                return _problem(self.subscription_failure, "Echo issue")
            return JSONResponse(stored, status_code=201)

        @app.get("/subscriptions")
        async def subscriptions(
            request: Request,
            clientName: str | None = None,
            skip: int = 0,
            limit: int = 50,
        ) -> list[dict[str, Any]]:
            with self._lock:
                mine = [
                    s
                    for s in self.subscriptions.values()
                    if s.get("clientID") == request.state.client
                    and clientName in (None, s["clientName"])
                ]
            return mine[skip : skip + limit]

        @app.delete("/subscriptions/{subscription_id}")
        async def unsubscribe(subscription_id: str) -> JSONResponse:
            with self._lock:
                gone = self.subscriptions.pop(subscription_id, None)
            if gone is None:
                return _problem(404, f"no subscription {subscription_id!r}")
            return JSONResponse(gone)

    def _serve_reports(self, app: FastAPI) -> None:
        """Reports."""

        @app.post("/reports")
        async def report(request: Request) -> JSONResponse:
            report = await self._read(request, Report, "reportRequest")
            if isinstance(report, JSONResponse):
                return report
            if report.event_id not in self.events:
                return self._refuse(400, f"eventID: no event {report.event_id!r}")
            stored = self._store(Report, report.wire(), "REPORT", {})
            with self._lock:
                self.reports.append(stored)
            self.say(f"VTN: report '{stored.get('reportName')}' for event {report.event_id}")
            return JSONResponse(stored, status_code=201)

        @app.get("/reports")
        async def reports() -> list[dict[str, Any]]:
            return self.reports

    async def _read(self, request: Request, model: type[Model], schema_name: str) -> Any:
        """The body as `model`, once the specification's `schema_name` and the model take it;
        else the 400 problem that says why."""
        try:
            body = await request.json()
        except ValueError:
            return self._refuse(400, "the body is not JSON")
        if why := self._schema_problem(schema_name, body):
            return self._refuse(400, f"not a 3.1 {schema_name} (the specification): {why}")
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            return self._refuse(400, f"not a 3.1 {model.__name__}: {first_error(exc)}")

    def _schema_problem(self, name: str, obj: Any) -> str | None:
        return self.schema.check(name, obj) if self.schema is not None else None

    def _auth_refusal(self, error: str, why: str) -> JSONResponse:
        self.refused.append(f"/auth/token: {why}")
        self.say(f"VTN: refused a token request: {why}")
        return JSONResponse({"error": error, "error_description": why}, status_code=400)

    def _refuse(self, status: int, detail: str) -> JSONResponse:
        self.refused.append(detail)
        self.say(f"VTN: refused a VEN message: {detail}")
        return _problem(status, detail)


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


async def _echo_problem(callback_url: str) -> str | None:
    """Why the callback fails the Definition's echo challenge, or None when it answers it."""
    challenge = secrets.token_urlsafe(12)
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.get(callback_url, params={"echo": challenge})
    except httpx.HTTPError as exc:
        return f"the echo challenge got no answer ({type(exc).__name__})"
    if answer.status_code != 200 or challenge not in answer.text:
        return f"the echo challenge was answered {answer.status_code} without the value"
    return None


def _problem(status: int, detail: str) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": detail, "status": status, "detail": detail},
        status_code=status,
        media_type="application/problem+json",
    )


def _basic(header: str) -> tuple[str, str]:
    if not header.startswith("Basic "):
        return "", ""
    try:
        client, _, secret = base64.b64decode(header[6:]).decode().partition(":")
    except ValueError:
        return "", ""
    return client, secret


def _now(clock: Clock) -> str:
    return clock.now().astimezone(UTC).isoformat().replace("+00:00", "Z")


__all__ = ["LAB_CLIENT_ID", "LAB_CLIENT_SECRET", "MockVtn31"]
