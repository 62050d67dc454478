"""The fast path (docs/fast.md): plans armed on the agents in advance, fired by one trigger.

- **Armed plans.** For each depth of FLEXGATE_FAST_DEPTHS (percent of the site's uncapped
  facility power) the planner's own allocation (`gateway.services.planner.plan`: QoS floors,
  bounds, protected jobs, unreachable and uncappable nodes as for any event) gives every node
  its caps. They are worked out again when the job mix, its curves or the fleet change (the
  book's listener, and a check every FLEXGATE_FAST_REARM_S), and only the nodes whose armed
  caps moved are sent them, with a generation that rises (the time, in ms). A node whose plans
  did not arrive is sent them at the next check.
- **Trigger.** `trigger(depth, duration)` signs one trigger and sends it to every agent, first
  (`gateway.services.fasttriggers`); then records the fast event, or renews the one that lasts
  (`gateway.services.fastevents`).
- **Combined.** On the agents the deeper cap wins per GPU (`agents.armed`). The site loop
  holds its correction while a fast event lasts (`holding`: its steps are skipped).
- **Measured.** Each agent's report that its caps are enforced is timed from the trigger, and
  from its cause (`gateway.services.fasttriggers`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from agents.protocol import GpuCap
from agents.protocol_fast import ArmCommand, ArmedDepth, FastFired
from flexmodel.jobs import JobMix
from gateway.agentclient.fast import FastTransport
from gateway.clock import Clock
from gateway.errors import ConflictError, InvalidRequestError
from gateway.services.fastevents import FastEvents
from gateway.services.fasttriggers import TriggerSender
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.periodic import Every
from gateway.services.planner import plan
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings
from gateway.store.db import Store

log = logging.getLogger("flexgate.gateway")
#: A node's caps per depth (the depths where it gives nothing left out).
Armed = dict[float, list[GpuCap]]


def armed_plans(
    mix: JobMix,
    site_kw: float,
    depths: tuple[float, ...],
    fleet: Fleet,
    settings: GatewaySettings,
) -> tuple[dict[str, Armed], dict[float, float]]:
    """Every node's caps per depth (percent of `site_kw`, the site's uncapped facility power),
    and each depth's planned facility reduction [kW]."""
    armed: dict[str, Armed] = {}
    expected: dict[float, float] = {}
    for depth in depths:
        doc = plan(
            mix,
            depth / 100.0 * site_kw,
            set(fleet.nodes),
            settings,
            frozenset(fleet.unreachable),
            cannot_cap=fleet.cannot_cap,
        )
        expected[depth] = float(doc["achieved_facility_kw"])
        for command in doc["commands"]:
            caps = [GpuCap(gpu=c["gpu"], cap_w=c["cap_w"]) for c in command["caps"]]
            armed.setdefault(command["node"], {})
            if caps:
                armed[command["node"]][depth] = caps
    return armed, expected


