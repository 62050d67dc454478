"""Applying a node's desired caps, with leases, generations and restore (docs/agents.md).

- A command is the node's whole desired state: GPUs it does not list go back to their
  original limit.
- Generations only rise: a command older than the last accepted one is refused (409), so a
  delayed retry cannot undo a newer plan. The same generation again renews the lease.
- Every command is validated in full before anything changes (unknown or repeated GPU: 422).
- Caps outside a GPU's constraints are clamped to them and the clamp is reported; every change
  is read back (the enforced limit is the truth), with its time from the request's arrival.
- Before its first change, each GPU's original limit is saved to disk (`OriginalLimits`).
- Whether the agent may set limits at all (`can_cap`) is learnt from its sets: unknown until
  the first, true once NVML accepts one, false once NVML refuses one for permission, and then
  false until the agent restarts (the permission belongs to the process, not to one GPU).
- The lease counts on the agent's monotonic clock from acceptance. When it runs out without
  renewal, every GPU gets its original limit back (`expire`); a restore that fails (a lost
  GPU) is retried at every check until it succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from agents.backend import GpuBackend
from agents.errors import AgentError, InvalidCapError, NoPermissionError, StaleGenerationError
from agents.logs import decision
from agents.protocol import DELAY_SAMPLES, CapCommand, CapResponse, CapResult, DelayStats
from agents.state import OriginalLimits

#: A limit that reads back more than this far from what was set is reported as an error.
READBACK_TOLERANCE_W = 1.0


class CapController:
    def __init__(
        self,
        backend: GpuBackend,
        originals: OriginalLimits,
        clock: Callable[[], float] = time.monotonic,
        *,
        node_id: str = "",
    ) -> None:
        self.backend = backend
        self.node_id = node_id
        self.originals = originals
        self.clock = clock
        self._lock = threading.Lock()
        self.generation: int | None = None
        self.plan_id: str | None = None
        self.lease_until: float | None = None
        self.delays: deque[float] = deque(maxlen=2000)
        self._delays_added = 0  #: delays recorded so far: what `_delay_stats` was worked out at
        self._delay_stats: tuple[int, DelayStats] | None = None
        self.restore_pending = False  #: a restore failed (lost GPU ...): the watcher retries
        #: may this process set limits: None until a set says (see the module's docstring)
        self.can_cap: bool | None = None
        self.can_cap_reason: str | None = None  #: NVML's refusal, with can_cap False

    # --- commands --------------------------------------------------------------------------

    def apply(self, command: CapCommand, received_at: float) -> CapResponse:
        with self._lock:
            if self.generation is not None and command.generation < self.generation:
                raise StaleGenerationError(
                    f"generation {command.generation} is older than the last accepted "
                    f"({self.generation}); nothing changed"
                )
            wanted = self._validate(command)
            count = self.backend.count()
            before = {gpu: self._enforced_or_none(gpu) for gpu in range(count)}
            uuids = self._save_originals(sorted(wanted))
            results = [
                self._set(gpu, cap, received_at, uuids.get(gpu))
                for gpu, cap in sorted(wanted.items())
            ]
            results += self._restore_all(
                [gpu for gpu in range(count) if gpu not in wanted and self._was_changed(gpu)],
                received_at,
            )
            self.generation = command.generation
            self.plan_id = command.plan_id
            self.lease_until = self.clock() + command.lease_s
            results.sort(key=lambda r: r.gpu)
            self._log_changes(command, results, before)
            return CapResponse(
                plan_id=command.plan_id,
                generation=command.generation,
                lease_s=command.lease_s,
                results=results,
                can_cap=self.can_cap,
                can_cap_reason=self.can_cap_reason,
            )

    def restore_all(
        self, received_at: float | None = None, *, reason: str = "restore requested"
    ) -> list[CapResult]:
        """Every GPU flexgate changed back to its original limit; the lease ends.

        `reason` goes into the log line (lease expired, stopping, restore requested ...),
        written only when there was something to restore.
        """
        start = self.clock() if received_at is None else received_at
        with self._lock:
            self.lease_until = None
            saved = self.originals.saved()
            results = self._restore_all([index for _, (index, _) in sorted(saved.items())], start)
            self.restore_pending = any(r.error for r in results)
            if results:
                self._log_restore(reason, results)
            return results

    def expire(self) -> list[CapResult] | None:
        """Restore everything if the lease has run out, or retry a restore that failed
        (called by the agent's watcher)."""
        due = self.lease_until is not None and self.clock() >= self.lease_until
        if not (due or self.restore_pending):
            return None
        return self.restore_all(reason="lease expired" if due else "restore retried")

    def lease_remaining_s(self) -> float | None:
        return None if self.lease_until is None else max(self.lease_until - self.clock(), 0.0)

    def delay_stats(self) -> DelayStats:
        """The delays' percentiles, worked out again only after a new delay: every telemetry
        summary carries them, and most come between commands."""
        added = self._delays_added
        if self._delay_stats is not None and self._delay_stats[0] == added:
            return self._delay_stats[1]
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
        self._delay_stats = (added, stats)
        return stats

    # --- the log ---------------------------------------------------------------------------

    def _log_changes(
        self, command: CapCommand, results: list[CapResult], before: dict[int, float | None]
    ) -> None:
        """One line per GPU whose limit moved or failed; a renewal that moved nothing is
        DEBUG (the gateway renews every reconcile period)."""
        moved = [r for r in results if r.error or r.enforced_w != before.get(r.gpu)]
        for r in moved:
            decision(
                logging.ERROR if r.error else logging.INFO,
                "cap failed"
                if r.error
                else ("cap set" if r.requested_w is not None else "cap restored"),
                node=self.node_id,
                gpu=r.gpu,
                requested_w=r.requested_w,
                enforced_w=r.enforced_w,
                clamped=r.clamped,
                plan=command.plan_id,
                generation=command.generation,
                lease_s=command.lease_s,
                **({"error": r.error} if r.error else {}),
            )
        if not moved:
            decision(
                logging.DEBUG,
                "lease renewed",
                node=self.node_id,
                plan=command.plan_id,
                generation=command.generation,
                lease_s=command.lease_s,
            )

    def _log_restore(self, reason: str, results: list[CapResult]) -> None:
        failed = [r for r in results if r.error]
        decision(
            logging.WARNING if failed or reason == "lease expired" else logging.INFO,
            reason,
            node=self.node_id,
            plan=self.plan_id,
            generation=self.generation,
            restored_gpus=[r.gpu for r in results if not r.error],
            failed_gpus=[r.gpu for r in failed],
            **({"error": failed[0].error} if failed else {}),
        )

    # --- one GPU ---------------------------------------------------------------------------

    def _validate(self, command: CapCommand) -> dict[int, float]:
        count = self.backend.count()
        wanted: dict[int, float] = {}
        for cap in command.caps:
            if cap.gpu >= count:
                raise InvalidCapError(f"caps: GPU {cap.gpu} does not exist (this node has {count})")
            if cap.gpu in wanted:
                raise InvalidCapError(f"caps: GPU {cap.gpu} appears twice")
            wanted[cap.gpu] = cap.cap_w
        return wanted

    def _enforced_or_none(self, index: int) -> float | None:
        try:
            return self.backend.enforced_limit_w(index)
        except AgentError:
            return None

    def _was_changed(self, index: int) -> bool:
        """Whether flexgate changed this GPU's limit (its original is saved)."""
        try:
            return self.originals.original_w(self.backend.identity(index)[0]) is not None
        except AgentError:
            return False

    def _save_originals(self, indices: list[int]) -> dict[int, str]:
        """The original limits of the GPUs about to be capped for the first time, saved in one
        write before any changes; the uuid of every GPU whose original is now saved (a GPU
        that cannot be read is left to `_set`, which reports it and saves its original itself
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

    def _set(
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

    def _set_limit(self, index: int, watts: float) -> None:
        """One NVML set, and what it says of the process's permission to set limits."""
        try:
            self.backend.set_limit_w(index, watts)
        except NoPermissionError as exc:
            self.can_cap, self.can_cap_reason = False, str(exc)
            raise
        if self.can_cap is None:  # a refusal stays: a later success would be another GPU's luck
            self.can_cap = True

    def _restore_all(self, indices: list[int], received_at: float) -> list[CapResult]:
        """These GPUs back to their original limits; the ones that read back are forgotten in
        one write (a crash before it restores them again on restart: the same limits)."""
        results, back = [], []
        for index in indices:
            result, uuid = self._restore(index, received_at)
            results.append(result)
            if uuid is not None:
                back.append(uuid)
        self.originals.forget_all(back)
        return results

    def _restore(self, index: int, received_at: float) -> tuple[CapResult, str | None]:
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
            self.delays.append(elapsed)
            self._delays_added += 1
        return CapResult(
            gpu=index,
            requested_w=requested,
            enforced_w=enforced,
            clamped=clamped,
            elapsed_s=elapsed,
            error=error,
        )
