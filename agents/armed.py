"""Armed plans on a node: caps held per depth, applied on a trigger (docs/fast.md).

`ArmedController` is the node's cap controller (`agents.caps.CapController`) with the fast
path added; every rule of the ordinary path stays:

- **Arm.** An `ArmCommand` replaces the node's armed state; an older generation than the last
  armed one is refused (409), a GPU named twice or not on the node too (422), nothing changed.
  Armed caps are clamped to each GPU's constraints when armed: never below its minimum.
- **Fire.** A trigger applies the caps armed at its depth at once, as a command of its own
  whose lease is the trigger's duration. A trigger replaces the fast event in force: a node
  with nothing armed at its depth ends its own (it gives nothing there), else changes nothing.
- **Combined.** While a fast event lasts, every GPU holds the lower of its ordinary cap (the
  gateway's commands, which go on arriving and renewing) and its fast cap: the deeper target
  wins. When the fast event ends, the ordinary command in force is applied again; with none in
  force, every GPU goes back to its original limit, as at any lease's end. When the ordinary
  lease ends first, the fast caps hold alone until theirs does.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

from agents.caps import CapController
from agents.errors import InvalidCapError, StaleGenerationError
from agents.logs import decision
from agents.protocol import CapCommand, CapResponse, CapResult, GpuCap
from agents.protocol_fast import ArmCommand, ArmedDepth, ArmState, FastTrigger


@dataclass(frozen=True)
class _Fast:
    """The fast event in force: its caps and when its lease ends (monotonic) [s]."""

    depth_pct: float
    caps: tuple[GpuCap, ...]
    until: float
    plan_id: str


class ArmedController(CapController):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As `CapController`'s."""
        super().__init__(*args, **kwargs)
        self._fast_lock = threading.RLock()  #: taken before the controller's own lock
        self.armed_generation: int | None = None
        self.armed: dict[float, tuple[GpuCap, ...]] = {}
        self.armed_clamped = 0
        self.fast: _Fast | None = None
        self.ordinary: CapCommand | None = None  #: the gateway's command in force
        self.ordinary_until: float | None = None

    # --- armed plans -----------------------------------------------------------------------

    def arm(self, command: ArmCommand) -> ArmState:
        with self._fast_lock:
            if self.armed_generation is not None and command.generation < self.armed_generation:
                raise StaleGenerationError(
                    f"armed generation {command.generation} is older than the last armed "
                    f"({self.armed_generation}); nothing changed"
                )
            armed, clamped = self._clamped(command.depths)
            self.armed, self.armed_clamped = armed, clamped
            self.armed_generation = command.generation
            decision(
                logging.DEBUG,
                "armed",
                node=self.node_id,
                generation=command.generation,
                depths=sorted(armed),
                clamped=clamped,
            )
            return self.arm_state()

    def arm_state(self) -> ArmState:
        with self._fast_lock:
            fast = self.fast
            return ArmState(
                node_id=self.node_id,
                generation=self.armed_generation,
                depths=[
                    ArmedDepth(depth_pct=d, caps=list(c)) for d, c in sorted(self.armed.items())
                ],
                clamped=self.armed_clamped,
                fast_depth_pct=fast.depth_pct if fast else None,
                fast_remaining_s=max(fast.until - self.clock(), 0.0) if fast else None,
            )

    def _clamped(self, depths: list[ArmedDepth]) -> tuple[dict[float, tuple[GpuCap, ...]], int]:
        """The depths' caps within their GPUs' constraints, and how many were moved there;
        `InvalidCapError` for a depth or GPU named twice, or a GPU the node lacks."""
        count = self.backend.count()
        limits = {i: self.backend.constraints(i) for i in range(count)}
        armed: dict[float, tuple[GpuCap, ...]] = {}
        clamped = 0
        for depth in depths:
            if depth.depth_pct in armed:
                raise InvalidCapError(f"depths: {depth.depth_pct:g}% appears twice")
            seen: set[int] = set()
            caps = []
            for cap in depth.caps:
                if cap.gpu >= count:
                    raise InvalidCapError(
                        f"depth {depth.depth_pct:g}%: GPU {cap.gpu} does not exist "
                        f"(this node has {count})"
                    )
                if cap.gpu in seen:
                    raise InvalidCapError(
                        f"depth {depth.depth_pct:g}%: GPU {cap.gpu} appears twice"
                    )
                seen.add(cap.gpu)
                bounds = limits[cap.gpu]
                cap_w = min(max(cap.cap_w, bounds.min_w), bounds.max_w)
                clamped += cap_w != cap.cap_w
                caps.append(GpuCap(gpu=cap.gpu, cap_w=cap_w))
            armed[depth.depth_pct] = tuple(caps)
        return armed, clamped

    def fire(self, trigger: FastTrigger, received_at: float) -> list[CapResult] | None:
        """The caps armed at the trigger's depth, applied for its duration. Nothing armed at
        that depth (the node gives nothing there): None, and a fast event in force ends (the
        trigger replaces it site-wide), else nothing changes."""
        with self._fast_lock:
            caps = self.armed.get(trigger.depth_pct)
            if caps is None:
                if self.fast is not None:
                    self.fast = replace(self.fast, until=self.clock())
                    self.expire()
                return None
            self.fast = _Fast(
                trigger.depth_pct, caps, self.clock() + trigger.duration_s, f"fast-{trigger.seq}"
            )
            return self._enforce(received_at).results

    # --- the ordinary path, combined -------------------------------------------------------

    def apply(self, command: CapCommand, received_at: float) -> CapResponse:
        with self._fast_lock:
            if self.fast is not None and self.clock() >= self.fast.until:
                self.fast = None  # over, the watcher not round yet: the command alone holds
            if self.fast is None:
                response = super().apply(command, received_at)
            else:
                response = self._apply_combined(command, received_at)
            self.ordinary, self.ordinary_until = command, self.clock() + command.lease_s
            return response

    def restore_all(
        self, received_at: float | None = None, *, reason: str = "restore requested"
    ) -> list[CapResult]:
        with self._fast_lock:
            self.fast, self.ordinary, self.ordinary_until = None, None, None
            return super().restore_all(received_at, reason=reason)

    def expire(self) -> list[CapResult] | None:
        """The fast event's end (the ordinary command in force again, or every GPU restored)
        or the ordinary lease's end under a fast event (the fast caps alone), else the
        ordinary rules."""
        with self._fast_lock:
            now = self.clock()
            if self.fast is not None and now >= self.fast.until:
                plan = self.fast.plan_id
                decision(logging.INFO, "fast event ended", node=self.node_id, plan=plan)
                self.fast = None
                if self.ordinary_until is not None and self.ordinary_until > now:
                    return self._enforce(now).results
                return self.restore_all(reason="lease expired")
            if (
                self.fast is not None
                and self.ordinary_until is not None
                and now >= self.ordinary_until
            ):
                self.ordinary, self.ordinary_until = None, None
                return self._enforce(now).results
            return super().expire()

    def _apply_combined(self, command: CapCommand, received_at: float) -> CapResponse:
        """An ordinary command under a fast event: its generation checked as always, each GPU
        at the lower of the two caps, the lease to the later of the two ends."""
        if self.generation is not None and command.generation < self.generation:
            return super().apply(command, received_at)  # refused there, with its reason
        assert self.fast is not None
        ends = max(self.fast.until, self.clock() + command.lease_s)
        combined = command.model_copy(
            update={
                "caps": _lower(command.caps, self.fast.caps),
                "lease_s": max(ends - self.clock(), 1e-3),
            }
        )
        response = super().apply(combined, received_at)
        return response.model_copy(update={"lease_s": command.lease_s})

    def _enforce(self, received_at: float) -> CapResponse:
        """What is in force now (the fast caps, the ordinary command, or both combined),
        applied as a renewal of the generation held."""
        now = self.clock()
        fast, ordinary = self.fast, self.ordinary
        ends = [t for t in (fast.until if fast else None, self.ordinary_until) if t is not None]
        caps = list(fast.caps) if fast else []
        if ordinary is not None:
            caps = _lower(ordinary.caps, tuple(caps)) if fast else list(ordinary.caps)
        command = CapCommand(
            plan_id=fast.plan_id if fast else (ordinary.plan_id if ordinary else "restore"),
            generation=self.generation or 0,
            lease_s=max(max(ends, default=now) - now, 1e-3),
            caps=caps,
        )
        return super().apply(command, received_at)


def _lower(ordinary: list[GpuCap], fast: tuple[GpuCap, ...]) -> list[GpuCap]:
    """Per GPU the lower of the two caps (a GPU in one only keeps that one)."""
    caps = {c.gpu: c.cap_w for c in ordinary}
    for cap in fast:
        caps[cap.gpu] = min(cap.cap_w, caps.get(cap.gpu, cap.cap_w))
    return [GpuCap(gpu=g, cap_w=w) for g, w in sorted(caps.items())]
