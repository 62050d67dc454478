"""GPU power sensors as models, so a phase read through one can be corrected.

docs/model.md, section 9, "The sensor's lag".

A power reading is not the power now: NVML's instant field on an H200 holds each reading for
100 ms and reaches 90% of a step about 120 ms after the work changes (a hold plus an
averaging, not a pure delay); `nvmlDeviceGetPowerUsage` on older parts is a 1 s average. Both
are linear-phase filters: a reading held for `update_s` (zero-order hold) is late by
`update_s / 2` on average, a mean over `average_s` by `average_s / 2`. So the model's phase at
frequency `f` is `2 pi f lag_s` with `lag_s = (update_s + average_s) / 2`, and a phase read at
harmonic `k` of a period `T` is corrected by adding `2 pi k lag_s / T`. One model's lag cancels
between its GPUs; a fleet of mixed models does not, hence the correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SensorModel:
    field: str  #: "instant" or "average"
    update_s: float  #: each reading is held this long [s]
    average_s: float  #: each reading is the mean over this long [s]

    @property
    def lag_s(self) -> float:
        """The effective lag: the delay of the hold's and the average's centres [s]."""
        return 0.5 * (self.update_s + self.average_s)

    def phase_lag_rad(self, period_s: float, harmonic: int = 1) -> float:
        """How late the sensor reads harmonic `harmonic` of a period `period_s` [rad]."""
        return 2.0 * math.pi * harmonic * self.lag_s / period_s

    def corrected_phase_rad(self, phase_rad: float, period_s: float, harmonic: int = 1) -> float:
        """A phase read through the sensor, as the power's own (0 to 2 pi) [rad]."""
        return (phase_rad + self.phase_lag_rad(period_s, harmonic)) % (2.0 * math.pi)

    @classmethod
    def of_lag(cls, lag_s: float) -> SensorModel:
        """A sensor given by its effective lag alone (FLEXGATE_AGENT_SENSOR_LAG_S,
        `flexgate trace --sensor-lag-s`): a hold and an average of `lag_s` each."""
        if not (lag_s >= 0.0 and math.isfinite(lag_s)):
            raise ValueError(f"a sensor's lag must be a finite number of seconds >= 0, got {lag_s}")
        return cls(field="given", update_s=lag_s, average_s=lag_s)


#: By GPU model: the H200's instant field as measured (held 100 ms, 90% of a step in about
#: 120 ms: lag 0.1 s); the parts of one generation alike; older parts read through
#: `nvmlDeviceGetPowerUsage`, a 1 s average updated every 100 ms.
SENSORS: dict[str, SensorModel] = {
    "H100": SensorModel("instant", 0.1, 0.1),
    "H200": SensorModel("instant", 0.1, 0.1),
    "B200": SensorModel("instant", 0.1, 0.1),
}
DEFAULT_SENSOR = SensorModel("average", 0.1, 1.0)


def sensor_of(gpu_name: str, averaging_s: float) -> SensorModel:
    """The sensor a backend reads: an average over `averaging_s` updated every 100 ms where it
    averages, else the GPU model's instant field by the table, else an instantaneous reading
    (lag 0: the simulated GPUs')."""
    if averaging_s > 0:
        return SensorModel("average", 0.1, averaging_s)
    for model, sensor in SENSORS.items():
        if model in gpu_name.upper():
            return sensor
    return SensorModel("instant", 0.0, 0.0)


def sensor_for(gpu_name: str) -> SensorModel:
    """The sensor of a GPU by its name as NVML reports it ("NVIDIA H200", ...)."""
    for model, sensor in SENSORS.items():
        if model in gpu_name.upper():
            return sensor
    return DEFAULT_SENSOR
