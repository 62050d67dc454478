"""The agents the gateway knows: found, and whether each answers and may cap.

- **Discovery**: each configured agent address is asked who it is until it answers; its node
  id is remembered (and stored, with when it was last seen), with its GPU backend and its
  power sensor's lag.
- **Unreachable nodes**: those whose last command failed (after the transport's retries).
- **Nodes that cannot cap**: an agent whose health or last answer says `can_cap: false` (NVML
  refused it a set for permission) is kept in `cannot_cap` with its reason; plans and quotes
  leave its GPUs out, as they do a silent node's.
- **Simulated GPUs**: outside the lab no plan may rest on a node whose agent simulates them.

Their telemetry: `gateway.services.fleet`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from agents.protocol import Health
from gateway.agentclient import Ack, AgentClient, AgentUnreachableError
from gateway.clock import Clock
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store

log = logging.getLogger("flexgate.gateway")


class AgentRegistry:
    def __init__(
        self, settings: GatewaySettings, store: Store, clock: Clock, client: AgentClient
    ) -> None:
        self.settings, self.store, self.clock, self.client = settings, store, clock, client
        self.nodes: dict[str, str] = {}  #: node id -> agent address
        self.version = 0  #: rises when a node is found, or the unreachable ones change
        self.seen: dict[str, datetime] = {}  #: node id -> when it last answered
        #: node id -> its agent's GPU backend (`sim` or `nvml`), as its health said
        self.backends: dict[str, str] = {}
        #: node id -> its GPUs' power sensor's effective lag, as the agent models it [s]
        self.sensor_lags_s: dict[str, float] = {}
        #: node id -> why it is unreachable: its last command failed (after the retries). The
        #: one definition, used by plans (`unreachable_nodes`), /v1/nodes, quotes and metrics.
        self.unreachable: dict[str, str] = {}
        #: node id -> why its agent may not set limits (its `can_cap` false, with the reason)
        self.cannot_cap: dict[str, str] = {}
        self.dispatch_s: tuple[float, ...] = ()  #: the last commands' round trips [s]

    def simulated(self) -> list[str]:
        """The nodes whose agents run simulated GPUs, sorted."""
        return sorted(node for node, kind in self.backends.items() if kind == "sim")

    def simulated_refusal(self) -> str | None:
        """Why no plan may rest on this fleet, or None: outside the lab (and unless the site is
        simulated on purpose, FLEXGATE_ALLOW_SIMULATED), a node on simulated GPUs caps nothing
        real, and without a meter the shed would be computed from the simulated power."""
        sim = self.simulated()
        if not sim or self.settings.lab or self.settings.allow_simulated:
            return None
        shown = ", ".join(sim[:3]) + (f" and {len(sim) - 3} more" if len(sim) > 3 else "")
        return (
            f"{len(sim)} node(s) run simulated GPUs (backend sim: {shown}): their caps reach no "
            "real GPU; start their agents with --backend nvml, or set "
            "FLEXGATE_ALLOW_SIMULATED=true for a simulated site"
        )

    async def discover(self) -> None:
        """Ask each configured agent that has not answered yet for its node id; those that
        answer are stored in one transaction (one commit per node would hold the event loop
        for seconds at 10,000 nodes, and the answers still in flight would time out)."""
        known = set(self.nodes.values())
        missing = [a for a in self.settings.agent_urls if a not in known]
        answers = await asyncio.gather(*(self._ask(address) for address in missing))
        found = [(a, health) for a, health in zip(missing, answers, strict=True) if health]
        if not found:
            return
        now = self.clock.now()
        for address, health in found:
            self.nodes[health.node_id] = address
            self.seen[health.node_id] = now
            self.backends[health.node_id] = health.backend
            if health.sensor is not None:
                self.sensor_lags_s[health.node_id] = health.sensor.lag_s
            self._note_can_cap(health.node_id, health.can_cap, health.can_cap_reason)
        self.version += 1
        with self.store.session() as s:
            for address, health in found:
                repo.saw_node(s, node_id=health.node_id, url=address, at=now)
            s.commit()

    async def _ask(self, address: str) -> Health | None:
        try:
            return await self.client.health(address)
        except AgentUnreachableError as exc:
            log.warning("agent %s did not answer: %s", address, exc)
            return None

    def note_answers(self, acks: list[Ack]) -> bool:
        """Record which nodes failed their command and why, and which may not set limits;
        True when either set changed."""
        unreachable = {a.node: a.error or "no answer" for a in acks if a.failed}
        self.dispatch_s = tuple(a.delay_s for a in acks if a.delay_s is not None)
        before = set(self.cannot_cap)
        for ack in acks:
            if ack.answer is not None:
                self._note_can_cap(ack.node, ack.answer.can_cap, ack.answer.can_cap_reason)
        changed = set(unreachable) != set(self.unreachable)
        self.unreachable = unreachable
        if changed:
            log.warning("nodes unreachable: %s", ", ".join(sorted(unreachable)) or "none")
        if set(self.cannot_cap) != before:
            changed = True
            log.warning("nodes that may not set limits: %s", ", ".join(self.cannot_cap) or "none")
        if changed:
            self.version += 1
        return changed

    def _note_can_cap(self, node: str, can_cap: bool | None, reason: str | None) -> None:
        if can_cap is False:
            self.cannot_cap[node] = reason or "its agent may not set power limits"
        else:  # true, or unknown: an agent restarted with the permission has not set yet
            self.cannot_cap.pop(node, None)
