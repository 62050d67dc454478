"""The fast path's triggers (docs/fast.md): each signed and sent to every agent at once, kept
with its agents' reports, and those reports timed.

- **Sent.** One `FastTrigger` (HMAC by FLEXGATE_FAST_SECRET, a sequence that rises, the time
  sent) to every agent (one NATS message); the broker not taking it is `TriggerNotSentError`,
  and nothing is kept.
- **Measured.** Each agent's report that its caps are enforced (`FastFired`) is timed from the
  trigger into the `flexgate_fast_trigger_to_enforced_seconds` histogram, and for a trigger
  given the time its cause began (the frequency's crossing), from then into
  `flexgate_fast_crossing_to_enforced_seconds`; the last TRIGGERS_KEPT triggers count their
  reports (`GET /v1/fast/triggers`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from agents.protocol_fast import FastFired, FastTrigger, sign
from gateway.agentclient import AgentUnreachableError
from gateway.agentclient.fast import FastTransport
from gateway.clock import Clock
from gateway.errors import GatewayError
from gateway.settingsgroups.fast import FastSettings

#: Trigger-to-enforced buckets [s]: the targets are 0.1 s (1,000 nodes) and 0.5 s (10,000).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Triggers kept in memory with their agents' reports, newest last.
TRIGGERS_KEPT = 100
#: Reports come within seconds: the triggers of the last 1,000 s are timed (seq is in µs).
TIMED_SEQ_SPAN = 10**9


class TriggerNotSentError(GatewayError):
    """The transport could not send the trigger (the broker is down)."""

    status_code = 503


class TriggerSender:
    def __init__(
        self, settings: FastSettings, clock: Clock, transport: FastTransport | None
    ) -> None:
        self.settings, self.clock, self.transport = settings, clock, transport
        self.last_seq = 0
        self._sent_at: dict[int, float] = {}  #: trigger seq -> when it was sent (monotonic)
        self._since: dict[int, float] = {}  #: trigger seq -> when its cause began (monotonic)
        #: the last TRIGGERS_KEPT triggers with their agents' reports (`GET /v1/fast/triggers`)
        self.triggers: deque[dict[str, Any]] = deque(maxlen=TRIGGERS_KEPT)
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

    def register(self, registry: CollectorRegistry) -> None:
        """The latency histograms on the gateway's `/metrics`."""
        registry.register(self.latency)
        registry.register(self.latency_from_crossing)

    async def send(
        self, depth_pct: float, duration_s: float, addresses: list[str], since_s: float | None
    ) -> dict[str, Any]:
        """The trigger signed and sent to the agents at `addresses`; what `triggers` keeps of
        it (its `event_id` and `renewal` for the caller to fill in). `since_s` (monotonic):
        when its cause began, the agents' reports timed from then too."""
        assert self.transport is not None
        assert self.settings.fast_secret is not None
        now = self.clock.now()
        seq = self.last_seq = max(self.last_seq + 1, int(now.timestamp() * 1_000_000))
        body = FastTrigger(
            seq=seq, sent_at_s=now.timestamp(), depth_pct=depth_pct, duration_s=duration_s
        ).model_dump_json()
        self._sent_at = {k: v for k, v in self._sent_at.items() if k >= seq - TIMED_SEQ_SPAN}
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
        self._since = {k: v for k, v in self._since.items() if k >= seq - TIMED_SEQ_SPAN}
        if since_s is not None:
            self._since[seq] = since_s
        try:
            await self.transport.trigger(
                body.encode(),
                sign(self.settings.fast_secret.get_secret_value(), body.encode()),
                addresses,
            )
        except AgentUnreachableError as exc:
            self.triggers.remove(sent)
            raise TriggerNotSentError(f"the trigger was not sent, nothing changed: {exc}") from exc
        return sent

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
