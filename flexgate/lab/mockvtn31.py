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

The VTN's objects and their notifications are `flexgate.lab.vtn31state`'s, its REST API, one
part at a time, `flexgate.lab.vtn31api`'s.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from flexgate.lab.vtn31api import PARTS, serve_gate
from flexgate.lab.vtn31state import (
    DEFAULT_DURATION_S,
    DEFAULT_SHED_KW,
    DEFAULT_START_S,
    LAB_CLIENT_ID,
    LAB_CLIENT_SECRET,
    Vtn31State,
    shed_event,
)


class MockVtn31(Vtn31State):
    """`Vtn31State` (its options: clients, token lifetime, clock, MQTT broker ...) served by a
    FastAPI app, `app`."""

    def __init__(self, clients: dict[str, str] | None = None, **options: Any) -> None:
        super().__init__(clients, **options)
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI(title="flexgate mock VTN (OpenADR 3.1)")
        serve_gate(app, self)
        for serve in PARTS:
            serve(app, self)
        return app


__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_SHED_KW",
    "DEFAULT_START_S",
    "LAB_CLIENT_ID",
    "LAB_CLIENT_SECRET",
    "MockVtn31",
    "shed_event",
]
