"""The fast path (docs/fast.md): plans armed on the agents in advance, fired by one trigger.

- **Armed plans.** For each depth of FLEXGATE_FAST_DEPTHS (percent of the site's uncapped
  facility power) the planner's own allocation (`gateway.services.planner.plan`: QoS floors,
  bounds, protected jobs, unreachable and uncappable nodes as for any event) gives every node
  its caps. They are worked out again when the job mix, its curves or the fleet change (the
  book's listener, and a check every FLEXGATE_FAST_REARM_S), and only the nodes whose armed
  caps moved are sent them, with a generation that rises (the time, in ms). A node whose plans
  did not arrive is sent them at the next check.
- **Trigger.** `trigger(depth, duration)` signs one `FastTrigger` (HMAC by FLEXGATE_FAST_SECRET,
  a sequence that rises, the time sent) and sends it to every agent (one NATS message), first;
  then records the fast event (source `fast`, status `triggered`, `completed` at its end; a
  restarted gateway completes the ones over and holds the others). Its status is no live
  status: the event scheduler never plans it; the agents hold its caps for its duration by
  their lease, whatever happens to the gateway.
- **Combined.** On the agents the deeper cap wins per GPU (`agents.armed`). The site loop
  holds its correction while a fast event lasts (`holding`: its steps are skipped).
- **Measured.** Each agent's report that its caps are enforced (`FastFired`) is timed from the
  trigger into the `flexgate_fast_trigger_to_enforced_seconds` histogram, and for a trigger
  given the time its cause began (the frequency's crossing), from then into
  `flexgate_fast_crossing_to_enforced_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from agents.protocol import GpuCap
from agents.protocol_fast import ArmCommand, ArmedDepth, FastFired, FastTrigger, sign
from gateway.agentclient import AgentUnreachableError
from gateway.agentclient.fast import FastTransport
from gateway.clock import Clock
from gateway.errors import ConflictError, GatewayError, InvalidRequestError
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.periodic import Every
from gateway.services.planner import plan
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import EventRow, as_utc

log = logging.getLogger("flexgate.gateway")
#: Trigger-to-enforced buckets [s]: the targets are 0.1 s (1,000 nodes) and 0.5 s (10,000).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: With a ramp-up limit, the ordinary path takes a fast event's shed over this long before
#: its end (half the event's length if shorter): time to plan and send it to every node [s].
RELEASE_LEAD_S = 5.0
#: Triggers kept in memory with their agents' reports, newest last.
TRIGGERS_KEPT = 100
#: A node's caps per depth (the depths where it gives nothing left out).
Armed = dict[float, list[GpuCap]]


class TriggerNotSentError(GatewayError):
    """The transport could not send the trigger (the broker is down)."""

    status_code = 503


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
        self.depth_pct: float | None = None  #: the depth of the last trigger
        self.duration_s = 0.0  #: the last trigger's length [s]
        self.depth_kw = 0.0  #: the last trigger's planned reduction at the meter [kW]
        self.depths = settings.fast_depths_pct
        self.sent: dict[str, Armed] = {}  #: what each node acknowledged armed
        self.expected_kw: dict[float, float] = {}  #: depth -> its planned facility reduction
        self.generation = 0
        self.rearms = 0  #: checks that sent plans
        self.nodes_sent = 0  #: armed states sent, since start
        self.last_seq = 0
        self.until_s: float | None = None  #: the fast event in force ends (monotonic) [s]
        self.current: str | None = None  #: the fast event in force (or last), its id
        self._sent_at: dict[int, float] = {}  #: trigger seq -> when it was sent (monotonic)
        #: the last TRIGGERS_KEPT triggers with their agents' reports (`GET /v1/fast/triggers`)
        self.triggers: deque[dict[str, Any]] = deque(maxlen=TRIGGERS_KEPT)
        self.last_rearm_at: str | None = None  #: when plans were last sent, ISO UTC
        self._since: dict[int, float] = {}  #: trigger seq -> when its cause began (monotonic)
        self._key: tuple[Any, ...] | None = None  #: what the plans armed were worked out on
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._every = Every(clock, settings.fast_rearm_s, self.rearm, "fast plans not re-armed")
        self.latency = Histogram(
            "flexgate_fast_trigger_to_enforced_seconds",
            "Fast trigger sent to an agent's caps enforced (per agent report).",
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.latency_from_crossing = Histogram(
            "flexgate_fast_crossing_to_enforced_seconds",
            "The frequency's crossing to an agent's caps enforced (per agent report, for the "
            "first trigger of each excursion).",
            buckets=LATENCY_BUCKETS,
            registry=None,
        )

    @property
    def enabled(self) -> bool:
        return bool(self.depths) and self.transport is not None

    def register(self, registry: CollectorRegistry) -> None:
        """The latency histograms on the gateway's `/metrics`."""
        registry.register(self.latency)
        registry.register(self.latency_from_crossing)

    async def start(self) -> None:
        self._resume()
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

    def plans(self) -> tuple[dict[str, Armed], dict[float, float]]:
        """Every node's caps per depth, and each depth's planned facility reduction [kW]."""
        mix = self.book.mix()
        site_kw = self.site_kw()
        armed: dict[str, Armed] = {}
        expected: dict[float, float] = {}
        for depth in self.depths:
            doc = plan(
                mix,
                depth / 100.0 * site_kw,
                set(self.fleet.nodes),
                self.settings,
                frozenset(self.fleet.unreachable),
                cannot_cap=self.fleet.cannot_cap,
            )
            expected[depth] = float(doc["achieved_facility_kw"])
            for command in doc["commands"]:
                caps = [GpuCap(gpu=c["gpu"], cap_w=c["cap_w"]) for c in command["caps"]]
                armed.setdefault(command["node"], {})
                if caps:
                    armed[command["node"]][depth] = caps
        return armed, expected

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
            armed, self.expected_kw = self.plans()
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
        fast event lasts the trigger renews it (`_renew`): no new event."""
        self._check(depth_pct)
        assert self.transport is not None
        assert self.settings.fast_secret is not None
        now = self.clock.now()
        seq = self.last_seq = max(self.last_seq + 1, int(now.timestamp() * 1_000_000))
        body = FastTrigger(
            seq=seq, sent_at_s=now.timestamp(), depth_pct=depth_pct, duration_s=duration_s
        ).model_dump_json()
        # Reports come within seconds: the triggers of the last 1,000 s are kept (seq is in µs).
        self._sent_at = {k: v for k, v in self._sent_at.items() if k >= seq - 10**9}
        self._sent_at[seq] = self.clock.monotonic()
        # Kept before it is sent: the agents' reports may come back before the send returns.
        sent: dict[str, Any] = {
            "seq": seq,
            "event_id": None,  #: known once recorded
            "depth_pct": depth_pct,
            "sent_at": now.isoformat(),
            "renewal": False,
            "reports": 0,  #: agents' reports (a process over NATS, a node otherwise)
            "nodes_applied": 0,  #: nodes that put their armed caps on
            "failed_gpus": 0,
            "first_enforced_s": None,  #: trigger to the first report [s]
            "enforced_s": None,  #: trigger to the last report so far [s]
        }
        self.triggers.append(sent)
        self._since = {k: v for k, v in self._since.items() if k >= seq - 10**9}
        if since_s is not None:
            self._since[seq] = since_s
        try:
            await self.transport.trigger(
                body.encode(),
                sign(self.settings.fast_secret.get_secret_value(), body.encode()),
                list(self.fleet.nodes.values()),
            )
        except AgentUnreachableError as exc:
            self.triggers.remove(sent)
            raise TriggerNotSentError(f"the trigger was not sent, nothing changed: {exc}") from exc
        running = self.current if self.holding else None
        self.until_s = self.clock.monotonic() + duration_s  # the agents hold the last trigger's
        self.depth_pct, self.duration_s = depth_pct, duration_s
        self.depth_kw = self.expected_kw.get(depth_pct, 0.0)
        if running is not None:
            event = self._renew(running, seq, depth_pct, duration_s)
        else:
            reason = f"fast trigger at {depth_pct:g}% of the site" + (f": {cause}" if cause else "")
            event = self._record(seq, depth_pct, duration_s, reason, external_id)
            self.current = event.id
            self._tasks.append(asyncio.create_task(self._complete(event.id)))
            if self.release is not None:
                self._tasks.append(asyncio.create_task(self._ramped_release(event.id)))
        sent["event_id"], sent["renewal"] = event.id, running is not None
        return {
            "event_id": event.id,
            "seq": seq,
            "depth_pct": depth_pct,
            "duration_s": duration_s,
            "expected_reduction_kw": round(self.expected_kw.get(depth_pct, 0.0), 3),
            "armed_nodes": sum(1 for a in self.sent.values() if depth_pct in a),
            "renewal": running is not None,
        }

    def _check(self, depth_pct: float) -> None:
        if not self.enabled:
            raise ConflictError("the fast path is off: FLEXGATE_FAST_DEPTHS is empty")
        if depth_pct not in self.depths:
            armed = ", ".join(f"{d:g}" for d in self.depths)
            raise InvalidRequestError(f"depth {depth_pct:g}% is not armed (armed: {armed} %)")

    def _interval(self, seq: int, depth_pct: float, duration_s: float) -> dict[str, Any]:
        """A stretch of a fast event at one depth, as its record keeps it: the triggers that
        started and renewed it."""
        now = self.clock.now()
        return {
            "start": now.isoformat(),
            "end": (now + timedelta(seconds=duration_s)).isoformat(),
            "reduction_kw": round(self.expected_kw.get(depth_pct, 0.0), 3),
            "depth_pct": depth_pct,
            "triggers": [{"seq": seq, "at": now.isoformat()}],
        }

    def _record(
        self,
        seq: int,
        depth_pct: float,
        duration_s: float,
        reason: str,
        external_id: str | None = None,
    ) -> EventRow:
        now = self.clock.now()
        interval = self._interval(seq, depth_pct, duration_s)
        event = EventRow(
            id=f"fast-{seq}",
            source="fast",
            status="triggered",
            start=now,
            end=datetime.fromisoformat(interval["end"]),
            reduction_kw=interval["reduction_kw"],
            intervals=[interval],
            reason=reason,
            external_id=external_id,
            created_at=now,
        )
        with self.store.session() as s:
            repo.add_event(s, event=event)
            s.commit()
        return event

    def _renew(self, event_id: str, seq: int, depth_pct: float, duration_s: float) -> EventRow:
        """A trigger while fast event `event_id` lasts: the event now ends with this trigger
        (the agents hold its lease). At the depth in force its stretch is renewed (the
        trigger added to it); at another depth (deeper, or shallower as a droop's frequency
        recovers) a new stretch starts now; the event's `reduction_kw` is its deepest."""
        interval = self._interval(seq, depth_pct, duration_s)
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
            assert event is not None, f"the fast event {event_id} in force is not stored"
            stretches = [dict(i) for i in event.intervals]
            last = stretches[-1]
            if last.get("depth_pct") == depth_pct:
                last["end"] = interval["end"]
                last["triggers"] = [*last.get("triggers", []), *interval["triggers"]]
            else:
                last["end"] = interval["start"]
                stretches.append(interval)
            event.intervals = stretches  # a new list: the JSON column is written again
            event.end = datetime.fromisoformat(interval["end"])
            event.reduction_kw = max(float(i["reduction_kw"]) for i in stretches)
            s.add(event)
            s.commit()
            s.refresh(event)
        return event

    def _resume(self) -> None:
        """Fast events a previous run recorded: completed when over, else held (the site loop
        too) and completed at their end. The agents held their caps by their lease meanwhile."""
        now = self.clock.now()
        with self.store.session() as s:
            fast = [e for e in repo.list_events(s, statuses=("triggered",)) if e.source == "fast"]
        for event in fast:
            left_s = (as_utc(event.end) - now).total_seconds()
            if left_s > 0.0 and left_s > (self.until_s or 0.0) - self.clock.monotonic():
                self.until_s = self.clock.monotonic() + left_s
                self.current = event.id
                last = event.intervals[-1]
                self.depth_pct, self.duration_s = last.get("depth_pct"), left_s
                self.depth_kw = float(last["reduction_kw"])
            self._tasks.append(asyncio.create_task(self._complete(event.id)))
        if self.current is not None and self.release is not None:
            self._tasks.append(asyncio.create_task(self._ramped_release(self.current)))

    async def _complete(self, event_id: str) -> None:
        """Completed at its end; renewals move the end on, so it is read again on waking."""
        while True:
            with self.store.session() as s:
                event = repo.get_event(s, event_id=event_id)
                if event is None:
                    return
                left_s = (as_utc(event.end) - self.clock.now()).total_seconds()
                if left_s <= 0.0:
                    event.status = "completed"
                    s.add(event)
                    s.commit()
                    break
            await self.clock.sleep(left_s)
        if self.current == event_id:
            self.current = None

    async def _ramped_release(self, event_id: str) -> None:
        """The end of fast event `event_id` along the ramp-up limit: RELEASE_LEAD_S before
        its caps' lease ends (half its length, if shorter) the ordinary path takes over its
        shed (`Targets.take_over`: the same reduction, planned and sent as an ordinary plan
        each agent holds under the fast caps), then at the end steps it back at the limit
        (`Targets.release`). A renewal moves both on; a deeper one is taken over again."""
        assert self.release is not None
        taken_kw: float | None = None
        try:
            while self.until_s is not None and self.current == event_id:
                left_s = self.until_s - self.clock.monotonic()
                lead_s = min(RELEASE_LEAD_S, self.duration_s / 2.0)
                if left_s <= 0.0:
                    break
                kw = self.depth_kw
                if taken_kw is None or kw > taken_kw:
                    if left_s > lead_s + 1e-6:  # (not woken again by a rounding's worth)
                        await self.clock.sleep(left_s - lead_s)
                        continue  # read again: a renewal may have moved the end
                    taken = await self.release.take_over(kw, event_id)
                    if taken is None:
                        log.info("fast event %s ends into the event in force", event_id)
                        return
                    if taken != event_id:
                        log.info("fast event %s ends into event %s along the ramp", event_id, taken)
                        return
                    taken_kw = kw
                await self.clock.sleep(left_s)
            if taken_kw is not None:
                self.release.release()
        except Exception:  # the agents' leases end the caps regardless
            log.exception("fast event %s: its ramped release failed", event_id)

    def fired(self, report: FastFired, arrived_s: float) -> None:
        """An agent's report of caps enforced, timed from its trigger."""
        sent_s = self._sent_at.get(report.seq)
        since_s = self._since.get(report.seq)
        if since_s is not None:
            self.latency_from_crossing.observe(max(arrived_s - since_s, 0.0))
        if sent_s is None:
            return
        elapsed_s = max(arrived_s - sent_s, 0.0)
        self.latency.observe(elapsed_s)
        for trigger in reversed(self.triggers):
            if trigger["seq"] == report.seq:
                trigger["reports"] += 1
                trigger["nodes_applied"] += report.applied
                trigger["failed_gpus"] += report.failed_gpus
                if trigger["first_enforced_s"] is None:
                    trigger["first_enforced_s"] = elapsed_s
                trigger["enforced_s"] = max(trigger["enforced_s"] or 0.0, elapsed_s)
                break

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

    @property
    def holding(self) -> bool:
        """Whether a fast event lasts now (the site loop holds its correction)."""
        return self.until_s is not None and self.clock.monotonic() < self.until_s

    def hold(self, step: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """The site loop's step, skipped while a fast event lasts: the loop neither integrates
        the fast event's drop nor fights it, and takes up where it was after."""

        async def held() -> None:
            if not self.holding:
                await step()

        return held
