"""A meter's answer to one of the site loop's moves, checked on the agents' GPU power.

A delta held on the site's gain reads each move's answer at the meter: its level before the
move less its plateau after (`gateway.services.tracking`). A static load step between the two
(a chiller cycling) is in that difference, and nothing in the meter alone tells it from the
move's own. The agents' GPU power sees the move but not the static load: its answer (the same
readings' GPU power, before less after) times the site's overhead gain at the meter (facility
kW per GPU kW, as the meter answered the site's past moves: the median of the last
`GAINS_KEPT`) is what the move shed at the meter. A meter's answer further from that than the
answers' noise and `STRAY` of it carries a step that is not the move's: the GPU power's answer
times the gain is taken instead.

Every answer's own gain is kept, the ones not taken too: a site whose gain truly moved (a job's
power drifting, a job ended) has its answers taken again once they are the median.
"""

from __future__ import annotations

from collections import deque

import numpy as np

#: The answers' overhead gains kept, and how many are needed before any answer is checked.
GAINS_KEPT = 9
GAINS_NEEDED = 3
#: An answer this far (a share of the expected, beyond its noise) from the GPU power's answer
#: times the gain carries a step of its own.
STRAY = 0.05
#: An answer's gain is kept when the meter's answer is this many times its noise.
GAIN_SIGMAS = 5.0


class OverheadGains:
    """The site's overhead gain at the meter, as its answers show it, and the check."""

    def __init__(self) -> None:
        self.gains: deque[float] = deque(maxlen=GAINS_KEPT)
        self.replaced = 0  #: answers taken from the GPU power instead of the meter

    @property
    def gain(self) -> float | None:
        """Facility kW per GPU kW at the meter, once `GAINS_NEEDED` answers have shown it."""
        return float(np.median(self.gains)) if len(self.gains) >= GAINS_NEEDED else None

    def answer_kw(self, meter_kw: float, gpu_kw: float, noise_kw: float) -> float:
        """The move's answer at the meter [kW]: the meter's (`meter_kw`, within `noise_kw`),
        or the GPU power's (`gpu_kw`) times the gain where the meter's strays from that."""
        gain = self.gain
        if gpu_kw > 0.0 and meter_kw > GAIN_SIGMAS * noise_kw:
            self.gains.append(meter_kw / gpu_kw)
        if gain is None:
            return meter_kw
        expected_kw = gain * gpu_kw
        if abs(meter_kw - expected_kw) <= noise_kw + STRAY * abs(expected_kw):
            return meter_kw
        self.replaced += 1
        return expected_kw