class FastPath:
    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        clock: Clock,
        fleet: Fleet,
        book: JobBook,
        transport: FastTransport | None,
        *,
        release: Targets | None = None,
    ) -> None:
        """`release`: the ordinary path that steps a fast event's end back along the
        ramp-up limit, when FLEXGATE_RAMP_UP_KW_PER_MIN is set (none: the caps end at once)."""
        self.settings, self.store, self.clock = settings, store, clock
        self.fleet, self.book, self.transport = fleet, book, transport
        self.release = release if settings.ramp_up_kw_per_min is not None else None
        self.depths = settings.fast_depths_pct
        self.sent: dict[str, Armed] = {}  #: what each node acknowledged armed
        self.expected_kw: dict[float, float] = {}  #: depth -> its planned facility reduction
        self.generation = 0
        self.rearms = 0  #: checks that sent plans
        self.nodes_sent = 0  #: armed states sent, since start
        self.last_rearm_at: str | None = None  #: when plans were last sent, ISO UTC
        self.sender = TriggerSender(settings, clock, transport)
        self.events = FastEvents(store, clock, self.release)  #: the fast event in force
        self._key: tuple[Any, ...] | None = None  #: what the plans armed were worked out on
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._every = Every(clock, settings.fast_rearm_s, self.rearm, "fast plans not re-armed")

    @property
    def enabled(self) -> bool:
        return bool(self.depths) and self.transport is not None

    async def start(self) -> None:
        self.events.resume()
        if not self.enabled:
            return
        assert self.transport is not None
        await self.transport.start(self.fired)
        self._tasks.append(asyncio.create_task(self._rearm_logged()))  # armed at once
        self._every.start()

    def stop(self) -> None:
        self._every.stop()
        for task in self._tasks:
            task.cancel()
        self.events.stop()

    # --- armed plans -----------------------------------------------------------------------

    async def changed(self) -> None:
        """The job mix changed (the book's listener): re-armed now, in a task of its own (a
        10,000-node re-arm does not hold up the change's answer)."""
        if self.enabled:
            self._tasks.append(asyncio.create_task(self._rearm_logged()))

    async def _rearm_logged(self) -> None:
        try:
            await self.rearm()
        except Exception as exc:  # the next check tries again
            log.warning("fast plans not re-armed: %s", exc)

    def site_kw(self) -> float:
        """What the depths are percentages of: the site's uncapped facility power [kW]."""
        mix = self.book.mix()
        return float(mix.baseline_gpu_kw * mix.overhead_factor)

    async def rearm(self) -> int:
        """Plans worked out again if the mix, its curves or the fleet changed, or a node lacks
        its own; the nodes whose plans moved are sent theirs. How many were sent."""
        async with self._lock:
            version = (self.book.mix(), self.book.version)[1]
            fleet = self.fleet
            key = (
                version,
                tuple(sorted(fleet.nodes.items())),
                frozenset(fleet.unreachable),
                tuple(sorted(fleet.cannot_cap)),
            )
            if key == self._key:
                return 0
            self._key = None  # not settled while the plans are worked out and sent
            armed, self.expected_kw = armed_plans(
                self.book.mix(), self.site_kw(), self.depths, self.fleet, self.settings
            )
            moved = [n for n, a in sorted(armed.items()) if a != self.sent.get(n, {})]
            errors = await self._send(moved, armed) if moved else []
            missing = [n for n, e in zip(moved, errors, strict=True) if e is not None]
            self._key = None if missing else key
            for node, error in zip(moved, errors, strict=True):
                if error is None:
                    self.sent[node] = armed[node]
                else:
                    log.warning("fast plans not armed on %s: %s", node, error)
            return len(moved)

    async def _send(self, nodes: list[str], armed: dict[str, Armed]) -> list[str | None]:
        assert self.transport is not None
        self.generation = max(self.generation + 1, int(self.clock.now().timestamp() * 1000))
        targets = [
            (
                node,
                self.fleet.nodes[node],
                ArmCommand(
                    generation=self.generation,
                    depths=[
                        ArmedDepth(depth_pct=d, caps=caps)
                        for d, caps in sorted(armed[node].items())
                    ],
                ),
            )
            for node in nodes
        ]
        self.rearms += 1
        self.nodes_sent += len(targets)
        self.last_rearm_at = self.clock.now().isoformat()
        return await self.transport.arm_many(targets)

    def doc(self) -> dict[str, Any]:
        """The armed plans as `/v1/fast/armed` shows them."""
        return {
            "enabled": self.enabled,
            "depths_pct": list(self.depths),
            "generation": self.generation,
            "expected_reduction_kw": {f"{d:g}": kw for d, kw in self.expected_kw.items()},
            "armed_nodes": {
                f"{d:g}": sum(1 for a in self.sent.values() if d in a) for d in self.depths
            },
            "nodes_sent": self.nodes_sent,
            "last_rearm_at": self.last_rearm_at,
            "settled": self._key is not None,
            "holding": self.holding,
        }

    # --- triggers --------------------------------------------------------------------------

    async def trigger(
        self,
        depth_pct: float,
        duration_s: float,
        cause: str | None = None,
        external_id: str | None = None,
        since_s: float | None = None,
    ) -> dict[str, Any]:
        """Every node to its caps armed at `depth_pct` for `duration_s`, now; `cause` (what
        fired it, when not the API) goes in the event's reason, `external_id` (the grid
        protocol's event it answers) on its record; `since_s` (monotonic), when the cause
        began (the frequency's crossing): the agents' reports are timed from it too. While a
        fast event lasts the trigger renews it: no new event."""
        self._check(depth_pct)
        addresses = list(self.fleet.nodes.values())
        sent = await self.sender.send(depth_pct, duration_s, addresses, since_s)
        reduction_kw = self.expected_kw.get(depth_pct, 0.0)
        event, renewal = self.events.fire(
            sent["seq"], depth_pct, duration_s, reduction_kw, cause, external_id
        )
        sent["event_id"], sent["renewal"] = event.id, renewal
        return {
            "event_id": event.id,
            "seq": sent["seq"],
            "depth_pct": depth_pct,
            "duration_s": duration_s,
            "expected_reduction_kw": round(reduction_kw, 3),
            "armed_nodes": sum(1 for a in self.sent.values() if depth_pct in a),
            "renewal": renewal,
        }

    def _check(self, depth_pct: float) -> None:
        if not self.enabled:
            raise ConflictError("the fast path is off: FLEXGATE_FAST_DEPTHS is empty")
        if depth_pct not in self.depths:
            armed = ", ".join(f"{d:g}" for d in self.depths)
            raise InvalidRequestError(f"depth {depth_pct:g}% is not armed (armed: {armed} %)")

    @property
    def triggers(self) -> deque[dict[str, Any]]:
        """The last triggers sent with their agents' reports (`GET /v1/fast/triggers`)."""
        return self.sender.triggers

    @property
    def latency(self) -> Histogram:
        """Trigger to each agent's caps enforced [s]."""
        return self.sender.latency

    def register(self, registry: CollectorRegistry) -> None:
        """The latency histograms on the gateway's `/metrics`."""
        self.sender.register(registry)

    def fired(self, report: FastFired, arrived_s: float) -> None:
        """An agent's report of caps enforced (the transport's listener)."""
        self.sender.fired(report, arrived_s)

    # --- the fast event in force -----------------------------------------------------------

    @property
    def holding(self) -> bool:
        """Whether a fast event lasts now (the site loop holds its correction)."""
        return self.events.holding

    @property
    def until_s(self) -> float | None:
        """When the fast event in force ends (monotonic) [s]."""
        return self.events.until_s

    @until_s.setter
    def until_s(self, until_s: float | None) -> None:
        self.events.until_s = until_s

    def hold(self, step: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """The site loop's step, skipped while a fast event lasts: the loop neither integrates
        the fast event's drop nor fights it, and takes up where it was after."""

        async def held() -> None:
            if not self.holding:
                await step()

        return held
