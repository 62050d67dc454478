"""Reconciliation, like a Kubernetes controller: every `reconcile_period_s`, compare what
should be with what is and act.

Each round looks for agents that have not answered yet, reads the jobs' phases (and lets the
scatterer act on them: `gateway.services.scattering`), sends every
node its desired state again (renewing the leases) and catches up event starts and ends
missed while the store was down. The period counts on the clock's monotonic time, so a step
of the wall clock neither stalls the lease renewals nor bunches them up.
"""

from __future__ import annotations

from gateway.clock import Clock
from gateway.services.events import Events
from gateway.services.fleet import Fleet
from gateway.services.periodic import Every
from gateway.services.scattering import Scatterer
from gateway.services.targets import Targets


class Reconciler:
    def __init__(
        self,
        period_s: float,
        clock: Clock,
        fleet: Fleet,
        targets: Targets,
        events: Events,
        scatterer: Scatterer,
    ) -> None:
        self.period_s, self.clock = period_s, clock
        self.fleet, self.targets, self.events = fleet, targets, events
        self.scatterer = scatterer
        # A round that fails is tried again the next period; the leases bound the damage.
        self._every = Every(clock, period_s, self.reconcile, "reconciliation failed")

    def start(self) -> None:
        self._every.start()

    def stop(self) -> None:
        self._every.stop()

    async def reconcile(self) -> None:
        await self.fleet.discover()
        await self.fleet.watch_phases()
        await self.scatterer.step()
        await self.targets.reconcile()
        await self.events.catch_up()
