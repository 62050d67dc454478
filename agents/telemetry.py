"""Power samples in ring buffers, and each job's period, duty and phase from them.

A sampler thread reads every GPU's power at `sample_hz` (>= 10 Hz) into a ring buffer per GPU
covering `window_s` seconds. Per job (the GPUs the job mix places on this node), the mean power
of its GPUs gives its iteration period and duty (`flexmodel.phases.estimate_waveform`) and its
phase (`estimate_phase`). The phase is null when the backend's reading averages over too long
for the job's period (NVML's 1 s average for periods under about 3 s). The enforced limits are
sampled with the power, so each job's points per cap level (`agents.levels.CapLevels`) come from
the same trace: the sweep a probe or an event leaves, measured without touching the job.
Each GPU's SM clock is sampled with its power (where the backend reads it): each GPU's recent
mean and the job's mean are reported, and each stretch at one cap gives the job's mean clock
and its clock in the compute phase (`agents.levels.measure`), from which the gateway fits the
job's power-to-clock shape (`flexmodel.dvfs`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np

from agents.backend import GpuBackend
from agents.errors import AgentError
from agents.levels import CapLevels
from agents.protocol import GpuPower, JobTelemetry
from flexmodel.errors import FlexModelError
from flexmodel.phases import estimate_phase, estimate_waveform, phase_at_end
from flexmodel.sensors import SensorModel, sensor_of

MIN_SAMPLE_HZ = 10.0


class Sampler:
    def __init__(
        self,
        backend: GpuBackend,
        jobs: dict[str, list[int]],
        *,
        sample_hz: float = 20.0,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sensor_lag_s: float | None = None,
    ) -> None:
        if sample_hz < MIN_SAMPLE_HZ:
            raise ValueError(f"sample rate {sample_hz:g} Hz is below {MIN_SAMPLE_HZ:g} Hz")
        self.backend = backend
        self.jobs = jobs
        self.interval_s = 1.0 / sample_hz
        self.clock = clock
        size = max(int(window_s * sample_hz), 16)
        self._power = np.full((backend.count(), size), np.nan)
        self._limits = np.full((backend.count(), size), np.nan)
        self._clocks = np.full((backend.count(), size), np.nan)
        self.levels = CapLevels()
        #: The power sensor read (FLEXGATE_AGENT_SENSOR_LAG_S, else by the GPU model): the
        #: phases are corrected by its lag, so GPUs of different models compare.
        # A backend may know its sensor (the simulated one's readings have no lag).
        known: SensorModel | None = getattr(backend, "sensor", None)
        if sensor_lag_s is not None:
            self.sensor = SensorModel.of_lag(sensor_lag_s)
        elif known is not None:
            self.sensor = known
        else:
            name = backend.identity(0)[1] if backend.count() else ""
            self.sensor = sensor_of(name, backend.averaging_s)
        self._times = np.full(size, np.nan)
        self._next = 0
        self._filled = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.read_errors = 0

    def sample_once(self) -> None:
        count = self._power.shape[0]
        row, limits = [math.nan] * count, [math.nan] * count
        clocks = [math.nan] * count
        # The backend as it is now reads a clock or not (a clock missing is no power reading
        # missing: not counted in `read_errors`).
        read_clock: Callable[[int], float | None] | None = getattr(
            self.backend, "sm_clock_mhz", None
        )
        for index in range(count):
            try:
                row[index] = self.backend.power_w(index)
                limits[index] = self.backend.enforced_limit_w(index)
            except AgentError:
                self.read_errors += 1
            if read_clock is not None:
                clocks[index] = _clock_of(read_clock, index)
        with self._lock:
            self._power[:, self._next] = row
            self._limits[:, self._next] = limits
            self._clocks[:, self._next] = clocks
            self._times[self._next] = self.clock()
            self._next = (self._next + 1) % self._times.size
            self._filled = min(self._filled + 1, self._times.size)

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            deadline += self.interval_s
            self._stop.wait(max(deadline - time.monotonic(), 0.0))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="flexgate-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def window(self) -> tuple[np.ndarray, np.ndarray]:
        """(times (S,), power (G, S)), oldest first."""
        times, power, _ = self.window_with_limits()
        return times, power

    def window_with_limits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times (S,), power (G, S), enforced limits (G, S)), oldest first."""
        times, power, limits, _ = self.window_with_clocks()
        return times, power, limits

    def window_with_clocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(times (S,), power (G, S), enforced limits (G, S), SM clocks (G, S) [MHz], NaN
        where not read), oldest first."""
        with self._lock:
            order = np.roll(np.arange(self._times.size), -self._next)[-self._filled :]
            return (
                self._times[order].copy(),
                self._power[:, order].copy(),
                self._limits[:, order].copy(),
                self._clocks[:, order].copy(),
            )

    def gpu_power(self, last: int = 100) -> list[GpuPower]:
        _, power, _, clocks = self.window_with_clocks()
        # Each GPU's mean clock at once (a backend that reads none leaves them all NaN).
        tail = clocks[:, -last:]
        read = np.isfinite(tail)
        counts = read.sum(axis=1)
        means = np.where(read, tail, 0.0).sum(axis=1) / np.maximum(counts, 1)
        return [
            GpuPower(
                index=i,
                power_w=tail_w[np.isfinite(tail_w)].tolist(),
                sample_interval_s=self.interval_s,
                sm_clock_mhz=float(means[i]) if counts[i] else None,
            )
            for i, tail_w in enumerate(power[:, -last:])
        ]

    def job_telemetry(self) -> list[JobTelemetry]:
        times, power, limits, clocks = self.window_with_clocks()
        out = []
        for job_id, gpus in self.jobs.items():
            trace = _mean_over_gpus(power[gpus])
            found = self._estimate(job_id, times, trace)
            if times.size:
                caps = _lowest(limits[gpus])
                clock = _mean_over_gpus(clocks[gpus])
                self.levels.update(job_id, times, trace, caps, self.interval_s, clock)
                reference, points = self.levels.points(job_id)
                now = float(caps[-1]) if np.isfinite(caps[-1]) else None
                found = found.model_copy(
                    update={
                        "sm_clock_mhz": _mean_or_none(clock),
                        "cap_w": now,
                        "reference_cap_w": reference,
                        "points": points,
                        "stretches": self.levels.stretches(job_id),
                    }
                )
            out.append(found)
        return out

    def _estimate(self, job_id: str, times: np.ndarray, trace: np.ndarray) -> JobTelemetry:
        empty = JobTelemetry(
            job_id=job_id, period_s=None, duty=None, phase_rad=None, phase_at=None, power_w=None
        )
        ok = np.isfinite(trace)
        if ok.sum() < 32:
            return empty
        trace, times = trace[ok], times[ok]
        mean = float(trace.mean())
        span = float(times[-1] - times[0])
        try:
            found = estimate_waveform(trace, self.interval_s, max_period_s=max(span / 2.5, 0.5))
        except FlexModelError as exc:
            return empty.model_copy(update={"power_w": mean, "no_period_reason": str(exc)})
        phase = estimate_phase(
            trace, self.interval_s, found.period_s, averaging_s=self.backend.averaging_s
        )
        return JobTelemetry(
            job_id=job_id,
            period_s=found.period_s,
            duty=found.duty,
            phase_rad=None
            if phase is None
            else self.sensor.corrected_phase_rad(
                phase_at_end(phase, times, found.period_s), found.period_s
            ),
            phase_at=None if phase is None else float(times[-1]),
            power_w=mean,
            period_confidence=found.confidence,
        )


def _mean_or_none(values: np.ndarray) -> float | None:
    """The mean of the finite values, None when there are none."""
    ok = np.isfinite(values)
    return float(values[ok].mean()) if ok.any() else None


def _lowest(limits: np.ndarray) -> np.ndarray:
    """Per sample, the lowest limit of the GPUs read (NaN where none was)."""
    known = np.isfinite(limits)
    lowest = np.min(np.where(known, limits, np.inf), axis=0)
    return np.where(known.any(axis=0), lowest, np.nan)


def _mean_over_gpus(power: np.ndarray) -> np.ndarray:
    """The mean over a job's GPUs at each sample, NaN where none has a reading (np.nanmean's
    answer, without its warning on a one-GPU job's missing sample)."""
    count = np.isfinite(power).sum(axis=0)
    total = np.nansum(power, axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _clock_of(read_clock: Callable[[int], float | None], index: int) -> float:
    """GPU `index`'s SM clock now [MHz], NaN where it cannot be read."""
    try:
        value = read_clock(index)
    except AgentError:
        return math.nan
    return math.nan if value is None else float(value)
