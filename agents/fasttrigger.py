"""Checking a fast trigger before any node acts on it (docs/fast.md, "Triggers").

One `TriggerGuard` per agent process (a farm's thousands of nodes check each message once):

- the signature first: HMAC-SHA256 over the body by the site's fast secret
  (FLEXGATE_AGENT_FAST_SECRET), compared in constant time; no secret configured: every
  trigger is refused;
- then the body (`FastTrigger`), then replay: a sequence number at or below the last accepted
  is refused, and so is a trigger sent more than FLEXGATE_AGENT_FAST_MAX_AGE_S ago (or that
  far ahead: a clock that far off is no clock to trust).

A refused trigger changes nothing and says why (`FastRefusedError` and its status).
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable

from pydantic import ValidationError

from agents.errors import AgentError
from agents.logs import decision
from agents.protocol_fast import FastTrigger, sign


class FastRefusedError(AgentError):
    """A trigger refused: unsigned or wrongly signed (401), replayed or too old (409),
    malformed (422)."""

    def __init__(self, reason: str, status_code: int) -> None:
        super().__init__(reason)
        self.status_code = status_code


class TriggerGuard:
    def __init__(
        self,
        secret: str | None,
        max_age_s: float,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._secret, self.max_age_s, self.wall = secret, max_age_s, wall
        self._lock = threading.Lock()
        #: the last trigger accepted, per listener (the process over NATS: one check for all
        #: its nodes; each node over HTTP)
        self.last_seq: dict[str, int] = {}
        self.refused = 0  #: triggers refused since start

    def check(self, body: bytes, signature: str | None, listener: str = "") -> FastTrigger:
        """The trigger, once its signature, body, sequence and age are right; else
        `FastRefusedError` naming what was wrong."""
        try:
            return self._check(body, signature, listener)
        except FastRefusedError as exc:
            self.refused += 1
            decision(logging.WARNING, "fast trigger refused", reason=str(exc))
            raise

    def _check(self, body: bytes, signature: str | None, listener: str) -> FastTrigger:
        if self._secret is None:
            raise FastRefusedError(
                "fast triggers are off: FLEXGATE_AGENT_FAST_SECRET is not set", 401
            )
        if not signature or not hmac.compare_digest(signature, sign(self._secret, body)):
            raise FastRefusedError("the trigger's signature is missing or wrong", 401)
        try:
            trigger = FastTrigger.model_validate_json(body)
        except ValidationError as exc:
            raise FastRefusedError(f"a malformed trigger: {exc.errors()[0]['msg']}", 422) from exc
        age_s = self.wall() - trigger.sent_at_s
        if abs(age_s) > self.max_age_s:
            raise FastRefusedError(
                f"trigger {trigger.seq} was sent {age_s:.3f} s ago, beyond the "
                f"{self.max_age_s:g} s allowed (FLEXGATE_AGENT_FAST_MAX_AGE_S)",
                409,
            )
        with self._lock:
            last = self.last_seq.get(listener, 0)
            if trigger.seq <= last:
                raise FastRefusedError(
                    f"trigger {trigger.seq} is not newer than the last accepted ({last}): a replay",
                    409,
                )
            self.last_seq[listener] = trigger.seq
        return trigger
