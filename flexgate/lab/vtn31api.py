"""The 3.1 mock VTN's REST API, one part at a time (`flexgate.lab.mockvtn31`): the gate every
request passes (down, one at a time, the bearer token), OAuth2 client credentials, the
notifiers and their MQTT topics, programs and events, vens and their resources,
subscriptions, reports. Each part serves `Vtn31State`'s objects; what a VEN sends is checked
against the specification's schema and read with the 3.1 models before it is stored."""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from flexgate.lab.vtn31state import Vtn31State
from gateway.openadr.oadr31 import Model, Report, Resource, Subscription, Ven, first_error


def serve_gate(app: FastAPI, vtn: Vtn31State) -> None:
    """503 while the VTN is down; no request served while a notification is posted
    (`one_at_a_time`); a valid bearer token on every path but the token's own."""

    @app.middleware("http")
    async def gate(request: Request, call_next: Any) -> Any:
        if vtn.down:
            return problem(503, "the VTN is down")
        while vtn.notifying():  # one_at_a_time: busy posting a notification
            await asyncio.sleep(0.01)
        path = request.url.path
        if path in ("/auth/server", "/auth/token"):
            return await call_next(request)
        client = vtn.client_of(request.headers.get("authorization", "").removeprefix("Bearer "))
        if client is None:
            vtn.rejected_tokens += 1
            return problem(401, "no valid bearer token (unknown or expired)")
        request.state.client = client
        return await call_next(request)


def serve_auth(app: FastAPI, vtn: Vtn31State) -> None:
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
        vtn.token_requests.append(how)
        if how == "both":  # RFC 6749 2.3: "MUST NOT use more than one authentication method"
            return _auth_refusal(vtn, "invalid_request", "credentials sent two ways")
        if how not in vtn.client_auth:
            return _auth_refusal(vtn, "invalid_request", f"credentials by {how} refused")
        if how == "body" and (why := schema_problem(vtn, "clientCredentialRequest", form)):
            return _auth_refusal(vtn, "invalid_request", why)
        client, secret = _basic(request.headers.get("authorization", ""))
        client = client or str(form.get("client_id", ""))
        secret = secret or str(form.get("client_secret", ""))
        if form.get("grant_type") != "client_credentials":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        known = vtn.clients.get(client)
        if known is None or not secrets.compare_digest(known, secret):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        return JSONResponse(
            {
                "access_token": vtn.grant(client),
                "token_type": "Bearer",
                "expires_in": vtn.token_lifetime_s,
            }
        )


def serve_notifiers(app: FastAPI, vtn: Vtn31State) -> None:
    """The notifiers offered (webhooks; MQTT with a broker) and their topics."""

    @app.get("/notifiers")
    async def notifiers() -> dict[str, Any]:
        offered: dict[str, Any] = {"WEBHOOK": True}
        if vtn.mqtt_uris:
            offered["MQTT"] = {
                "URIS": vtn.mqtt_uris,
                "authentication": vtn.mqtt_authentication,
                "serialization": "JSON",
            }
        return offered

    @app.get("/notifiers/{binding}/topics/{path:path}")
    async def topics(binding: str, path: str) -> JSONResponse:
        if binding.upper() != "MQTT" or not vtn.mqtt_broker:
            return problem(404, f"no notifier binding {binding!r} with topics")
        names = vtn.topics(path.strip("/"))
        if names is None:
            return problem(404, f"no topics for {path!r}")
        return JSONResponse({"topics": names})


