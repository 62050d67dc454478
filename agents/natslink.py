"""The agent over NATS (docs/nats.md): commands by request and reply, telemetry published.

One connection serves every node of the process (one for a GPU node, thousands in a farm):

- `flexgate.caps.<node>`: a `CapCommand`, answered with a `NatsAnswer` (the HTTP API's answer
  and status code). The message must carry `Authorization: Bearer <agent token>` as a header,
  as the HTTP API requires; a malformed command is refused with the reason and changes nothing.
- `flexgate.health.<node>`: the node's `Health`.
- `flexgate.telemetry.<node>`: a `TelemetrySummary`, published every telemetry period.
- The fast path's subjects (armed plans, the site's trigger): `agents.fastlink`.
- On connect and on every reconnect each node reads its desired state from the JetStream
  key-value bucket `flexgate_desired` (the gateway writes it with every command; entries expire
  one lease after their last write) and applies it, so a node that missed commands while cut off
  catches up at once; a node that hears nothing still restores at its lease's end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from pydantic import ValidationError

from agents.bearer import bearer_ok
from agents.errors import AgentError
from agents.fastlink import FastNats
from agents.fasttrigger import TriggerGuard
from agents.logs import decision
from agents.natsconnect import NatsOptions, connect
from agents.protocol import (
    DESIRED_BUCKET,
    CapCommand,
    NatsAnswer,
    caps_subject,
    health_subject,
    telemetry_subject,
    validation_detail,
    validation_status,
)
from agents.service import AgentNode

UNAUTHORISED = "a valid bearer token is required to change limits"
CATCH_UP_AT_ONCE = 64


class NatsLink:
    def __init__(
        self,
        nodes: Sequence[AgentNode],
        options: NatsOptions,
        token: str,
        *,
        telemetry_period_s: float = 1.0,
        fast: TriggerGuard | None = None,
    ) -> None:
        self.nodes = {node.node_id: node for node in nodes}
        self.fast = FastNats(self.nodes, token, fast or TriggerGuard(None, 1.0))
        self.options, self._token = options, token
        self.telemetry_period_s = telemetry_period_s
        self._nc: Client | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.loop: asyncio.AbstractEventLoop | None = None  #: the one it was started on
        self.caught_up = 0  #: desired states read from the bucket and applied

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._nc = await connect(
            self.options,
            f"flexgate-agent {next(iter(self.nodes), '')} (+{len(self.nodes) - 1})",
            reconnected_cb=self._reconnected,
            error_cb=self._error,
        )
        for node in self.nodes.values():
            await self._nc.subscribe(caps_subject(node.node_id), cb=self._on_caps)
            await self._nc.subscribe(health_subject(node.node_id), cb=self._on_health)
        await self.fast.subscribe(self._nc)
        await self._nc.flush()
        await self.catch_up()
        self._tasks.append(asyncio.create_task(self._publish_telemetry()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._nc is not None:
            await self._nc.close()

    async def _reconnected(self) -> None:
        decision(logging.INFO, "nats reconnected", url=self.options.url, nodes=len(self.nodes))
        self._tasks.append(asyncio.create_task(self.catch_up()))

    async def _error(self, exc: Exception) -> None:
        decision(logging.WARNING, "nats error", url=self.options.url, error=str(exc))

    # --- desired state on connect ------------------------------------------------------------

    async def catch_up(self) -> None:
        """Apply each node's desired state from the bucket (an older generation than the
        node's own changes nothing; no entry, or no bucket yet, neither)."""
        assert self._nc is not None
        try:
            bucket = await self._nc.jetstream().key_value(DESIRED_BUCKET)
        except (BucketNotFoundError, NotFoundError, NatsError, TimeoutError):
            return
        # A farm process reads thousands of keys: a few at a time, so none times out waiting.
        slots = asyncio.Semaphore(CATCH_UP_AT_ONCE)

        async def one(node: AgentNode) -> None:
            async with slots:
                await self._catch_up_node(bucket, node)

        await asyncio.gather(*(one(n) for n in self.nodes.values()))

    async def _catch_up_node(self, bucket: Any, node: AgentNode) -> None:
        try:
            entry = await bucket.get(node.node_id)
            command = CapCommand.model_validate_json(entry.value or b"")
        except (KeyNotFoundError, NotFoundError):
            return
        except (NatsError, TimeoutError, ValidationError) as exc:
            decision(logging.WARNING, "desired state unreadable", node=node.node_id, error=str(exc))
            return
        answer = await self._apply(node, command)
        if answer.status == 200:
            self.caught_up += 1
            decision(
                logging.INFO,
                "desired state read on connect",
                node=node.node_id,
                plan=command.plan_id,
                generation=command.generation,
            )

    # --- requests ----------------------------------------------------------------------------

    async def _on_caps(self, msg: Msg) -> None:
        node = self.nodes[msg.subject.rsplit(".", 1)[1]]
        answer = await self._answer_caps(node, msg)
        await self._reply(msg, answer)

    async def _answer_caps(self, node: AgentNode, msg: Msg) -> NatsAnswer:
        if not bearer_ok((msg.headers or {}).get("Authorization"), self._token):
            return NatsAnswer(status=401, detail=UNAUTHORISED)
        try:
            command = CapCommand.model_validate_json(msg.data)
        except ValidationError as exc:
            errors = exc.errors()
            return NatsAnswer(status=validation_status(errors), detail=validation_detail(errors))
        return await self._apply(node, command)

    async def _apply(self, node: AgentNode, command: CapCommand) -> NatsAnswer:
        received = node.controller.clock()
        try:
            if node.backend.kind == "sim":  # microseconds: no thread hop
                result = node.controller.apply(command, received)
            else:  # NVML blocks
                result = await asyncio.to_thread(node.controller.apply, command, received)
        except AgentError as exc:
            return NatsAnswer(status=exc.status_code, detail=str(exc))
        return NatsAnswer(status=200, caps=result)

    async def _on_health(self, msg: Msg) -> None:
        node = self.nodes[msg.subject.rsplit(".", 1)[1]]
        await self._reply(msg, NatsAnswer(status=200, health=node.health()))

    async def _reply(self, msg: Msg, answer: NatsAnswer) -> None:
        """The answer on the request's reply subject, without its headers: `msg.respond`
        would send the request's headers back, the agent token with them."""
        assert self._nc is not None
        if msg.reply:
            await self._nc.publish(msg.reply, answer.model_dump_json().encode())

    # --- telemetry ---------------------------------------------------------------------------

    async def _publish_telemetry(self) -> None:
        assert self._nc is not None
        while True:
            await asyncio.sleep(self.telemetry_period_s)
            if not self._nc.is_connected:
                continue
            for node in self.nodes.values():
                summary = node.summary(self.telemetry_period_s)
                await self._nc.publish(
                    telemetry_subject(node.node_id), summary.model_dump_json().encode()
                )
