"""Every node's desired state: a facility kW planned onto the nodes, stored, sent, kept.

- **Plan and send** (`_plan_and_send`): plan the kW (`planner.plan`) onto the nodes that
  answer, store the plan with the next generation, send each node its whole desired state
  (caps, the generation, a lease).
- **Unreachable nodes.** A node whose command failed after the transport's retries is planned
  as down: its jobs give nothing and the kW is re-planned onto the other nodes, as far as
  their bounds allow (the rest is `shortfall_kw`). It is still sent its desired state (no
  caps), so it is seen coming back; then the kW is re-planned with it again.
- **Reconcile**: the desired state again, same generation, which renews every lease and puts
  back whatever drifted (an agent that restarted, a limit changed under us). From memory: an
  unreachable store does not drop caps mid-event.
- **Release**: caps step back over `recovery_ramp_s` in `recovery_steps` plans of decreasing
  reduction, then every GPU gets its original limit; under a ramp-up limit over as long as it
  needs, a step each site loop period at most.
- **Ramp limit** (`gateway.services.ramp`): every plan's reduction moves from the one held by
  at most the limits allow; a kW held back is planned again every step until reached, and
  each event's record says how its plans ramped.

The nodes' answers to each plan are stored and shown by `gateway.services.answers`; which kW
is held when (an event's target, a probe, the rates spread): `gateway.services.targets`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import OperationalError

from agents.protocol import CapCommand, GpuCap
from flexmodel.jobs import JobMix
from flexmodel.loopresponse import ClosedLoopResponse
from gateway.agentclient import Ack, AgentClient, fan_out
from gateway.clock import Clock
from gateway.services.answers import PlanAnswers, dumps
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.planner import plan
from gateway.services.ramp import RampLimit
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import PlanRow, as_utc
from gateway.units import rounded

log = logging.getLogger("flexgate.gateway")


class DesiredState:
    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        clock: Clock,
        client: AgentClient,
        fleet: Fleet,
        book: JobBook,
        site: SitePower,
    ) -> None:
        self.settings, self.store, self.clock = settings, store, clock
        self.client, self.fleet, self.book, self.site = client, fleet, book, site
        self.desired: dict[str, list[GpuCap]] = {}  #: node id -> its caps
        self.generation: int | None = None
        self.plan_id: str | None = None
        self.fan_outs = 0  #: desired states sent to every node, since start
        self.fan_outs_finished = 0  #: of those, the ones that ended (their answers recorded)
        self.last_plan: dict[str, Any] | None = None  #: the plan last sent
        self.answers = PlanAnswers(store)
        self.recovering_from: str | None = None  #: the event whose caps are stepping back
        self.rate_spread = 0.0  #: half-width of the rate offsets every plan applies
        #: (facility kW, event id, the site loop's state) last planned
        self._target: tuple[float, str | None, dict[str, Any] | None] | None = None
        self._lock = asyncio.Lock()
        self._recovery: asyncio.Task[None] | None = None
        #: the site loop as it runs on a mix (`Tracker.loop_model`, set by the tracker that
        #: drives these targets): every plan's sync verdict judges it; None: no site loop
        self.site_loop: Callable[[JobMix], ClosedLoopResponse | None] | None = None
        self.ramp = RampLimit(
            settings.ramp_down_kw_per_min, settings.ramp_up_kw_per_min, settings.meter_period_s
        )
        self.planned_at_s = 0.0  #: when the last plan was made (monotonic) [s]
        self._ramping: asyncio.Task[None] | None = None  #: a kW held back, stepped on

    def stop(self) -> None:
        for task in (self._recovery, self._ramping):
            if task is not None:
                task.cancel()

    @property
    def recovering(self) -> bool:
        return self._recovery is not None and not self._recovery.done()

    @property
    def holding(self) -> bool:
        """Some node has been sent caps that still need renewing or undoing."""
        return bool(self.desired)

    def release(self) -> None:
        """No target any more: step the caps back (once; a release under way goes on)."""
        if not self.recovering:
            self.recovering_from = self._target[1] if self._target else None
            self._recovery = asyncio.create_task(self._recover(self._last_target_kw()))

    def _call_off_recovery(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
            self._recovery = None

    def _forget(self) -> None:
        """Every GPU is back at its original limit: nothing to renew."""
        self.desired, self.generation, self._target = {}, None, None

    def _last_target_kw(self) -> float:
        if self.plan_id is None:
            return 0.0
        with self.store.session() as s:
            row = repo.get_plan(s, plan_id=self.plan_id)
        return float(row.doc["requested_facility_kw"]) if row else 0.0

    async def _recover(self, from_kw: float) -> None:
        steps = self.settings.recovery_steps
        pause = self.settings.recovery_ramp_s / steps
        if self.ramp.up_kw_per_min is not None:  # at the up limit's pace at most, a step a period
            release_s = max(self.ramp.minimum_release_s(from_kw), self.settings.recovery_ramp_s)
            steps = max(steps, math.ceil(release_s / self.ramp.step_s))
            pause = release_s / steps
        for k in range(1, steps):
            await self.clock.sleep(pause)
            async with self._lock:
                await self._plan_and_send(from_kw * (1 - k / steps), None)
        await self.clock.sleep(pause)
        async with self._lock:
            await self._plan_and_send(0.0, None)
            self._forget()

    async def _plan_and_send(
        self, facility_kw: float, event_id: str | None, tracking: dict[str, Any] | None = None
    ) -> None:
        """Plan the kW onto the nodes that answer and send it; once more when a node went
        down or came back meanwhile."""
        await self.fleet.discover()
        self._target = (facility_kw, event_id, tracking)
        self.planned_at_s = self.clock.monotonic()
        if self.ramp.active and self.ramp.held_at_s is None:
            self.ramp.held_kw = self._stored_reduction_kw()
        planned_kw = self.ramp.bound(facility_kw, self.planned_at_s)
        self.ramp.note(
            event_id or (self.recovering_from if self.recovering else None),
            self.planned_at_s,
            planned_kw,
        )
        if self.ramp.limited:
            self._step_on()
        for _ in range(2):
            mix = self.book.mix()
            doc = plan(
                mix,
                planned_kw,
                set(self.fleet.nodes),
                self.settings,
                frozenset(self.fleet.unreachable),
                self.fleet.loop_measurements(),
                self.rate_spread,
                self.site_loop(mix) if self.site_loop else None,
                self.fleet.cannot_cap,
            )
            if self.ramp.active:
                doc["ramp"] = self.ramp.doc(facility_kw)
                doc["shortfall_kw"] = max(facility_kw - doc["achieved_facility_kw"], 0.0)
            if tracking is not None:
                doc["tracking"] = tracking
            held = self.desired
            desired = {c["node"]: _caps(c["caps"], held.get(c["node"])) for c in doc["commands"]}
            if not await self._deliver(doc, event_id, desired):
                return

    def _stored_reduction_kw(self) -> float:
        """The reduction of the newest stored plan while the agents may still hold its caps
        (sent within a lease): where this gateway's first plan starts from [kW]."""
        with self.store.session() as s:
            row = repo.newest_plan(s)
        if row is None or (self.clock.now() - as_utc(row.created_at)).total_seconds() > (
            self.settings.lease_s
        ):
            return 0.0
        return float(row.doc.get("requested_facility_kw", 0.0))

    def _step_on(self) -> None:
        """Plan the kW the ramp limit held back again every step, until it is reached."""
        if self._ramping is None or self._ramping.done():
            self._ramping = asyncio.create_task(self._ramp_on())

    async def _ramp_on(self) -> None:
        while self.ramp.limited:
            await self.clock.sleep(self.ramp.step_s)
            async with self._lock:
                if self._target is None or not self.ramp.limited:
                    return
                await self._plan_and_send(*self._target)

    async def _deliver(
        self, doc: dict[str, Any], event_id: str | None, desired: dict[str, list[GpuCap]]
    ) -> bool:
        """Store the plan, make `desired` every node's desired state and send it; whether a
        node went down or came back (or may cap no more, or again)."""
        row = self._store_plan(doc, event_id)
        self.desired = desired
        self.generation, self.plan_id = row.generation, row.id
        return self.fleet.note_answers(await self._send())

    def _store_plan(self, doc: dict[str, Any], event_id: str | None) -> PlanRow:
        """The plan, stored with the next generation before it is sent."""
        self.last_plan = doc
        with self.store.session() as s:
            row = PlanRow(
                id=f"plan-{uuid.uuid4().hex[:12]}",
                event_id=event_id,
                generation=repo.next_generation(s),
                doc=doc,
                created_at=self.clock.now(),
            )
            repo.add_plan(s, plan=row)
            if event_id is not None:
                repo.link_plan(s, event_id=event_id, plan_id=row.id)
            s.commit()
        return row

    async def _send(self) -> list[Ack]:
        assert self.generation is not None
        assert self.plan_id is not None
        targets = [
            (
                node,
                address,
                CapCommand(
                    plan_id=self.plan_id,
                    generation=self.generation,
                    lease_s=self.settings.lease_s,
                    caps=self.desired.get(node, []),
                ),
            )
            for node, address in sorted(self.fleet.nodes.items())
        ]
        self.fan_outs += 1
        try:
            acks = await fan_out(self.client, targets)
        finally:  # ended, answered or not: the answers are recorded below before another task runs
            self.fan_outs_finished += 1
        try:
            self.answers.record(self.plan_id, self.generation, acks)
        except OperationalError as exc:  # the agents have their caps; only the record is missing
            log.warning("store unreachable: %d acks not recorded (%s)", len(acks), exc)
        return acks

    async def reconcile(self) -> None:
        """Renew leases and put back what drifted: the desired state again, same generation;
        re-planned when a node went down or came back."""
        if self.generation is None or not self.fleet.nodes:
            return
        async with self._lock:
            changed = self.generation is not None and self.fleet.note_answers(await self._send())
            if changed and self._target is not None:  # a probe's caps are not re-planned
                await self._plan_and_send(*self._target)

    async def plan_doc(self, plan_id: str) -> dict[str, Any]:
        """A stored plan with each node's last answer; for the current plan, what is shed now."""
        return {**self.answers.doc(plan_id), "achieved_facility_kw": await self._shed(plan_id)}

    async def plan_json(self, plan_id: str) -> bytes:
        """`plan_doc` as the API answers it (`PlanAnswers.json`, kept between fan-outs); only
        what is shed now is read anew at each call."""
        kept = self.answers.json(plan_id, current=plan_id == self.plan_id)
        shed = rounded({"achieved_facility_kw": await self._shed(plan_id)})
        return (dumps(shed)[:-1] + "," + kept[1:]).encode()

    async def _shed(self, plan_id: str) -> float | None:
        """What the site sheds now, for the current plan; None for the others."""
        return (await self.site.doc())["shed_facility_kw"] if plan_id == self.plan_id else None


def _caps(planned: list[dict[str, Any]], held: list[GpuCap] | None) -> list[GpuCap]:
    """A node's planned caps as commands carry them: the ones it holds when none moved (a
    re-plan at 10,000 nodes moves a few thousand; the rest keep theirs, not 8 made anew)."""
    if held is not None and [(c.gpu, c.cap_w) for c in held] == [
        (x["gpu"], x["cap_w"]) for x in planned
    ]:
        return held
    return [GpuCap(gpu=x["gpu"], cap_w=x["cap_w"]) for x in planned]
