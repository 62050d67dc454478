"""What a simulated GPU's power sensor shows (`agents.simulated`).

Without a sensor model the readings are the power as it is. With one (`flexmodel.sensors`),
as a real GPU's: each reading is held `update_s`, the mean of the power over the `average_s`
before it was made, and its updates fall at `offset_s` plus whole `update_s` (real GPUs'
sensors keep no common time).
"""

from __future__ import annotations

import math

import numpy as np

from agents.simphysics import NodePhysics
from flexmodel.sensors import SensorModel

#: Points of the true power a simulated sensor's averaging reads.
SENSOR_POINTS = 8


class SimSensor:
    def __init__(self, model: SensorModel, offset_s: float, physics: NodePhysics) -> None:
        self.model = model
        self.offset_s = offset_s
        self.physics = physics

    @property
    def instant(self) -> bool:
        return self.model.update_s <= 0.0 and self.model.average_s <= 0.0

    def reading(self, index: int, now: float) -> float:
        """What the sensor shows now: the reading made at its last update, the mean of the
        power over its averaging before then. Times before the GPU's last cap change (or its
        job's last retiming) read as at that moment: the pace before it is not kept."""
        if self.instant:
            return self.physics.power(index, now)
        return self.reading_made(index, self.made(now))

    def made(self, now: float) -> float:
        """When the reading the sensor shows at `now` was made."""
        update_s, offset = self.model.update_s, self.offset_s
        return math.floor((now - offset) / update_s) * update_s + offset if update_s > 0 else now

    def reading_made(self, index: int, made: float) -> float:
        """The reading made at `made`: the mean of the power over the averaging before."""
        earliest = self.physics.gpus[index].known_since()
        offsets = self.model.average_s * (np.arange(SENSOR_POINTS) + 0.5) / SENSOR_POINTS
        return float(np.mean([self.physics.power(index, max(made - o, earliest)) for o in offsets]))

    def trace(self, index: int, times: np.ndarray) -> np.ndarray:
        """What the sensor shows at each of `times` (each reading made once) [W]."""
        if self.instant:
            return np.array([self.physics.power(index, t) for t in times])
        made = np.array([self.made(t) for t in times])
        unique, where = np.unique(made, return_inverse=True)
        readings = np.array([self.reading_made(index, m) for m in unique])
        return readings[where]
