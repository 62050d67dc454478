"""How a simulated GPU's board enforces a power limit (docs/fast.md, "The sum of GPU power").

A real GPU's power limit holds an *average*, not every instant. Measured on an H200 (driver
580, `../shared/notes/real-parts.md`, 2026-12-04): under bf16 matmuls at the default 700 W
limit the instant field peaked at 724-802 W (3-15% above the limit) with the SW power-cap
reason set, while the ~1 s average (`nvmlDeviceGetPowerUsage`) stayed at or below 693 W.
`Enforcement` gives a simulated GPU (`agents.simulated.SimulatedBackend`) that behaviour:

- **The average's approach.** After a new limit the board's controller brings the power it
  holds to the limit along a first-order approach of time constant `controller_s`: the level
  still to go falls as `exp(-t / controller_s)` (`remaining`). Not measured (a read-only GPU
  cannot be capped): an assumption. `H200` takes 0.25 s, a quarter of the ~1 s average the
  measured limit holds; `IDEAL` the 30 ms the simulation always had.
- **Instants above the limit.** While the limit binds (the work asks for more than it), the
  instant power swings around the average the controller holds, `overshoot` above and below it
  at the peaks: a sinusoid of period `fluctuation_s` (an assumption: slow enough that the
  sensor's 100 ms readings show it, as they did). `H200` takes 0.1 (770 W at the peak under
  700 W, inside the measured 724-802 W). The swing follows the work, which a synchronous job's
  GPUs do in step: one phase per job (`fluctuation`), drawn from its id, so the jobs of a site
  swing at their own phases and their sum does not.

What the sensor makes of it (each reading held 100 ms, the mean of the last 100 ms) is the
sensor model's, `flexmodel.sensors`, not this module's.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agents.errors import InvalidSetupError


@dataclass(frozen=True)
class Enforcement:
    controller_s: float = 0.03  #: the average's first-order approach to a new limit [s]
    overshoot: float = 0.0  #: the instants' swing around the average while the limit binds
    fluctuation_s: float = 1.0  #: the swing's period [s]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.controller_s) and self.controller_s >= 0.0):
            raise InvalidSetupError(
                f"enforcement: controller_s must be a finite number of seconds >= 0, "
                f"got {self.controller_s}"
            )
        if not (math.isfinite(self.overshoot) and 0.0 <= self.overshoot < 1.0):
            raise InvalidSetupError(
                f"enforcement: overshoot must be a fraction in [0, 1), got {self.overshoot}"
            )
        if not (math.isfinite(self.fluctuation_s) and self.fluctuation_s > 0.0):
            raise InvalidSetupError(
                f"enforcement: fluctuation_s must be a finite number of seconds > 0, "
                f"got {self.fluctuation_s}"
            )

    def remaining(self, elapsed_s: NDArray[np.float64]) -> NDArray[np.float64]:
        """The share of a limit change still to go `elapsed_s` after it (1 at the change and
        before it)."""
        after = np.maximum(elapsed_s, 0.0)
        if self.controller_s == 0.0:
            return np.where(after > 0.0, 0.0, 1.0)
        return np.exp(-after / self.controller_s)

    def fluctuation(self, job_id: str, now: float) -> float:
        """The instant's factor on the average held, at `now` [monotonic s], for a job's GPUs
        whose limit binds: `1 + overshoot * sin(...)`, at the job's own phase."""
        if self.overshoot == 0.0:
            return 1.0
        phase = 2.0 * math.pi * zlib.crc32(job_id.encode()) / 2**32
        return 1.0 + self.overshoot * math.sin(2.0 * math.pi * now / self.fluctuation_s + phase)


#: What the simulation always had: the limit held within tens of ms, never exceeded.
IDEAL = Enforcement()
#: An H200 as measured (the overshoot) and assumed (the controller, the swing's period).
H200 = Enforcement(controller_s=0.25, overshoot=0.1, fluctuation_s=1.0)
#: By name, for the farm's and the bench's command lines.
ENFORCEMENTS = {"ideal": IDEAL, "h200": H200}
