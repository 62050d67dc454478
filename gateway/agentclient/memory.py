"""Agents in this process, called directly: the transport of unit tests and benchmarks.

Any object with the agent's three answers will do (`agents.service.AgentNode` has them). An
agent can be unplugged and plugged back to stand for a network that fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from agents.protocol import CapCommand, CapResponse, Health, TelemetryResponse
from gateway.agentclient import Ack, AgentUnreachableError, gpu_errors
from gateway.clock import Clock, SystemClock


class LocalAgent(Protocol):
    def health(self) -> Health: ...

    def apply(self, command: CapCommand) -> CapResponse: ...

    def telemetry(self) -> TelemetryResponse: ...


class InMemoryAgentClient:
    def __init__(self, agents: Mapping[str, LocalAgent], clock: Clock | None = None) -> None:
        self.agents = dict(agents)  #: address -> agent
        self.unplugged: set[str] = set()
        self._clock = clock or SystemClock()

    def unplug(self, address: str) -> None:
        self.unplugged.add(address)

    def plug(self, address: str) -> None:
        self.unplugged.discard(address)

    def _agent(self, address: str) -> LocalAgent:
        if address in self.unplugged or address not in self.agents:
            raise AgentUnreachableError(f"no agent answers at {address}")
        return self.agents[address]

    async def health(self, address: str) -> Health:
        return self._agent(address).health()

    async def telemetry(self, address: str) -> TelemetryResponse | None:
        try:
            return self._agent(address).telemetry()
        except AgentUnreachableError:
            return None

    async def put_caps(self, node: str, address: str, command: CapCommand) -> Ack:
        sent_at, start = self._clock.now(), self._clock.monotonic()
        try:
            answer = self._agent(address).apply(command)
        except AgentUnreachableError as exc:
            return Ack(node, "failed", 1, sent_at, None, None, None, str(exc))
        except Exception as exc:  # what the agent's HTTP API would answer with its status code
            status = getattr(exc, "status_code", 500)
            return Ack(node, "failed", 1, sent_at, None, None, None, f"HTTP {status}: {exc}")
        delay_s = self._clock.monotonic() - start
        return Ack(
            node, "acked", 1, sent_at, self._clock.now(), delay_s, answer, gpu_errors(answer)
        )

    async def close(self) -> None:
        return None
