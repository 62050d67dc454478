"""The fast path over NATS (docs/fast.md): armed plans by request, triggers by broadcast.

- `flexgate.fast.arm.<node>`: an `ArmCommand` with `Authorization: Bearer <agent token>`,
  answered with a `NatsFastAnswer` (the armed state, or the status and reason it was refused).
- `flexgate.fast.trigger`: one signed `FastTrigger` for the whole site, checked once per process
  (`agents.fasttrigger`), then applied on every node armed at its depth, in this process's
  event loop with no round trip; the process then publishes one `FastFired` on
  `flexgate.fast.fired`. A refused trigger changes nothing (the reason is logged).
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import ValidationError

from agents.bearer import bearer_ok
from agents.errors import AgentError
from agents.fasttrigger import FastRefusedError, TriggerGuard
from agents.protocol import validation_detail, validation_status
from agents.protocol_fast import (
    FAST_FIRED_SUBJECT,
    FAST_TRIGGER_SUBJECT,
    SIGNATURE_HEADER,
    ArmCommand,
    FastFired,
    FastTrigger,
    NatsFastAnswer,
    fast_arm_subject,
)
from agents.service import AgentNode

UNAUTHORISED = "a valid bearer token is required to arm caps"


class FastNats:
    def __init__(self, nodes: dict[str, AgentNode], token: str, guard: TriggerGuard) -> None:
        self.nodes, self._token, self.guard = nodes, token, guard
        self._nc: Client | None = None
        self.fired = 0  #: triggers applied

    async def subscribe(self, nc: Client) -> None:
        self._nc = nc
        for node_id in self.nodes:
            await nc.subscribe(fast_arm_subject(node_id), cb=self._on_arm)
        await nc.subscribe(FAST_TRIGGER_SUBJECT, cb=self._on_trigger)

    async def _on_arm(self, msg: Msg) -> None:
        node = self.nodes[msg.subject.rsplit(".", 1)[1]]
        answer = self.arm(node, msg)
        if msg.reply and self._nc is not None:
            await self._nc.publish(msg.reply, answer.model_dump_json().encode())

    def arm(self, node: AgentNode, msg: Msg) -> NatsFastAnswer:
        if not bearer_ok((msg.headers or {}).get("Authorization"), self._token):
            return NatsFastAnswer(status=401, detail=UNAUTHORISED)
        try:
            command = ArmCommand.model_validate_json(msg.data)
        except ValidationError as exc:
            errors = exc.errors()
            return NatsFastAnswer(
                status=validation_status(errors), detail=validation_detail(errors)
            )
        try:
            return NatsFastAnswer(status=200, state=node.controller.arm(command))
        except AgentError as exc:
            return NatsFastAnswer(status=exc.status_code, detail=str(exc))

    async def _on_trigger(self, msg: Msg) -> None:
        start = time.monotonic()
        try:
            trigger = self.guard.check(msg.data, (msg.headers or {}).get(SIGNATURE_HEADER))
        except FastRefusedError:
            return  # logged by the guard; nothing changed
        fired = await self.fire(trigger, start)
        if self._nc is not None:
            await self._nc.publish(FAST_FIRED_SUBJECT, fired.model_dump_json().encode())

    async def fire(self, trigger: FastTrigger, start: float) -> FastFired:
        """The trigger on every node of the process; simulated ones at once, NVML in a thread."""
        applied = failed = 0
        for node in self.nodes.values():
            received = node.controller.clock()
            if node.backend.kind == "sim":
                results = node.controller.fire(trigger, received)
            else:
                results = await asyncio.to_thread(node.controller.fire, trigger, received)
            if results is not None:
                applied += 1
                failed += sum(1 for r in results if r.error)
        self.fired += 1
        return FastFired(
            seq=trigger.seq,
            nodes=len(self.nodes),
            applied=applied,
            failed_gpus=failed,
            elapsed_s=time.monotonic() - start,
        )
