"""Targets: a facility target becomes every node's desired state, and stays delivered.

- **Hold** a target: plan it (`planner.plan`) onto the nodes that answer, store the plan, send
  each node its whole desired state (caps, a new generation, a lease).
- **Unreachable nodes.** A node whose command failed after the transport's retries is planned
  as down: its jobs give nothing and the target is re-planned onto the other nodes, as far as
  their bounds allow (the rest is `shortfall_kw`). It is still sent its desired state (no
  caps), so it is seen coming back; then the target is re-planned with it again.
- **Reconcile**: the desired state again, same generation, which renews every lease and puts
  back whatever drifted (an agent that restarted, a limit changed under us). From memory: an
  unreachable store does not drop caps mid-event.
- **Release**: caps step back over `recovery_ramp_s` in `recovery_steps` plans of decreasing
  reduction, then every GPU gets its original limit; under a ramp-up limit over as long as it
  needs, a step each site loop period at most.
- **Ramp limit** (`gateway.services.ramp`): every plan's reduction moves from the one held by
  at most the limits allow; a target held back is planned again every step until reached,
  and each event's record says how its plans ramped.
- **Probe** (`gateway.services.characterise`): outside targets, given caps for a few jobs,
  stored as a plan with no event, leased and renewed like any plan; `end_probe` restores every
  GPU. Holding a target ends the probe at once (the target's plan is the whole desired state),
  and a probe is refused while a target is held, caps step back or rates are spread.
- **Scatter** (`spread_rates`): every plan from then on spreads the jobs' rates by the given
  half-width; the target in force is re-planned at once. Outside events that is a plan of its
  own (no reduction, only the offsets), which ends a probe (safety before measurement), and is
  released when the spread goes back to 0.

The nodes' answers to each plan are stored and shown by `gateway.services.answers`.
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
from flexmodel.sync import ClosedLoopResponse
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


class Targets:
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
        self._ramp: asyncio.Task[None] | None = None
        self.probe_id: str | None = None  #: the probe whose caps are the desired state
        #: the site loop as it runs on a mix (`Tracker.loop_model`, set by the tracker that
        #: drives these targets): every plan's sync verdict judges it; None: no site loop
        self.site_loop: Callable[[JobMix], ClosedLoopResponse | None] | None = None
        self.ramp = RampLimit(
            settings.ramp_down_kw_per_min, settings.ramp_up_kw_per_min, settings.meter_period_s
        )
        self.planned_at_s = 0.0  #: when the last plan was made (monotonic) [s]
        self._ramping: asyncio.Task[None] | None = None  #: a target held back, stepped on

    def stop(self) -> None:
        for task in (self._ramp, self._ramping):
            if task is not None:
                task.cancel()

    @property
    def recovering(self) -> bool:
        return self._ramp is not None and not self._ramp.done()

    async def hold(
        self, facility_kw: float, event_id: str, tracking: dict[str, Any] | None = None
    ) -> None:
        """Deliver this target from now on (a recovery under way is called off); `tracking`,
        the site loop's state, is kept with the plan."""
        if self._ramp is not None:
            self._ramp.cancel()
            self._ramp = None
        self.probe_id = None  # a target ends any probe: its plan replaces the probe's caps
        async with self._lock:
            self.probe_id = None
            await self._plan_and_send(facility_kw, event_id, tracking)

    async def take_over(self, facility_kw: float, event_id: str) -> str | None:
        """A shed the fast path holds (`gateway.services.fast`), handed to the ordinary path
        before its caps' lease ends (the site is there already, so the ramp limit counts it
        as held). With no event's target held: planned and sent at once, renewed like any
        plan, and stepped back along the up limit by `release`; returns `event_id`. With an
        event's target held that sheds less: that target planned again from the fast shed,
        stepped towards along the up limit as any plan the limit holds back; returns that
        event's id (the fast event ends into it: nothing to release). None, sending nothing,
        while a probe runs or the event in force sheds as much."""
        if self.probe_id is not None:
            return None
        held = self._target
        if held is not None and held[1] not in (None, event_id):
            target_kw, in_force, tracking = held
            if target_kw >= facility_kw:
                return None
            async with self._lock:
                self.ramp.held_kw, self.ramp.held_at_s = facility_kw, self.clock.monotonic()
                await self._plan_and_send(target_kw, in_force, tracking)
            return in_force
        if self._ramp is not None:
            self._ramp.cancel()
            self._ramp = None
        async with self._lock:
            self.ramp.held_kw, self.ramp.held_at_s = facility_kw, self.clock.monotonic()
            await self._plan_and_send(facility_kw, event_id)
        return event_id

    @property
    def busy(self) -> str | None:
        """Why no probe may start now (a target is held, caps step back), or None."""
        if self.recovering:
            return "caps are stepping back after an event"
        if self._target is not None and self._target[1] is None and self.rate_spread > 0.0:
            return "the jobs' rates are being spread (phase scattering)"
        if self._target is not None:
            return "a target is held (an event is under way)"
        return None

    async def probe(
        self, probe_id: str, desired: dict[str, list[GpuCap]], doc: dict[str, Any]
    ) -> bool:
        """Send these caps as every node's desired state for probe `probe_id` (`doc`, with the
        nodes' `commands`, is stored as its plan); False, sending nothing, when a target is
        held, caps step back, or another probe (or a target) took over."""
        async with self._lock:
            if self.busy is not None or self.probe_id not in (None, probe_id):
                return False
            self.probe_id = probe_id
            await self.fleet.discover()
            row = self._store_plan(doc, None)
            self.desired = desired
            self.generation, self.plan_id = row.generation, row.id
            self.fleet.note_answers(await self._send())
            return True

    async def end_probe(self, probe_id: str) -> bool:
        """Every GPU back to its original limit, unless a target took over from the probe."""
        async with self._lock:
            if self.probe_id != probe_id:
                return False
            self.probe_id = None
            await self._plan_and_send(0.0, None)
            self.desired, self.generation, self._target = {}, None, None
            return True

    async def spread_rates(self, half_width: float) -> None:
        """Spread the jobs' rates by `half_width` from now on (0: no more), re-planning the
        target in force; outside events, one with no reduction (released at 0)."""
        self.rate_spread = half_width
        if self._ramp is not None and not self._ramp.done():
            return  # the recovery's next step plans with it
        async with self._lock:
            if self._target is not None and self._target[1] is not None:
                await self._plan_and_send(*self._target)
                return
        if half_width > 0.0:
            async with self._lock:
                self.probe_id = None  # the spread's plan replaces a probe's caps: safety first
                await self._plan_and_send(0.0, None)
        elif self.holding and self.probe_id is None:
            self.release()

    def release(self) -> None:
        """No target any more: step the caps back (once; a release under way goes on)."""
        if not self.recovering:
            self.recovering_from = self._target[1] if self._target else None
            self._ramp = asyncio.create_task(self._recover(self._last_target_kw()))

    @property
    def held_reduction_kw(self) -> float | None:
        """What the plan held now sheds by the model [kW]: 0 with no target, None while caps
        step back (somewhere between)."""
        if self.recovering:
            return None
        if self._target is None:
            return 0.0
        short_kw = float((self.last_plan or {}).get("shortfall_kw", 0.0))
        return max(self._target[0] - short_kw, 0.0)

    @property
    def holding(self) -> bool:
        """Some node has been sent caps that still need renewing or undoing."""
        return bool(self.desired)

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
            self.desired, self.generation, self._target = {}, None, None  # nothing to renew

    async def _plan_and_send(
        self, facility_kw: float, event_id: str | None, tracking: dict[str, Any] | None = None
    ) -> None:
        """Plan the target onto the nodes that answer and send it; once more when a node went
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
            row = self._store_plan(doc, event_id)
            held = self.desired
            self.desired = {
                c["node"]: _caps(c["caps"], held.get(c["node"])) for c in doc["commands"]
            }
            self.generation, self.plan_id = row.generation, row.id
            if not self.fleet.note_answers(await self._send()):
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
        """Plan the target the ramp limit held back again every step, until it is reached."""
        if self._ramping is None or self._ramping.done():
            self._ramping = asyncio.create_task(self._ramp_on())

    async def _ramp_on(self) -> None:
        while self.ramp.limited:
            await self.clock.sleep(self.ramp.step_s)
            async with self._lock:
                if self._target is None or not self.ramp.limited:
                    return
                await self._plan_and_send(*self._target)

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
