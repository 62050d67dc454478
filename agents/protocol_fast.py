"""The fast path's wire schemas (docs/fast.md): armed plans and signed triggers.

Part of the agent's protocol (`agents.protocol`), kept apart for size; the gateway imports
both. Every number must be finite; commands refuse unknown fields.

- `ArmCommand`: a node's whole armed state, per depth of the site, with a generation that only
  rises (an older one is refused, 409): depths it does not list are disarmed.
- `FastTrigger`: one message for the whole site (NATS subject `flexgate.fast.trigger`, or
  `POST /v1/fast/trigger` on an agent), signed with HMAC-SHA256 over its body by the site's
  fast secret (header `Flexgate-Signature`); a sequence number that only rises and the time it
  was sent guard against replay.
"""

from __future__ import annotations

import hashlib
import hmac

from pydantic import BaseModel, ConfigDict, Field

from agents.protocol import SUBJECT_ROOT, CapResult, GpuCap

#: The trigger's one subject: every agent of the site listens to it.
FAST_TRIGGER_SUBJECT = f"{SUBJECT_ROOT}.fast.trigger"
#: The header (NATS and HTTP) carrying a trigger's signature, hex.
SIGNATURE_HEADER = "Flexgate-Signature"


def fast_arm_subject(node_id: str) -> str:
    """A node's armed plans, request and reply: the body an `ArmCommand`, the reply a
    `NatsFastAnswer`."""
    return f"{SUBJECT_ROOT}.fast.arm.{node_id}"


def sign(secret: str, body: bytes) -> str:
    """The signature of a trigger's body: HMAC-SHA256 by the site's fast secret, hex."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ArmedDepth(_Strict):
    depth_pct: float = Field(gt=0, le=100, description="the depth, percent of the site [%]")
    caps: list[GpuCap] = Field(default_factory=list, description="this node's caps at it")


class ArmCommand(_Strict):
    """A node's whole armed state: its caps at each depth (none: it gives nothing there)."""

    generation: int = Field(ge=0, description="rises with every re-arm; older ones get 409")
    depths: list[ArmedDepth] = Field(default_factory=list)


class ArmState(BaseModel):
    """What a node holds armed: its caps per depth as it will apply them (clamped to each
    GPU's constraints: never below its minimum), and the fast event in force, if any."""

    node_id: str
    generation: int | None
    depths: list[ArmedDepth]
    clamped: int = 0  #: armed caps that lay outside their GPU's constraints
    fast_depth_pct: float | None = None  #: the depth applied now, by a trigger
    fast_remaining_s: float | None = None  #: how long it lasts still [s]


class FastTrigger(_Strict):
    """Apply the caps armed at `depth_pct` for `duration_s` (their lease), now."""

    seq: int = Field(ge=1, description="rises with every trigger; a repeat is refused")
    sent_at_s: float = Field(description="when it was sent, Unix time [s]")
    depth_pct: float = Field(gt=0, le=100, description="an armed depth [%]")
    duration_s: float = Field(gt=0, le=3600, description="the fast event's length [s]")


class TriggerAnswer(BaseModel):
    """A node's answer to a trigger (over HTTP; NATS triggers are not answered)."""

    node_id: str
    seq: int
    applied: bool  #: false: nothing is armed at that depth here
    results: list[CapResult] = Field(default_factory=list)


class NatsFastAnswer(BaseModel):
    """A node's answer to an `ArmCommand` over NATS: `state` with status 200, else `detail`."""

    status: int
    state: ArmState | None = None
    detail: object = None


#: Where each agent process reports a trigger applied: one `FastFired` per process.
FAST_FIRED_SUBJECT = f"{SUBJECT_ROOT}.fast.fired"


class FastFired(BaseModel):
    """An agent process's report of one trigger: its nodes enforce their armed caps (read
    back) `elapsed_s` after the trigger arrived."""

    seq: int
    nodes: int  #: the process's nodes
    applied: int  #: of those, the ones armed at the depth (their caps now enforced)
    failed_gpus: int  #: GPUs whose cap did not read back
    elapsed_s: float  #: from the trigger's arrival to the last node's caps read back [s]
