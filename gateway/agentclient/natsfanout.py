"""One NATS fan-out's bookkeeping (`NatsAgentClient.put_caps_many`): each command's body,
attempts and answer by its place in the fan-out, and the acks made of them."""

from __future__ import annotations

import asyncio
from datetime import datetime

from nats.aio.client import NO_RESPONDERS_STATUS
from nats.aio.msg import Msg
from pydantic import ValidationError

from agents.protocol import CapCommand, CapResponse, NatsAnswer
from gateway.agentclient import Ack, gpu_errors
from gateway.clock import Clock


def body_of(command: CapCommand) -> bytes:
    return command.model_dump_json().encode()


class FanOut:
    """One fan-out's state, by a node's place in it; `answered` is its inbox's callback."""

    def __init__(self, clock: Clock, bodies: list[bytes]) -> None:
        n = len(bodies)
        self.clock, self.bodies = clock, bodies
        self.sent_at: list[datetime | None] = [None] * n
        self.start_s = [0.0] * n
        self.attempts = [0] * n
        self.answers: list[CapResponse | None] = [None] * n
        self.acked_at: list[datetime | None] = [None] * n
        self.delay_s: list[float | None] = [None] * n
        self.errors = ["not sent"] * n
        self.retry = [True] * n  #: not answered yet, or answered something worth a retry
        self.waiting: set[int] = set()  #: sent in this attempt, not answered yet
        self.done = asyncio.Event()  #: set when nothing is waiting

    def sent(self, i: int) -> None:
        self.sent_at[i], self.start_s[i] = self.clock.now(), self.clock.monotonic()

    def settle(self, i: int, error: str | None, *, final: bool) -> None:
        self.waiting.discard(i)
        if error is not None:
            self.errors[i] = error
        self.retry[i] = not final
        if not self.waiting:
            self.done.set()

    async def answered(self, msg: Msg) -> None:
        i = int(msg.subject.rsplit(".", 1)[1])
        if i not in self.waiting:  # a late answer to an attempt already given up on
            return
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS:
            self.settle(i, "NoRespondersError: nats: no responders available", final=False)
            return
        try:
            answer = NatsAnswer.model_validate_json(msg.data)
        except ValidationError as exc:
            self.settle(i, describe(exc), final=False)
            return
        if answer.status == 200 and answer.caps is not None:
            self.answers[i], self.acked_at[i] = answer.caps, self.clock.now()
            self.delay_s[i] = self.clock.monotonic() - self.start_s[i]
            self.settle(i, None, final=True)
            return
        self.settle(i, f"status {answer.status}: {answer.detail}", final=answer.status < 500)

    def ack(self, i: int, node: str) -> Ack:
        sent_at = self.sent_at[i] or self.clock.now()
        answer = self.answers[i]
        if answer is None:
            return Ack(node, "failed", self.attempts[i], sent_at, None, None, None, self.errors[i])
        acked_at, delay_s = self.acked_at[i], self.delay_s[i]
        return Ack(
            node, "acked", self.attempts[i], sent_at, acked_at, delay_s, answer, gpu_errors(answer)
        )


def describe(exc: Exception) -> str:
    """An error as an ack carries it: its type, and its message when it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
