"""Targets: which facility kW every node's desired state delivers, and when.

- **Hold** an event's target: planned and sent at once (`gateway.services.desiredstate`:
  planned onto the nodes that answer, within the ramp limit, stored, sent, kept; released
  over the recovery ramp), a recovery under way called off.
- **Take over** a shed the fast path holds (`gateway.services.fast`), before its caps' lease
  ends.
- **Probe** (`gateway.services.characterise`): outside targets, given caps for a few jobs,
  stored as a plan with no event, leased and renewed like any plan; `end_probe` restores every
  GPU. Holding a target ends the probe at once (the target's plan is the whole desired state),
  and a probe is refused while a target is held, caps step back or rates are spread.
- **Scatter** (`spread_rates`): every plan from then on spreads the jobs' rates by the given
  half-width; the target in force is re-planned at once. Outside events that is a plan of its
  own (no reduction, only the offsets), which ends a probe (safety before measurement), and is
  released when the spread goes back to 0.
"""

from __future__ import annotations

from typing import Any

from agents.protocol import GpuCap
from gateway.services.desiredstate import DesiredState


class Targets(DesiredState):
    probe_id: str | None = None  #: the probe whose caps are the desired state

    async def hold(
        self, facility_kw: float, event_id: str, tracking: dict[str, Any] | None = None
    ) -> None:
        """Deliver this target from now on (a recovery under way is called off); `tracking`,
        the site loop's state, is kept with the plan."""
        self._call_off_recovery()
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
        self._call_off_recovery()
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
            await self._deliver(doc, None, desired)
            return True

    async def end_probe(self, probe_id: str) -> bool:
        """Every GPU back to its original limit, unless a target took over from the probe."""
        async with self._lock:
            if self.probe_id != probe_id:
                return False
            self.probe_id = None
            await self._plan_and_send(0.0, None)
            self._forget()
            return True

    async def spread_rates(self, half_width: float) -> None:
        """Spread the jobs' rates by `half_width` from now on (0: no more), re-planning the
        target in force; outside events, one with no reduction (released at 0)."""
        self.rate_spread = half_width
        if self.recovering:
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
