"""The fast path over NATS (docs/fast.md, docs/nats.md): armed plans by request on each node's
`flexgate.fast.arm.<node>` (all published at once, the answers gathered on one inbox), the
trigger as one message on `flexgate.fast.trigger`, each agent process's `FastFired` report
heard on `flexgate.fast.fired`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from pydantic import ValidationError

from agents.protocol_fast import (
    FAST_FIRED_SUBJECT,
    FAST_TRIGGER_SUBJECT,
    SIGNATURE_HEADER,
    FastFired,
    NatsFastAnswer,
    fast_arm_subject,
)
from gateway.agentclient import AgentUnreachableError
from gateway.agentclient.fast import ArmTargets, OnFired
from gateway.agentclient.natsbus import PUBLISH_CHUNK, NatsAgentClient
from gateway.clock import Clock


class NatsFast:
    def __init__(self, client: NatsAgentClient, clock: Clock) -> None:
        self.client, self.clock = client, clock
        self.rejected_reports = 0

    async def start(self, on_fired: OnFired) -> None:
        async def heard(msg: Msg) -> None:
            try:
                fired = FastFired.model_validate_json(msg.data)
            except ValidationError:
                self.rejected_reports += 1
                return
            on_fired(fired, self.clock.monotonic())

        await self.client._client().subscribe(FAST_FIRED_SUBJECT, cb=heard)

    async def arm_many(self, targets: ArmTargets) -> list[str | None]:
        nc = self.client._client()
        errors: list[str | None] = ["TimeoutError"] * len(targets)
        waiting = set(range(len(targets)))
        done = asyncio.Event()

        async def answered(msg: Msg) -> None:
            i = int(msg.subject.rsplit(".", 1)[1])
            try:
                answer = NatsFastAnswer.model_validate_json(msg.data)
                errors[i] = (
                    None if answer.status == 200 else f"status {answer.status}: {answer.detail}"
                )
            except ValidationError:
                errors[i] = "no answer of the agent's protocol (no responder?)"
            waiting.discard(i)
            if not waiting:
                done.set()

        inbox = nc.new_inbox()
        subscription = await nc.subscribe(f"{inbox}.*", cb=answered)
        try:
            for i, (node, address, command) in enumerate(targets):
                await nc.publish(
                    fast_arm_subject(address),
                    command.model_dump_json().encode(),
                    reply=f"{inbox}.{i}",
                    headers=self.client._headers(node),
                )
                if i % PUBLISH_CHUNK == PUBLISH_CHUNK - 1:
                    await asyncio.sleep(0)
            if waiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), self.client._timeout_s)
        finally:
            with contextlib.suppress(NatsError):
                await subscription.unsubscribe()
        return errors

    async def trigger(self, body: bytes, signature: str, addresses: Sequence[str]) -> None:
        try:
            nc = self.client._client()
            await nc.publish(FAST_TRIGGER_SUBJECT, body, headers={SIGNATURE_HEADER: signature})
            await nc.flush()
        except NatsError as exc:
            raise AgentUnreachableError(f"the trigger was not published: {exc}") from exc
