"""The gateway's HTTP API (CONTRACT.md, "Gateway HTTP API"). Routes stay thin."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from agents.protocol import problems
from flexmodel.phases import MIN_JOBS_FOR_RAYLEIGH, order_parameters, rayleigh_threshold
from gateway.api.deps import READ, GatewayDep, Writer
from gateway.api.schemas import (
    Event,
    EventCreate,
    Events,
    Health,
    JobsBody,
    Plan,
    Quote,
    QuoteRequest,
    Site,
    SyncState,
)
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.services.planner import loops_report
from gateway.store import repo
from gateway.store.models import EventRow, as_utc, utcnow

router = APIRouter()
v1 = APIRouter(prefix="/v1", dependencies=READ, responses=problems(401, 503))


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "the store is unreachable"}},
)
async def health(request: Request, gateway: GatewayDep) -> Any:
    """200 when the store answers; 503 "unhealthy" (with the same fields) when it does not."""
    try:
        with gateway.session() as s:
            repo.list_events(s, statuses=("active",))
        store = "ok"
    except OperationalError as exc:
        store = f"unreachable: {type(exc.orig).__name__}"
    doc = {
        "status": "ok" if store == "ok" else "unhealthy",
        "store": store,
        "scheduler": gateway.scheduler.running,
        "agents_configured": len(gateway.settings.agent_urls),
        "agents_known": len(gateway.nodes),
        "ven": _ven_state(request),
    }
    return doc if store == "ok" else JSONResponse(doc, status_code=503)


def _ven_state(request: Request) -> str | None:
    ven = getattr(request.app.state, "ven", None)
    if ven is None:
        return None
    return "registered" if ven.registered else "registering"


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    dependencies=READ,
    responses=problems(401, 503),
)
async def metrics(gateway: GatewayDep) -> str:
    with gateway.session() as s:
        live = repo.list_events(s, statuses=("pending", "active"))
    lines = [
        "# TYPE flexgate_agents_known gauge",
        f"flexgate_agents_known {len(gateway.nodes)}",
        "# TYPE flexgate_events_active gauge",
        f"flexgate_events_active {sum(e.status == 'active' for e in live)}",
        "# TYPE flexgate_events_pending gauge",
        f"flexgate_events_pending {sum(e.status == 'pending' for e in live)}",
        "# TYPE flexgate_fan_outs_total counter",
        f"flexgate_fan_outs_total {gateway.fan_outs}",
        "# TYPE flexgate_nodes_unreachable gauge",
        f"flexgate_nodes_unreachable {len(gateway.down)}",
        "# TYPE flexgate_generation gauge",
        f"flexgate_generation {gateway.generation or 0}",
        "# TYPE flexgate_jobs gauge",
        f"flexgate_jobs {len(gateway.mix().jobs)}",
    ]
    return "\n".join(lines) + "\n"


@v1.get("/site", response_model=Site)
async def site(gateway: GatewayDep) -> dict[str, Any]:
    return await gateway.site()


@v1.get("/jobs")
async def list_jobs(gateway: GatewayDep) -> dict[str, Any]:
    with gateway.session() as s:
        return {"jobs": repo.load_jobs(s)}


@v1.put("/jobs", responses=problems(400, 422))
async def replace_jobs(body: JobsBody, gateway: GatewayDep, actor: Writer) -> dict[str, Any]:
    mix = await gateway.replace_jobs(body.jobs, actor)
    return {"jobs": len(mix.jobs)}


@v1.put("/jobs/{job_id}", responses=problems(400, 422))
async def put_job(
    job_id: str, job: dict[str, Any], gateway: GatewayDep, actor: Writer, response: Response
) -> dict[str, Any]:
    if job.get("id", job_id) != job_id:
        raise InvalidRequestError(f"the body's id '{job.get('id')}' is not the path's '{job_id}'")
    created = await gateway.put_job({**job, "id": job_id}, actor)
    response.status_code = 201 if created else 200
    return {"id": job_id, "created": created}


@v1.delete("/jobs/{job_id}", status_code=204, responses=problems(404, 422))
async def delete_job(job_id: str, gateway: GatewayDep, actor: Writer) -> None:
    await gateway.delete_job(job_id, actor)


@v1.get("/nodes")
async def nodes(gateway: GatewayDep) -> dict[str, Any]:
    telemetry = await gateway.telemetry()
    with gateway.session() as s:
        known = repo.list_nodes(s)
    return {
        "nodes": [
            {
                "node": row.node_id,
                "url": row.url,
                "reachable": row.node_id in telemetry,
                "last_seen": _iso(row.last_seen),
                "gpus": [
                    {
                        "index": g["index"],
                        "power_w": sum(g["power_w"]) / len(g["power_w"]) if g["power_w"] else None,
                    }
                    for g in telemetry.get(row.node_id, {}).get("gpus", [])
                ],
                "actuation_delay": telemetry.get(row.node_id, {}).get("actuation_delay"),
                "jobs": telemetry.get(row.node_id, {}).get("jobs", []),
            }
            for row in known
        ]
    }


@v1.post(
    "/quotes",
    responses={200: {"model": Quote, "description": "a quote"}, **problems(400, 422)},
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {
                    "schema": QuoteRequest.model_json_schema(
                        ref_template="#/components/schemas/{model}"
                    )
                }
            },
        }
    },
)
async def quotes(request: Request, gateway: GatewayDep) -> Response:
    """A quote (CONTRACT.md, body `{"reduction_kw"?, "window_s"?, "confidence"?}`).

    An identical request on an unchanged mix is answered from memory without parsing it again.
    """
    raw = await request.body()
    content = gateway.cached_quote(raw)
    if content is None:
        try:
            body = QuoteRequest.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        content = gateway.quote(body.reduction_kw, body.window_s, body.confidence, raw=raw)
    return Response(content=content, media_type="application/json")


def event_doc(event: EventRow, gateway: Any) -> dict[str, Any]:
    with gateway.session() as s:
        plans = [] if event.plan_id is None else [repo.get_plan(s, plan_id=event.plan_id)]
    now = utcnow()
    intervals = event.intervals or []
    current = next((i for i in intervals if i["start"] <= now.isoformat() < i["end"]), None)
    upcoming = next((i for i in intervals if i["start"] > now.isoformat()), None)
    shown = current or upcoming or (intervals[-1] if intervals else None)
    return {
        "id": event.id,
        "source": event.source,
        "status": event.status,
        "start": _iso(event.start),
        "end": _iso(event.end),
        "reduction_kw": shown["reduction_kw"] if shown else event.reduction_kw,
        "intervals": [{**i, "plan_id": event.plan_id if i is current else None} for i in intervals],
        "opt": event.opt,
        "reason": event.reason,
        "plan_id": event.plan_id,
        "feasible": plans[0].doc["feasible"] if plans and plans[0] else None,
        "test": event.test,
        "external_id": event.external_id,
        "modification": event.modification,
    }


@v1.get("/events", response_model=Events)
async def list_events(gateway: GatewayDep) -> dict[str, Any]:
    with gateway.session() as s:
        events = repo.list_events(s)
    return {"events": [event_doc(e, gateway) for e in events]}


@v1.get("/events/{event_id}", response_model=Event, responses=problems(404, 422))
async def get_event(event_id: str, gateway: GatewayDep) -> dict[str, Any]:
    return event_doc(gateway.event(event_id), gateway)


@v1.post("/events", status_code=201, response_model=Event, responses=problems(400, 422))
async def create_event(body: EventCreate, gateway: GatewayDep, actor: Writer) -> dict[str, Any]:
    event = await gateway.create_event(
        reduction_kw=body.reduction_kw,
        start=body.start,
        duration_s=body.duration_s,
        source="manual",
        actor=actor,
    )
    return event_doc(event, gateway)


@v1.delete("/events/{event_id}", response_model=Event, responses=problems(404, 409, 422))
async def cancel_event(event_id: str, gateway: GatewayDep, actor: Writer) -> dict[str, Any]:
    return event_doc(await gateway.cancel_event(event_id, actor), gateway)


@v1.get("/plans/{plan_id}", response_model=Plan, responses=problems(404, 422))
async def get_plan(plan_id: str, gateway: GatewayDep) -> dict[str, Any]:
    with gateway.session() as s:
        row = repo.get_plan(s, plan_id=plan_id)
        if row is None:
            raise NotFoundError(f"no plan '{plan_id}'")
        commands = repo.latest_commands(s, plan_id=plan_id)
    latest: dict[str, Any] = {}
    for c in commands:
        latest[c.node] = {
            "node": c.node,
            "status": c.status,
            "generation": c.generation,
            "attempts": c.attempts,
            "sent_at": _iso(c.sent_at),
            "acked_at": _iso(c.acked_at),
            "delay_s": c.delay_s,
            "error": c.error,
        }
    achieved = None
    if plan_id == gateway.plan_id:
        achieved = (await gateway.site())["shed_facility_kw"]
    return {
        **row.doc,
        "id": row.id,
        "event_id": row.event_id,
        "generation": row.generation,
        "expected_facility_kw": row.doc["achieved_facility_kw"],
        "achieved_facility_kw": achieved,
        # Per node: the caps sent, and the last answer (status, timings), as CONTRACT.md says.
        "commands": [
            {**command, **latest.get(command["node"], {"status": "pending"})}
            for command in row.doc["commands"]
        ],
        "created_at": _iso(row.created_at),
    }


@v1.get("/sync", response_model=SyncState)
async def sync(gateway: GatewayDep) -> dict[str, Any]:
    telemetry = await gateway.telemetry()
    jobs = [j for doc in telemetry.values() for j in doc.get("jobs", [])]
    phases = [j["phase_rad"] for j in jobs if j.get("phase_rad") is not None]
    report = loops_report(gateway.mix(), gateway.settings)
    order = None
    if phases:
        r1, r2, r3 = (float(v) for v in order_parameters(phases))
        order = {"r1": r1, "r2": r2, "r3": r3, "jobs": len(phases)}
    if len(phases) >= MIN_JOBS_FOR_RAYLEIGH:
        limit = rayleigh_threshold(len(phases), gateway.alarm.false_alarm)
        alarms: dict[str, Any] = {
            "test": "rayleigh",
            "threshold": limit,
            "false_alarm": gateway.alarm.false_alarm,
            "held_windows": gateway.alarm.hold,
            "harmonics": [
                m
                for m, streak in zip((1, 2, 3), gateway.alarm.streak, strict=True)
                if streak >= gateway.alarm.hold
            ],
        }
    else:
        alarms = {
            "test": None,
            "harmonics": [],
            "note": f"fewer than {MIN_JOBS_FOR_RAYLEIGH} jobs with phases: the Rayleigh "
            "test does not apply (use pairwise phase-locking values)",
        }
    return {
        "jobs": [
            {
                "job_id": j["job_id"],
                "period_s": j["period_s"],
                "duty": j["duty"],
                "phase": j["phase_rad"],
            }
            for j in jobs
        ],
        "order_parameters": order,
        "alarms": alarms,
        "loops": report["loops"],
        "verdict": report["verdict"],
    }


def _iso(when: Any) -> str | None:
    return None if when is None else as_utc(when).isoformat()
