"""How the gateway talks to its node agents: one interface, one implementation per transport.

- `AgentClient`: ask an agent who it is (`health`), send it its whole desired state
  (`put_caps`, retried by the transport, answered with an `Ack` and its timings) and read its
  telemetry. Answers are the `agents.protocol` models, parsed once, here.
- `http.HttpAgentClient`: aiohttp, keep-alive connections (the default).
- `memory.InMemoryAgentClient`: agents in this process, no network (unit tests, benchmarks).
- `natsbus`: over a NATS server with JetStream (docs/nats.md).

A transport is one module with these three calls; nothing else changes. An agent is named by
its address: a base URL for HTTP, its node id over NATS, `mem://...` in this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from agents.protocol import CapCommand, CapResponse, Health, TelemetryResponse


class AgentUnreachableError(Exception):
    """The agent did not answer, or answered something that is not its protocol."""


@dataclass(frozen=True)
class Ack:
    """One node's answer to its desired state, after the transport's retries."""

    node: str
    status: str  #: acked or failed
    attempts: int
    sent_at: datetime
    acked_at: datetime | None
    delay_s: float | None  #: from the first send to the answer [s]
    answer: CapResponse | None
    error: str | None  #: why it failed, or the GPUs that refused their cap

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def gpu_errors(answer: CapResponse) -> str | None:
    """The GPUs of an accepted command that could not take their cap, in one line."""
    errors = [f"GPU {r.gpu}: {r.error}" for r in answer.results if r.error]
    return "; ".join(errors) or None


class AgentClient(Protocol):
    async def health(self, address: str) -> Health:
        """The agent's identity and state; AgentUnreachableError when it does not answer."""
        ...

    async def put_caps(self, node: str, address: str, command: CapCommand) -> Ack:
        """Send one node its desired state; never raises: a failure is an Ack that says so."""
        ...

    async def telemetry(self, address: str) -> TelemetryResponse | None:
        """The agent's recent telemetry, or None when it does not answer."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class BatchAgentClient(Protocol):
    """A transport that sends a whole fan-out itself, cheaper than one `put_caps` per node."""

    async def put_caps_many(self, targets: Sequence[tuple[str, str, CapCommand]]) -> list[Ack]: ...


@runtime_checkable
class KeptTelemetryClient(Protocol):
    """A transport whose agents publish their telemetry: it keeps the latest of each, read
    for every node at once without asking any: (when it arrived, on the client's monotonic
    clock, and the telemetry), or None."""

    def kept_telemetry(
        self, addresses: Sequence[str]
    ) -> list[tuple[float, TelemetryResponse] | None]: ...


async def fan_out(client: AgentClient, targets: Sequence[tuple[str, str, CapCommand]]) -> list[Ack]:
    """Send every (node, address, command) at once; the answers come back in the same order."""
    if isinstance(client, BatchAgentClient):
        return await client.put_caps_many(targets)
    return list(await asyncio.gather(*(client.put_caps(n, a, c) for n, a, c in targets)))