def serve_programs_and_events(app: FastAPI, vtn: Vtn31State) -> None:
    """Programs and events, by pages."""

    @app.get("/programs")
    async def programs(skip: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        return vtn.listed(vtn.programs, lambda _p: True)[skip : skip + limit]

    @app.get("/events")
    async def events(
        programID: str | None = None,
        skip: int = 0,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        found = vtn.listed(vtn.events, lambda e: programID in (None, e.get("programID")))
        return found[skip : skip + limit]


def serve_vens(app: FastAPI, vtn: Vtn31State) -> None:
    """Ven objects and their resources."""

    @app.get("/vens")
    async def vens(
        request: Request,
        venName: str | None = None,
        skip: int = 0,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        client = request.state.client
        mine = vtn.listed(
            vtn.vens, lambda v: v.get("clientID") == client and venName in (None, v["venName"])
        )
        return mine[skip : skip + limit]

    @app.post("/vens")
    async def create_ven(request: Request) -> JSONResponse:
        ven = await read(vtn, request, Ven, "venRequest")
        if isinstance(ven, JSONResponse):
            return ven
        if ven.object_type != "VEN_VEN_REQUEST":
            return refuse(vtn, 400, "objectType: a VEN creates a VEN_VEN_REQUEST")
        stored = vtn.store(Ven, ven.wire(), "VEN", vtn.vens)
        stored["clientID"] = request.state.client
        vtn.say(f"VTN: ven {stored['id']} '{stored['venName']}' created")
        vtn.registered()
        return JSONResponse(stored, status_code=201)

    @app.get("/resources")
    async def resources(
        venID: str | None = None,
        skip: int = 0,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        found = vtn.listed(vtn.resources, lambda r: venID in (None, r["venID"]))
        return found[skip : skip + limit]

    @app.post("/resources")
    async def create_resource(request: Request) -> JSONResponse:
        resource = await read(vtn, request, Resource, "resourceRequest")
        if isinstance(resource, JSONResponse):
            return resource
        if resource.ven_id not in vtn.vens:
            return refuse(vtn, 400, f"venID: no ven {resource.ven_id!r}")
        stored = vtn.store(Resource, resource.wire(), "RESOURCE", vtn.resources)
        return JSONResponse(stored, status_code=201)


def serve_subscriptions(app: FastAPI, vtn: Vtn31State) -> None:
    """Subscriptions to notifications."""

    @app.post("/subscriptions")
    async def subscribe(request: Request) -> JSONResponse:
        vtn.subscription_posts += 1
        if not vtn.subscribable:
            return problem(403, "subscriptions are not offered by this VTN")
        subscription = await read(vtn, request, Subscription, "subscriptionRequest")
        if isinstance(subscription, JSONResponse):
            return subscription
        if vtn.subscription_failure is None:
            for operation in subscription.object_operations:
                if why := await _echo_problem(operation.callback_url):
                    return refuse(vtn, 400, f"callbackUrl: {why}")
        stored = vtn.store(Subscription, subscription.wire(), "SUBSCRIPTION", vtn.subscriptions)
        stored["clientID"] = request.state.client
        if vtn.subscription_failure is not None:
            return problem(vtn.subscription_failure, "Echo issue")
        return JSONResponse(stored, status_code=201)

    @app.get("/subscriptions")
    async def subscriptions(
        request: Request,
        clientName: str | None = None,
        skip: int = 0,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        client = request.state.client
        mine = vtn.listed(
            vtn.subscriptions,
            lambda s: s.get("clientID") == client and clientName in (None, s["clientName"]),
        )
        return mine[skip : skip + limit]

    @app.delete("/subscriptions/{subscription_id}")
    async def unsubscribe(subscription_id: str) -> JSONResponse:
        gone = vtn.pop_subscription(subscription_id)
        if gone is None:
            return problem(404, f"no subscription {subscription_id!r}")
        return JSONResponse(gone)


def serve_reports(app: FastAPI, vtn: Vtn31State) -> None:
    """Reports."""

    @app.post("/reports")
    async def report(request: Request) -> JSONResponse:
        report = await read(vtn, request, Report, "reportRequest")
        if isinstance(report, JSONResponse):
            return report
        if report.event_id not in vtn.events:
            return refuse(vtn, 400, f"eventID: no event {report.event_id!r}")
        stored = vtn.store(Report, report.wire(), "REPORT", {})
        vtn.add_report(stored)
        vtn.say(f"VTN: report '{stored.get('reportName')}' for event {report.event_id}")
        return JSONResponse(stored, status_code=201)

    @app.get("/reports")
    async def reports() -> list[dict[str, Any]]:
        return vtn.reports


#: The API's parts, served in this order after the gate.
PARTS: tuple[Callable[[FastAPI, Vtn31State], None], ...] = (
    serve_auth,
    serve_notifiers,
    serve_programs_and_events,
    serve_vens,
    serve_subscriptions,
    serve_reports,
)


async def read(vtn: Vtn31State, request: Request, model: type[Model], schema_name: str) -> Any:
    """The body as `model`, once the specification's `schema_name` and the model take it;
    else the 400 problem that says why."""
    try:
        body = await request.json()
    except ValueError:
        return refuse(vtn, 400, "the body is not JSON")
    if why := schema_problem(vtn, schema_name, body):
        return refuse(vtn, 400, f"not a 3.1 {schema_name} (the specification): {why}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        return refuse(vtn, 400, f"not a 3.1 {model.__name__}: {first_error(exc)}")


def schema_problem(vtn: Vtn31State, name: str, obj: Any) -> str | None:
    return vtn.schema.check(name, obj) if vtn.schema is not None else None


def refuse(vtn: Vtn31State, status: int, detail: str) -> JSONResponse:
    vtn.refused.append(detail)
    vtn.say(f"VTN: refused a VEN message: {detail}")
    return problem(status, detail)


def _auth_refusal(vtn: Vtn31State, error: str, why: str) -> JSONResponse:
    vtn.refused.append(f"/auth/token: {why}")
    vtn.say(f"VTN: refused a token request: {why}")
    return JSONResponse({"error": error, "error_description": why}, status_code=400)


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


def problem(status: int, detail: str) -> JSONResponse:
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
