"""Applying a node's desired caps, with leases, generations and restore (docs/agents.md).

- A command is the node's whole desired state: GPUs it does not list go back to their
  original limit.
- Generations only rise: a command older than the last accepted one is refused (409), so a
  delayed retry cannot undo a newer plan. The same generation again renews the lease.
- Every command is validated in full before anything changes (unknown or repeated GPU: 422).
- Each GPU's limit is set, restored, read back and timed by `agents.actuation.GpuActuator`
  (originals saved first, clamps reported, `can_cap` learnt from the sets).
- The lease counts on the agent's monotonic clock from acceptance. When it runs out without
  renewal, every GPU gets its original limit back (`expire`); a restore that fails (a lost
  GPU) is retried at every check until it succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agents.actuation import GpuActuator
from agents.backend import GpuBackend
from agents.errors import InvalidCapError, StaleGenerationError
from agents.logs import decision
from agents.protocol import CapCommand, CapResponse, CapResult, DelayStats
from agents.state import OriginalLimits


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
        self.restore_pending = False  #: a restore failed (lost GPU ...): the watcher retries
        self._gpus = GpuActuator(backend, originals, clock)

    @property
    def can_cap(self) -> bool | None:
        """May this process set limits: None until a set says (`agents.actuation`)."""
        return self._gpus.can_cap

    @property
    def can_cap_reason(self) -> str | None:
        """NVML's refusal, with can_cap False."""
        return self._gpus.can_cap_reason

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
            before = {gpu: self._gpus.enforced_or_none(gpu) for gpu in range(count)}
            uuids = self._gpus.save_originals(sorted(wanted))
            results = [
                self._gpus.set(gpu, cap, received_at, uuids.get(gpu))
                for gpu, cap in sorted(wanted.items())
            ]
            results += self._gpus.restore(
                [gpu for gpu in range(count) if gpu not in wanted and self._gpus.was_changed(gpu)],
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
            results = self._gpus.restore([index for _, (index, _) in sorted(saved.items())], start)
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
        """The actuation delays' percentiles (`agents.actuation.DelayLog`)."""
        return self._gpus.delays.stats()

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

    # --- the command -----------------------------------------------------------------------

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
