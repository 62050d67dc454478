"""GPU limits set and restored one by one, read back and timed (`agents.caps`'s hands).

- Before its first change, each GPU's original limit is saved to disk (`OriginalLimits`).
- Caps outside a GPU's constraints are clamped to them and the clamp is reported; every change
  is read back (the enforced limit is the truth), with its time from the request's arrival
  (`DelayLog`).
- Whether the agent may set limits at all (`can_cap`) is learnt from its sets: unknown until
  the first, true once NVML accepts one, false once NVML refuses one for permission, and then
  false until the agent restarts (the permission belongs to the process, not to one GPU).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from agents.backend import GpuBackend
from agents.errors import AgentError, NoPermissionError
from agents.protocol import DELAY_SAMPLES, CapResult, DelayStats
from agents.state import OriginalLimits

#: A limit that reads back more than this far from what was set is reported as an error.
READBACK_TOLERANCE_W = 1.0


class DelayLog:
    """The latest actuation delays (request to enforced limit, per GPU) [s]."""

    def __init__(self) -> None:
        self.delays: deque[float] = deque(maxlen=2000)
        self._added = 0  #: delays recorded so far: what `_stats` was worked out at
        self._stats: tuple[int, DelayStats] | None = None

    def record(self, delay_s: float) -> None:
        self.delays.append(delay_s)
        self._added += 1

    def stats(self) -> DelayStats:
        """The delays' percentiles, worked out again only after a new delay: every telemetry
        summary carries them, and most come between commands."""
        added = self._added
        if self._stats is not None and self._stats[0] == added:
            return self._stats[1]
        values = np.array(self.delays)
        if values.size == 0:
            stats = DelayStats(p50_s=None, p99_s=None, count=0)
        else:
            stats = DelayStats(
                p50_s=float(np.percentile(values, 50)),
                p99_s=float(np.percentile(values, 99)),
                count=int(values.size),
                recent_s=[float(v) for v in values[-DELAY_SAMPLES:]],
            )
        self._stats = (added, stats)
        return stats


class GpuActuator:
    """Sets and restores the node's GPUs' limits; the caller holds the lock."""

    def __init__(
        self, backend: GpuBackend, originals: OriginalLimits, clock: Callable[[], float]
    ) -> None:
        self.backend = backend
        self.originals = originals
        self.clock = clock
        self.delays = DelayLog()
        #: may this process set limits: None until a set says (see the module's docstring)
        self.can_cap: bool | None = None
        self.can_cap_reason: str | None = None  #: NVML's refusal, with can_cap False

    def enforced_or_none(self, index: int) -> float | None:
        try:
            return self.backend.enforced_limit_w(index)
        except AgentError:
            return None

    def was_changed(self, index: int) -> bool:
        """Whether flexgate changed this GPU's limit (its original is saved)."""
        try:
            return self.originals.original_w(self.backend.identity(index)[0]) is not None
        except AgentError:
            return False

    def save_originals(self, indices: list[int]) -> dict[int, str]:
        """The original limits of the GPUs about to be capped for the first time, saved in one
        write before any changes; the uuid of every GPU whose original is now saved (a GPU
        that cannot be read is left to `set`, which reports it and saves its original itself
        before changing it)."""
        limits, uuids = [], {}
        for index in indices:
            try:
                uuid, _ = self.backend.identity(index)
                if self.originals.original_w(uuid) is None:
                    limits.append((uuid, index, self.backend.enforced_limit_w(index)))
            except AgentError:
                continue
            uuids[index] = uuid
        self.originals.remember_all(limits)
        return uuids

    def set(
        self, index: int, requested_w: float, received_at: float, saved_uuid: str | None = None
    ) -> CapResult:
        """One GPU to `requested_w` (within its constraints) and read back; `saved_uuid`: its
        uuid, its original known to be saved (else both are read here first)."""
        clamped = False
        try:
            limits = self.backend.constraints(index)
            target = min(max(requested_w, limits.min_w), limits.max_w)
            clamped = target != requested_w
            if saved_uuid is None:
                uuid, _ = self.backend.identity(index)
                if self.originals.original_w(uuid) is None:
                    self.originals.remember(uuid, index, self.backend.enforced_limit_w(index))
            self._set_limit(index, target)
            enforced = self.backend.enforced_limit_w(index)
        except AgentError as exc:
            return self._result(index, requested_w, None, clamped, received_at, str(exc))
        error = None
        if abs(enforced - target) > READBACK_TOLERANCE_W:
            error = f"limit reads back as {enforced:g} W, not the {target:g} W set"
        return self._result(index, requested_w, enforced, clamped, received_at, error)

    def restore(self, indices: list[int], received_at: float) -> list[CapResult]:
        """These GPUs back to their original limits; the ones that read back are forgotten in
        one write (a crash before it restores them again on restart: the same limits)."""
        results, back = [], []
        for index in indices:
            result, uuid = self._restore_one(index, received_at)
            results.append(result)
            if uuid is not None:
                back.append(uuid)
        self.originals.forget_all(back)
        return results

    def _restore_one(self, index: int, received_at: float) -> tuple[CapResult, str | None]:
        """A GPU back to its original limit: the result, and its uuid once it reads back."""
        try:
            uuid, _ = self.backend.identity(index)
            original = self.originals.original_w(uuid)
            if original is None:
                enforced = self.backend.enforced_limit_w(index)
                return self._result(index, None, enforced, False, received_at, None), None
            self._set_limit(index, original)
            enforced = self.backend.enforced_limit_w(index)
        except AgentError as exc:
            return self._result(index, None, None, False, received_at, str(exc)), None
        if abs(enforced - original) > READBACK_TOLERANCE_W:
            error = f"original limit {original:g} W reads back as {enforced:g} W"
            return self._result(index, None, enforced, False, received_at, error), None
        return self._result(index, None, enforced, False, received_at, None), uuid

    def _set_limit(self, index: int, watts: float) -> None:
        """One NVML set, and what it says of the process's permission to set limits."""
        try:
            self.backend.set_limit_w(index, watts)
        except NoPermissionError as exc:
            self.can_cap, self.can_cap_reason = False, str(exc)
            raise
        if self.can_cap is None:  # a refusal stays: a later success would be another GPU's luck
            self.can_cap = True

    def _result(
        self,
        index: int,
        requested: float | None,
        enforced: float | None,
        clamped: bool,
        received_at: float,
        error: str | None,
    ) -> CapResult:
        elapsed = self.clock() - received_at
        if error is None:
            self.delays.record(elapsed)
        return CapResult(
            gpu=index,
            requested_w=requested,
            enforced_w=enforced,
            clamped=clamped,
            elapsed_s=elapsed,
            error=error,
        )
