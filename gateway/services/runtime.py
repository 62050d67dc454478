"""The gateway's running state: nodes, events, plans, dispatch, reconciliation, recovery.

- **Events** are stored before anything acts on them. APScheduler (3.x) jobs start and end
  them; on start the gateway rebuilds those jobs from the store and resumes active events.
- **Targets.** Whenever the set of active events or the job mix changes, the strictest active
  target (the largest reduction) is planned and every node is sent its whole desired state with
  a new generation.
- **Reconciliation** every `reconcile_period_s` on the monotonic clock: the desired state is
  sent again with the same generation, which renews every lease and puts back whatever drifted
  (an agent that restarted, a limit changed under us). Nodes that did not answer at start are
  looked up again. Event starts and ends follow the wall clock (APScheduler), as events do.
- **Unreachable nodes.** A node whose command failed (after the retries) is planned as down:
  its jobs give nothing and the target is re-planned onto the other nodes, as far as their
  bounds allow (the rest is `shortfall_kw`). It is still sent its desired state (no caps), so
  it is seen coming back; then the target is re-planned with it again.
- **Recovery.** When no event is active any more, caps step back over `recovery_ramp_s` in
  `recovery_steps` plans of decreasing reduction, then every GPU gets its original limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from agents.protocol import CapCommand
from flexmodel.jobs import JobMix
from flexmodel.phases import MIN_JOBS_FOR_RAYLEIGH, RayleighAlarm
from flexmodel.quote import quote
from gateway.errors import ConflictError, InvalidRequestError, NotFoundError
from gateway.services.dispatch import Ack, fan_out
from gateway.services.planner import plan, site_mix
from gateway.settings import GatewaySettings
from gateway.signals import Schedule
from gateway.store import repo
from gateway.store.models import CommandRow, EventRow, PlanRow, as_utc, utcnow

log = logging.getLogger("flexgate.gateway")
LIVE = ("pending", "active")


class Gateway:
    def __init__(self, settings: GatewaySettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.nodes: dict[str, str] = {}  #: node id -> agent base URL
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self.http: aiohttp.ClientSession | None = None
        self.desired: dict[str, list[dict[str, float]]] = {}
        self.generation: int | None = None
        self.plan_id: str | None = None
        self.down: set[str] = set()  #: nodes whose last command failed
        self.fan_outs = 0  #: desired states sent to every node, since start
        self._target: tuple[float, str | None] | None = None  #: (facility kW, event id)
        self._mix: JobMix | None = None
        self._quotes: dict[tuple[float | None, float, float] | bytes, bytes] = {}
        self._lock = asyncio.Lock()
        self._ramp: asyncio.Task[None] | None = None
        self._reconciler: asyncio.Task[None] | None = None
        self._telemetry: dict[str, dict[str, Any]] | None = None  #: the last round's answers
        self._telemetry_at = -math.inf  #: when that round ended (monotonic)
        self._round: asyncio.Future[dict[str, dict[str, Any]]] | None = None
        self.alarm = RayleighAlarm()
        self.phases: dict[str, float] = {}  #: job id -> phase [rad] at the last watch
        #: Set by the VEN: tells the VTN we opted out of an event cancelled on our side.
        self.tell_vtn_opt_out: Callable[[EventRow], Awaitable[None]] | None = None

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=2000, keepalive_timeout=75)
        )
        await self.discover()
        self.scheduler.start()
        await self.resume()
        self._reconciler = asyncio.create_task(self._reconcile_forever())

    async def stop(self) -> None:
        for task in (self._ramp, self._reconciler, self._round):
            if task is not None:
                task.cancel()
        self.scheduler.shutdown(wait=False)
        if self.http is not None:
            await self.http.close()

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    async def discover(self) -> None:
        """Ask each configured agent for its node id (once it answers)."""
        assert self.http is not None
        missing = [u for u in self.settings.agent_urls if u not in self.nodes.values()]

        async def ask(url: str) -> None:
            try:
                async with self.http.get(
                    f"{url}/health",  # type: ignore[union-attr]
                    timeout=aiohttp.ClientTimeout(total=2),
                ) as answer:
                    if answer.status == 200:
                        node_id = (await answer.json())["node_id"]
                        self.nodes[node_id] = url
                        with self.session() as s:
                            repo.saw_node(s, node_id=node_id, url=url)
                            s.commit()
            except (TimeoutError, aiohttp.ClientError, KeyError, ValueError) as exc:
                log.warning("agent %s did not answer: %s", url, exc)

        await asyncio.gather(*(ask(u) for u in missing))

    # --- the job mix -----------------------------------------------------------------------

    def mix(self) -> JobMix:
        if self._mix is None:
            with self.session() as s:
                self._mix = site_mix(repo.load_jobs(s), self.settings)
            self._quotes.clear()
        return self._mix

    def quote(
        self,
        reduction_kw: float | None,
        window_s: float,
        confidence: float,
        raw: bytes | None = None,
    ) -> bytes:
        """A quote as JSON; kept until the job mix changes (it depends on nothing else), by its
        parameters and by the request's raw body, so a repeated request skips parsing too."""
        key = (reduction_kw, window_s, confidence)
        mix = self.mix()
        if key not in self._quotes:
            if len(self._quotes) >= 256:
                self._quotes.clear()
            doc = quote(mix, window_s=window_s, confidence=confidence, reduction_kw=reduction_kw)
            self._quotes[key] = json.dumps(doc, allow_nan=False).encode()
        if raw is not None:
            self._quotes[raw] = self._quotes[key]
        return self._quotes[key]

    def cached_quote(self, raw: bytes) -> bytes | None:
        """The answer to exactly this request body, if the mix has not changed since."""
        self.mix()  # a changed mix clears the cache
        return self._quotes.get(raw)

    async def replace_jobs(self, docs: list[dict[str, Any]], actor: str) -> JobMix:
        mix = site_mix(docs, self.settings)  # refused whole, before anything is stored
        with self.session() as s:
            repo.replace_jobs(s, docs=docs)
            repo.audit(s, actor=actor, action="jobs.replace", detail={"jobs": len(docs)})
            s.commit()
        self._mix, self._quotes = mix, {}
        await self.apply_targets()
        return mix

    async def put_job(self, doc: dict[str, Any], actor: str) -> bool:
        """Add or replace one job; True when it is new."""
        with self.session() as s:
            docs = repo.load_jobs(s)
        ids = [d.get("id") for d in docs]
        new = doc.get("id") not in ids
        merged = [*docs, doc] if new else [doc if d.get("id") == doc.get("id") else d for d in docs]
        mix = site_mix(merged, self.settings)  # refused whole, before anything is stored
        with self.session() as s:
            repo.put_job(s, doc=doc)
            repo.audit(s, actor=actor, action="jobs.put", detail={"id": doc.get("id")})
            s.commit()
        self._mix, self._quotes = mix, {}
        await self.apply_targets()
        return new

    async def delete_job(self, job_id: str, actor: str) -> None:
        with self.session() as s:
            if not repo.delete_job(s, job_id=job_id):
                raise NotFoundError(f"no job '{job_id}'")
            repo.audit(s, actor=actor, action="jobs.delete", detail={"id": job_id})
            s.commit()
        self._mix, self._quotes = None, {}
        await self.apply_targets()

    # --- events ----------------------------------------------------------------------------

    async def create_event(
        self, *, reduction_kw: float, start: datetime, duration_s: float, source: str, actor: str
    ) -> EventRow:
        if start.tzinfo is None:
            raise InvalidRequestError("start: give a time zone (e.g. 2026-11-29T16:00:00Z)")
        if not (math.isfinite(reduction_kw) and reduction_kw > 0):
            raise InvalidRequestError("reduction_kw must be a positive number")
        end = start + timedelta(seconds=duration_s)
        if end <= utcnow():
            raise InvalidRequestError(f"the event would end at {end.isoformat()}, in the past")
        event = EventRow(
            intervals=[_interval(start, end, reduction_kw)],
            id=f"ev-{uuid.uuid4().hex[:12]}",
            source=source,
            status="pending",
            start=start.astimezone(UTC),
            end=end.astimezone(UTC),
            reduction_kw=reduction_kw,
            created_at=utcnow(),
        )
        with self.session() as s:
            repo.add_event(s, event=event)
            repo.audit(
                s,
                actor=actor,
                action="events.create",
                detail={"id": event.id, "reduction_kw": reduction_kw},
            )
            s.commit()
        self._schedule(event)
        return event

    def site_base(self) -> tuple[float, float]:
        """(baseline facility kW, maximum facility kW): uncapped, and every GPU at its limit."""
        mix, k, static = self.mix(), self.settings.overhead_factor, self.settings.static_load_kw
        placed = [j for j in mix.jobs if j.placement]
        baseline = sum(j.gpus * j.power_w for j in placed) / 1000.0
        maximum = sum(j.gpus * j.max_cap_w for j in placed) / 1000.0
        return static + k * baseline, static + k * maximum

    async def accept_openadr(self, plan: Schedule) -> tuple[str, str | None]:
        """Store an OpenADR event's schedule, act on it, and say whether we opt in.

        Stored before it is answered; an older modification than the one stored is refused;
        a cancellation cancels; a test event is answered and never acted on.
        """
        event_id = f"oadr-{plan.event_id}"
        with self.session() as s:
            known = repo.get_event(s, event_id=event_id)
        if known is not None and plan.modification < known.modification:
            return known.opt, f"modification {plan.modification} is older than {known.modification}"
        if plan.status == "cancelled":
            if known is not None and known.status in LIVE:
                await self.cancel_event(event_id, "vtn")
            return "in", None
        opt, reason = self._opt(plan)
        start = plan.start or utcnow()
        row = EventRow(
            id=event_id,
            source="openadr",
            status="opted_out" if opt == "out" else "pending",
            start=start,
            end=plan.end or start,
            reduction_kw=max((i.reduction_kw for i in plan.intervals), default=0.0),
            intervals=[_interval(i.start, i.end, i.reduction_kw) for i in plan.intervals],
            opt=opt,
            reason=reason,
            external_id=plan.event_id,
            modification=plan.modification,
            test=plan.test,
            created_at=utcnow(),
        )
        with self.session() as s:
            if known is not None:
                s.delete(s.merge(known))
                s.flush()
            repo.add_event(s, event=row)
            repo.audit(
                s,
                actor="vtn",
                action="events.openadr",
                detail={"id": event_id, "modification": plan.modification, "opt": opt},
            )
            s.commit()
        if opt == "in" and not plan.test and plan.intervals:
            self._schedule(row)
        return opt, reason

    async def cancel_unlisted_openadr(self, listed: set[str]) -> list[str]:
        """Cancel every live OpenADR event whose id the VTN no longer lists; their ids."""
        with self.session() as s:
            live = repo.list_events(s, statuses=LIVE)
        gone = [e.id for e in live if e.source == "openadr" and e.external_id not in listed]
        for event_id in gone:
            await self.cancel_event(event_id, "vtn")
        return gone

    def _opt(self, plan: Schedule) -> tuple[str, str | None]:
        """Opt in or out: the signal's own verdict first, then the site's policy."""
        if plan.opt_out_reason:
            return "out", plan.opt_out_reason
        if self.settings.opt_policy == "never":
            return "out", "the site's policy is never to opt in"
        most = max((i.reduction_kw for i in plan.intervals), default=0.0)
        reachable = quote(self.mix(), window_s=1.0, per_job_curves=False)["achievable_kw"]
        if self.settings.opt_policy == "feasible" and most > reachable * (1 + 1e-9):
            return "out", f"asks for {most:.1f} kW; the site can shed {reachable:.1f} kW"
        return "in", None

    def _schedule(self, event: EventRow) -> None:
        now = utcnow()
        self.scheduler.add_job(
            self.start_event,
            "date",
            run_date=max(as_utc(event.start), now),
            args=[event.id],
            id=f"start-{event.id}",
            replace_existing=True,
        )
        self.scheduler.add_job(
            self.end_event,
            "date",
            run_date=max(as_utc(event.end), now),
            args=[event.id],
            id=f"end-{event.id}",
            replace_existing=True,
        )
        for k, interval in enumerate(event.intervals[1:], start=1):  # the target changes
            when = datetime.fromisoformat(interval["start"])
            if when > now:
                self.scheduler.add_job(
                    self.apply_targets,
                    "date",
                    run_date=when,
                    id=f"step-{event.id}-{k}",
                    replace_existing=True,
                )

    async def start_event(self, event_id: str) -> None:
        if self._move(event_id, ("pending",), "active"):
            await self.apply_targets()

    async def end_event(self, event_id: str) -> None:
        if self._move(event_id, ("active", "pending"), "completed"):
            await self.apply_targets()

    async def cancel_event(self, event_id: str, actor: str) -> EventRow:
        with self.session() as s:
            event = repo.get_event(s, event_id=event_id)
        if event is None:
            raise NotFoundError(f"no event '{event_id}'")
        if event.status not in LIVE:
            raise ConflictError(f"event '{event_id}' is {event.status}: nothing to cancel")
        if event.source == "openadr" and actor != "vtn":
            await self._opt_out_locally(event_id, actor)
        self._move(event_id, LIVE, "cancelled", actor=actor)
        for job in (f"start-{event_id}", f"end-{event_id}"):
            if self.scheduler.get_job(job):
                self.scheduler.remove_job(job)
        if event.status == "active":  # a pending event has set no target
            await self.apply_targets()
        return self.event(event_id)

    async def _opt_out_locally(self, event_id: str, actor: str) -> None:
        """An OpenADR event cancelled on our side: stored as an opt-out and the VTN told, first
        (CONTRACT.md), waiting at most `dispatch_timeout_s` so the restore is never held up."""
        with self.session() as s:
            event = repo.get_event(s, event_id=event_id)
            assert event is not None
            event.opt, event.reason = "out", f"cancelled on the site by {actor}"
            s.add(event)
            s.commit()
            s.refresh(event)
        if self.tell_vtn_opt_out is not None:
            try:
                await asyncio.wait_for(
                    self.tell_vtn_opt_out(event), self.settings.dispatch_timeout_s
                )
            except Exception:  # the GPUs are restored either way; say the VTN was not told
                log.exception("event %s: the VTN could not be told of the opt-out", event_id)

    def _move(
        self, event_id: str, sources: tuple[str, ...], target: str, actor: str = "scheduler"
    ) -> bool:
        with self.session() as s:
            event = repo.get_event(s, event_id=event_id)
            if event is None or event.status not in sources:
                return False
            event.status = target
            s.add(event)
            repo.audit(s, actor=actor, action=f"events.{target}", detail={"id": event_id})
            s.commit()
        return True

    def event(self, event_id: str) -> EventRow:
        with self.session() as s:
            event = repo.get_event(s, event_id=event_id)
        if event is None:
            raise NotFoundError(f"no event '{event_id}'")
        return event

    async def resume(self) -> None:
        """After a restart: finish what ended while down, schedule the rest, re-plan."""
        now = utcnow()
        with self.session() as s:
            live = repo.list_events(s, statuses=LIVE)
        for event in live:
            if as_utc(event.end) <= now:
                self._move(event.id, LIVE, "completed")
            else:
                self._schedule(event)
        await self.apply_targets(resumed=True)

    # --- planning and dispatch -------------------------------------------------------------

    async def apply_targets(self, resumed: bool = False) -> None:
        """Plan the strictest active target, or recover when none is left."""
        with self.session() as s:
            active = [e for e in repo.list_events(s, statuses=("active",)) if not e.test]
        if active:
            if self._ramp is not None:
                self._ramp.cancel()
                self._ramp = None
            now = utcnow()
            strictest = max(active, key=lambda e: current_reduction(e, now))
            async with self._lock:
                await self._plan_and_send(current_reduction(strictest, now), strictest.id)
        elif self.desired or resumed:
            last = self._last_target()
            if self._ramp is None or self._ramp.done():
                self._ramp = asyncio.create_task(self._recover(last))

    def _last_target(self) -> float:
        if self.plan_id is None:
            return 0.0
        with self.session() as s:
            row = repo.get_plan(s, plan_id=self.plan_id)
        return float(row.doc["requested_facility_kw"]) if row else 0.0

    async def _recover(self, from_kw: float) -> None:
        """Step the caps back over the recovery ramp, then restore every GPU."""
        steps = self.settings.recovery_steps
        pause = self.settings.recovery_ramp_s / steps
        for k in range(1, steps):
            await asyncio.sleep(pause)
            async with self._lock:
                await self._plan_and_send(from_kw * (1 - k / steps), None)
        await asyncio.sleep(pause)
        async with self._lock:
            await self._plan_and_send(0.0, None)
            self.desired, self.generation, self._target = {}, None, None  # nothing to renew

    async def _plan_and_send(self, facility_kw: float, event_id: str | None) -> None:
        """Plan the target onto the nodes that answer and send it; once more when a node went
        down or came back meanwhile."""
        await self.discover()
        self._target = (facility_kw, event_id)
        for _ in range(2):
            doc = plan(
                self.mix(), facility_kw, set(self.nodes), self.settings, frozenset(self.down)
            )
            with self.session() as s:
                generation = repo.next_generation(s)
                row = PlanRow(
                    id=f"plan-{uuid.uuid4().hex[:12]}",
                    event_id=event_id,
                    generation=generation,
                    doc=doc,
                    created_at=utcnow(),
                )
                repo.add_plan(s, plan=row)
                if event_id is not None:
                    event = repo.get_event(s, event_id=event_id)
                    if event is not None:
                        event.plan_id = row.id
                        s.add(event)
                s.commit()
            self.desired = {c["node"]: c["caps"] for c in doc["commands"]}
            self.generation, self.plan_id = generation, row.id
            if not self._note_down(await self._send()):
                return

    def _note_down(self, acks: list[Ack]) -> bool:
        """Record which nodes failed; True when that changed."""
        down = {a.node for a in acks if a.status == "failed"}
        changed, self.down = down != self.down, down
        if changed:
            log.warning("nodes unreachable: %s", ", ".join(sorted(down)) or "none")
        return changed

    async def _send(self) -> list[Ack]:
        assert self.http is not None
        assert self.generation is not None
        assert self.plan_id is not None
        targets = [
            (
                node,
                url,
                CapCommand(
                    plan_id=self.plan_id,
                    generation=self.generation,
                    lease_s=self.settings.lease_s,
                    caps=self.desired.get(node, []),
                ),
            )  # type: ignore[arg-type]
            for node, url in sorted(self.nodes.items())
        ]
        self.fan_outs += 1
        acks = await fan_out(
            self.http,
            targets,
            self.settings.agent_token.get_secret_value(),
            timeout_s=self.settings.dispatch_timeout_s,
            retries=self.settings.dispatch_retries,
        )
        try:
            self._store_acks(acks)
        except OperationalError as exc:  # the agents have their caps; only the record is missing
            log.warning("store unreachable: %d acks not recorded (%s)", len(acks), exc)
        return acks

    def _store_acks(self, acks: list[Ack]) -> None:
        with self.session() as s:
            for ack in acks:
                repo.add_command(
                    s,
                    command=CommandRow(
                        plan_id=self.plan_id,
                        node=ack.node,
                        generation=self.generation,
                        status=ack.status,
                        attempts=ack.attempts,
                        sent_at=ack.sent_at,
                        acked_at=ack.acked_at,
                        delay_s=ack.delay_s,
                        error=ack.error,
                        answer=ack.answer,
                    ),
                )
            s.commit()

    async def watch_phases(self) -> None:
        """The jobs' phases from the agents, and the Rayleigh alarm (three windows held)."""
        telemetry = await self.telemetry()
        self.phases = {
            j["job_id"]: j["phase_rad"]
            for doc in telemetry.values()
            for j in doc.get("jobs", [])
            if j.get("phase_rad") is not None
        }
        if len(self.phases) >= MIN_JOBS_FOR_RAYLEIGH:
            self.alarm.update(list(self.phases.values()))

    async def _reconcile_forever(self) -> None:
        """Reconcile every `reconcile_period_s` on the event loop's monotonic clock, so a step
        of the wall clock neither stalls the lease renewals nor bunches them up."""
        while True:
            await asyncio.sleep(self.settings.reconcile_period_s)
            try:
                await self.reconcile()
            except Exception:  # the next period tries again; the leases bound the damage
                log.exception("reconciliation failed")

    async def reconcile(self) -> None:
        """Renew leases and put back what drifted: the desired state again, same generation.

        Leases are renewed from memory, so an unreachable store does not drop caps mid-event;
        events whose start or end was missed meanwhile are caught up once it answers again."""
        await self.discover()
        await self.watch_phases()
        if self.generation is not None and self.nodes:
            async with self._lock:
                if self.generation is not None and self._note_down(await self._send()):
                    assert self._target is not None
                    await self._plan_and_send(*self._target)
        await self._catch_up()

    async def _catch_up(self) -> None:
        """Start and end the events whose scheduled moment passed while the store was down."""
        now = utcnow()
        with self.session() as s:
            live = repo.list_events(s, statuses=LIVE)
        for event in live:
            if as_utc(event.end) <= now:
                await self.end_event(event.id)
            elif event.status == "pending" and as_utc(event.start) <= now:
                await self.start_event(event.id)

    # --- what the site does ----------------------------------------------------------------

    async def telemetry(self) -> dict[str, dict[str, Any]]:
        """Each reachable agent's telemetry, by node. The last round's answers while they are
        younger than `telemetry_max_age_s`; up to twice that while a new round (one at a time)
        is under way, so readers (a dashboard, plan reads) do not queue behind a round of 1000
        agents; older than that, the caller waits for the new round."""
        max_age = self.settings.telemetry_max_age_s
        age = time.monotonic() - self._telemetry_at
        if age >= max_age and (self._round is None or self._round.done()):
            self._round = asyncio.ensure_future(self._ask_telemetry())
            self._round.add_done_callback(self._keep_telemetry)
        if self._telemetry is not None and age < 2 * max_age:
            return self._telemetry
        assert self._round is not None
        return await asyncio.shield(self._round)

    def _keep_telemetry(self, round_: asyncio.Future[dict[str, dict[str, Any]]]) -> None:
        if not round_.cancelled() and round_.exception() is None:
            self._telemetry, self._telemetry_at = round_.result(), time.monotonic()

    async def _ask_telemetry(self) -> dict[str, dict[str, Any]]:
        assert self.http is not None

        async def ask(node: str, url: str) -> tuple[str, dict[str, Any] | None]:
            try:
                async with self.http.get(
                    f"{url}/v1/telemetry",  # type: ignore[union-attr]
                    timeout=aiohttp.ClientTimeout(total=3),
                ) as answer:
                    return node, (await answer.json()) if answer.status == 200 else None
            except (TimeoutError, aiohttp.ClientError, ValueError):
                return node, None

        found = await asyncio.gather(*(ask(n, u) for n, u in self.nodes.items()))
        return {node: doc for node, doc in found if doc is not None}

    async def site(self) -> dict[str, Any]:
        """GPU power of the placed jobs now (mean of the agents' recent samples), at the meter."""
        mix, k = self.mix(), self.settings.overhead_factor
        telemetry = await self.telemetry()
        measured = 0.0
        for job in mix.jobs:
            for where in job.placement or ():
                gpus = {
                    g["index"]: g["power_w"] for g in telemetry.get(where.node, {}).get("gpus", [])
                }
                measured += sum(sum(gpus[g]) / len(gpus[g]) for g in where.gpus if gpus.get(g))
        baseline = sum(j.gpus * j.power_w for j in mix.jobs if j.placement) / 1000.0
        with self.session() as s:
            active = repo.list_events(s, statuses=("active",))
        gpu_kw = measured / 1000.0
        return {
            "gpu_power_kw": gpu_kw,
            "facility_power_kw": self.settings.static_load_kw + k * gpu_kw,
            "baseline_gpu_kw": baseline,
            "baseline_facility_kw": self.settings.static_load_kw + k * baseline,
            "shed_facility_kw": k * (baseline - gpu_kw),
            "overhead_factor": k,
            "overhead_factor_stderr": self.settings.overhead_factor_stderr,
            "active_event_id": (
                max(active, key=lambda e: current_reduction(e, utcnow())).id if active else None
            ),
            "nodes_reporting": len(telemetry),
        }


def _interval(start: datetime, end: datetime, reduction_kw: float) -> dict[str, Any]:
    return {
        "start": as_utc(start).isoformat(),
        "end": as_utc(end).isoformat(),
        "reduction_kw": reduction_kw,
    }


def current_reduction(event: EventRow, now: datetime) -> float:
    """The event's target now: its interval that holds `now` (0 between or outside them)."""
    for interval in event.intervals:
        start, end = (
            datetime.fromisoformat(interval["start"]),
            datetime.fromisoformat(interval["end"]),
        )
        if start <= now < end:
            return float(interval["reduction_kw"])
    return 0.0
