"""The fast path's transport (docs/fast.md): armed plans to the nodes, triggers to all.

- `arm_many`: each node its whole armed state (`ArmCommand`), all at once; the answer per node
  is None (armed) or why not. Not retried here: the fast service sends a node whose plans did
  not arrive again at its next check.
- `trigger`: the signed trigger to every node; over NATS one broadcast message. Each report
  that caps are enforced (`FastFired`: per agent process over NATS, per node otherwise) goes
  to the `on_fired` given to `start`, with when it arrived (this client's monotonic clock).

`gateway.app.fast_transport` gives the one of the agent transport in use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import aiohttp
from pydantic import ValidationError

from agents.protocol_fast import (
    SIGNATURE_HEADER,
    ArmCommand,
    FastFired,
    FastTrigger,
    TriggerAnswer,
)
from gateway.agentclient.http import HttpAgentClient
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.clock import Clock

#: (the report, when it arrived [s, monotonic])
OnFired = Callable[[FastFired, float], None]
ArmTargets = Sequence[tuple[str, str, ArmCommand]]


class FastTransport(Protocol):
    async def start(self, on_fired: OnFired) -> None: ...

    async def arm_many(self, targets: ArmTargets) -> list[str | None]: ...

    async def trigger(self, body: bytes, signature: str, addresses: Sequence[str]) -> None: ...


def fired_of(answer: TriggerAnswer, elapsed_s: float) -> FastFired:
    """One node's answer to a trigger as the report every transport gives."""
    return FastFired(
        seq=answer.seq,
        nodes=1,
        applied=int(answer.applied),
        failed_gpus=sum(1 for r in answer.results if r.error),
        elapsed_s=max((r.elapsed_s for r in answer.results), default=elapsed_s),
    )


class HttpFast:
    def __init__(self, client: HttpAgentClient, clock: Clock) -> None:
        self.client, self.clock = client, clock
        self._on_fired: OnFired | None = None

    async def start(self, on_fired: OnFired) -> None:
        self._on_fired = on_fired

    async def arm_many(self, targets: ArmTargets) -> list[str | None]:
        return list(await asyncio.gather(*(self._arm(*t) for t in targets)))

    async def _arm(self, node: str, address: str, command: ArmCommand) -> str | None:
        return await self._send(
            "PUT",
            f"{address}/v1/fast/armed",
            command.model_dump_json().encode(),
            {"Authorization": f"Bearer {self.client._token_for(node)}"},
        )

    async def trigger(self, body: bytes, signature: str, addresses: Sequence[str]) -> None:
        await asyncio.gather(
            *(
                self._send("POST", f"{a}/v1/fast/trigger", body, {SIGNATURE_HEADER: signature})
                for a in addresses
            )
        )

    async def _send(
        self, method: str, url: str, body: bytes, headers: dict[str, str]
    ) -> str | None:
        start = self.clock.monotonic()
        try:
            async with self.client._http().request(
                method,
                url,
                data=body,
                headers={**headers, "Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.client._timeout_s),
            ) as response:
                doc: Any = await response.json(content_type=None)
                if response.status != 200:
                    return f"HTTP {response.status}: {doc.get('detail', doc)}"
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if method == "POST" and self._on_fired is not None:
            try:
                answer = TriggerAnswer.model_validate(doc)
            except ValidationError as exc:
                return str(exc)
            self._on_fired(fired_of(answer, self.clock.monotonic() - start), self.clock.monotonic())
        return None


class MemoryFast:
    """Agents in this process (`agents.service.AgentNode`s): armed and fired directly."""

    def __init__(self, client: InMemoryAgentClient, clock: Clock) -> None:
        self.client, self.clock = client, clock
        self._on_fired: OnFired | None = None

    async def start(self, on_fired: OnFired) -> None:
        self._on_fired = on_fired

    def _agent(self, address: str) -> Any:
        """The node at `address` (`agents.service.AgentNode`), None when unplugged."""
        return None if address in self.client.unplugged else self.client.agents.get(address)

    async def arm_many(self, targets: ArmTargets) -> list[str | None]:
        errors: list[str | None] = []
        for _, address, command in targets:
            agent = self._agent(address)
            if agent is None:
                errors.append(f"no agent answers at {address}")
                continue
            try:
                agent.controller.arm(command)
                errors.append(None)
            except Exception as exc:  # what the agent's API would answer with its status
                errors.append(f"HTTP {getattr(exc, 'status_code', 500)}: {exc}")
        return errors

    async def trigger(self, body: bytes, signature: str, addresses: Sequence[str]) -> None:
        trigger = FastTrigger.model_validate_json(body)
        for address in addresses:
            agent = self._agent(address)
            if agent is None:
                continue
            start = self.clock.monotonic()
            results = agent.controller.fire(trigger, agent.controller.clock())
            answer = TriggerAnswer(
                node_id=agent.node_id,
                seq=trigger.seq,
                applied=results is not None,
                results=results or [],
            )
            if self._on_fired is not None:
                fired = fired_of(answer, self.clock.monotonic() - start)
                self._on_fired(fired, self.clock.monotonic())
