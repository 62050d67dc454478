"""Each job's telemetry features for the PFI predictor, over its uncapped run.

Every `period_s` the sampler reads each GPU's memory copy utilisation (the backend: NVML's
utilisation rates) and DRAM activity (a `DramActivitySource`: DCGM's exporter, or the
simulated GPUs), and keeps the last `samples` readings per GPU taken while this agent had not
capped it (`capped()`): the study's features are the uncapped run's, and a cap changes them
(a lower SM clock leaves the memory busier per instruction). Readings taken under a cap are
dropped, so an hour of curtailment does not erase what the uncapped hours showed.

A job's features are its GPUs' means; its DRAM copy product is the product of the two means.
Without DRAM activity (a node without DCGM) the product is None: memory copy utilisation alone
is a different feature from the one the predictor was fitted on.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from agents.backend import GpuBackend
from agents.errors import AgentError
from agents.protocol import JobTelemetry

log = logging.getLogger("flexgate.agent")


@runtime_checkable
class DramActivitySource(Protocol):
    def read_dram_active(self) -> dict[int, float]:
        """GPU index -> DRAM activity [0-1] now; raises an `AgentError` saying why not."""
        ...


class FeatureSampler:
    def __init__(
        self,
        backend: GpuBackend,
        jobs: dict[str, list[int]],
        dram: DramActivitySource | None,
        *,
        capped: Callable[[], set[int]] = set,
        period_s: float = 5.0,
        samples: int = 120,
    ) -> None:
        if period_s <= 0 or samples < 1:
            raise ValueError("the feature period must be positive and keep at least one sample")
        self.backend, self.jobs, self.dram = backend, jobs, dram
        self.capped = capped
        self.period_s = period_s
        count = backend.count()
        self._mem: list[deque[float]] = [deque(maxlen=samples) for _ in range(count)]
        self._dram: list[deque[float]] = [deque(maxlen=samples) for _ in range(count)]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None  #: why the last DRAM reading failed; None when it did not
        self.read_errors = 0

    def sample_once(self) -> None:
        capped = self.capped()
        free = [i for i in range(len(self._mem)) if i not in capped]
        mem: dict[int, float] = {}
        for index in free:
            try:
                value = self.backend.memory_utilisation(index)
            except AgentError:
                self.read_errors += 1
                continue
            if value is not None:
                mem[index] = value
        dram: dict[int, float] = {}
        if self.dram is not None and free:
            try:
                dram = self.dram.read_dram_active()
                self.error = None
            except AgentError as exc:
                self.read_errors += 1
                self.error = str(exc)
        with self._lock:
            for index, value in mem.items():
                self._mem[index].append(value)
            for index in free:
                if index in dram:
                    self._dram[index].append(dram[index])

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sample_once()
            except Exception:  # a reading gone wrong must not end the readings
                self.read_errors += 1
                log.exception("reading the PFI predictor's features failed")

    def start(self) -> None:
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="flexgate-features", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def job_features(self, gpus: list[int]) -> dict[str, float | int | None]:
        """The features of a job on these GPUs: the JobTelemetry fields."""
        with self._lock:
            mem = [v for g in gpus if g < len(self._mem) for v in self._mem[g]]
            dram = [v for g in gpus if g < len(self._dram) for v in self._dram[g]]
        copy = sum(mem) / len(mem) if mem else None
        active = sum(dram) / len(dram) if dram else None
        return {
            "mem_copy_util": copy,
            "dram_active": active,
            "dram_copy_product": None if copy is None or active is None else copy * active,
            "feature_samples": min(len(mem), len(dram)),
        }

    def apply(self, jobs: list[JobTelemetry]) -> list[JobTelemetry]:
        """These jobs' telemetry with their features."""
        return [
            job.model_copy(update=self.job_features(self.jobs.get(job.job_id, []))) for job in jobs
        ]
