"""A delta held on the site's gain (`FLEXGATE_LOOP_DELTA_BASIS` `gain`): no integral of the
meter's level, which a cooling step moves as much as the event; each move of the plan is read
on the meter's own answer to it, once whole, the shed is the sum of the answers, and the next
move is what is left over the gain the last answer showed."""

from __future__ import annotations

import logging
import math

import numpy as np

from flexmodel.meterpath import step_share
from gateway.clock import Clock
from gateway.meter.answercheck import OverheadGains
from gateway.services.loopconfig import LoopConfig
from gateway.services.loopmemory import GAIN_MIN_SHARE, LoopMemory
from gateway.services.pursuit import Pursuit
from gateway.services.site import SitePower
from gateway.services.targets import Targets

log = logging.getLogger("flexgate.gateway")
#: A request that moved less than this share of the reduction (or 0.05 kW) since the last
#: plan is not re-planned.
DEADBAND = 0.002
#: The share of a move a reading must show to be on its plateau; the factor an answer may
#: stray from the gain believed and be read (a site's gain per planned kW is not one number:
#: the deeper cut lands on other jobs); the flatness asked of the meter before and after a
#: move (a share of its answer, beyond 3 sigma of the meter's scatter at rest); how close to
#: the reduction the shed must come [share], or within how many standard deviations of an
#: answer's own noise (the difference of two means of a window's readings).
PLATEAU_SHARE = 0.98
ANSWER_STRAY = 3.0
ANSWER_FLAT = 0.02
ANSWER_CLOSE = 0.02
ANSWER_SIGMAS = 2.0
#: An answer shows the site's gain when it is this many times its noise (`ANSWER_SIGMAS`
#: standard deviations): the gain read is then within 10% of the answer's.
ANSWER_GAIN_NOISE = 10.0
_MAD_TO_SD = 1.4826


class GainHold:
    def __init__(
        self,
        clock: Clock,
        site: SitePower,
        targets: Targets,
        config: LoopConfig,
        memory: LoopMemory,
        overhead_gains: OverheadGains,
    ) -> None:
        self.clock, self.site, self.targets = clock, site, targets
        self.config, self.memory, self.overhead_gains = config, memory, overhead_gains

    def next_move(self, pursuit: Pursuit, *, ready: bool) -> bool:
        """Each move of the plan is answered at the meter and read on its own once whole
        (`_read_answer`): the shed so far is the sum of the answers, and the next move (once
        the loop is `ready` for a plan) is what is left over the gain the last answer showed
        (a secant step on the site's true curve), until the shed is within `ANSWER_CLOSE` of
        the reduction. No integral of the meter's level: a cooling step, a meter offset or
        drifting static load between moves is not the event's, and is not corrected for.
        True when the correction moved and is to be planned."""
        if pursuit.answering and not self._read_answer(pursuit):
            return False  # still answering
        if not ready:
            return False
        left_kw = pursuit.reduction_kw - pursuit.shed_kw
        # What is left is judged against the noise of the answers it was read from, not of one
        # reading: 3 sigmas of one reading let a 2 kW delta on a 0.05 kW meter rest 7% off.
        if abs(left_kw) <= max(ANSWER_CLOSE * pursuit.reduction_kw, self.answer_noise_kw()):
            return False
        most_kw = float((self.targets.last_plan or {}).get("max_facility_kw", math.inf))
        # The first answer, from rest, is the gain over the whole cut: caps above what a job
        # truly draws shed nothing, so past them the next kW shed more than that average.
        # Taken no lower than the model's until a move at depth has shown the slope there.
        slope = pursuit.gain if pursuit.answers > 1 else max(pursuit.gain, 1.0)
        requested = min(max(pursuit.planned_kw + left_kw / slope, 0.0), most_kw)
        if abs(requested - pursuit.planned_kw) <= max(DEADBAND * pursuit.reduction_kw, 0.05):
            return False  # the plan cannot move closer (at its floor, or all of the fleet)
        pursuit.correction_kw = requested - pursuit.reduction_kw
        self.before_move(pursuit)
        return True

    def before_move(self, pursuit: Pursuit) -> None:
        """The meter's level a move's answer is read against: its last window, if flat (a
        move planned while another is answered joins it: their level before stands)."""
        if not pursuit.answering:
            meter, gpu = self._recent_meter()
            pursuit.before_kw = self._flat_level_kw(meter, pursuit)
            pursuit.before_gpu_kw = (
                float(np.mean(gpu)) if gpu.size and self.config.gpu_span_s() else None
            )

    def _read_answer(self, pursuit: Pursuit) -> bool:
        """The meter's answer to the moves awaited, once it shows them whole for a window:
        its level before them less its plateau after, added to the shed, and the gain per
        planned kW it shows; the model's (the gain believed) where the meter was not flat
        before or after, or answered implausibly. False while it is still answering."""
        moves = pursuit.answering
        planned_kw = sum(kw for _, kw in moves)
        read_s, meter, gpu = self._meter_since(moves[0][0])
        shown = sum(
            kw * step_share(read_s - at_s - self.config.dead_s, 0.0, *self.config.path())
            for at_s, kw in moves
        ) / (planned_kw or 1.0)
        plateau = meter[shown >= PLATEAU_SHARE] if planned_kw else meter
        # The agents' power shows the moves whole once its own averaging is past them.
        gpu_after = gpu[read_s >= moves[-1][0] + self.config.gpu_span_s() + self.config.period_s]
        wanted = self.config.window_readings()
        waiting = plateau.size < wanted or (
            pursuit.before_gpu_kw is not None and gpu_after.size < wanted
        )
        feed = self.site.feed
        if waiting and not (feed is None or feed.suspect_since_s is not None):
            return False
        pursuit.answering = []
        after_kw = self._flat_level_kw(plateau[:wanted], pursuit)
        answer_kw = None
        if pursuit.before_kw is not None and after_kw is not None and planned_kw:
            answer_kw = pursuit.before_kw - after_kw
            if pursuit.before_gpu_kw is not None and gpu_after.size:
                # A static step between the meter's level before and after is not the moves'.
                gpu_kw = pursuit.before_gpu_kw - float(np.mean(gpu_after[:wanted]))
                answer_kw = self.overhead_gains.answer_kw(answer_kw, gpu_kw, self.answer_noise_kw())
            answer_kw = self._judged_kw(pursuit, answer_kw, planned_kw)
        pursuit.shed_kw += pursuit.gain * planned_kw if answer_kw is None else answer_kw
        pursuit.settled_share = pursuit.achieved_kw / max(pursuit.reduction_kw, 1e-9) - 1.0
        pursuit.settled_error_kw = pursuit.achieved_kw - pursuit.reduction_kw
        return True

    def _judged_kw(self, pursuit: Pursuit, answer_kw: float, planned_kw: float) -> float | None:
        """The answer as believed [kW] (None: not believed, the model's stands), and the
        site's gain from it where it is large enough to show one."""
        feed = self.site.feed
        gain = answer_kw / planned_kw
        if gain < pursuit.gain / ANSWER_STRAY and feed is not None and feed.suspicion is None:
            # Caps above what the jobs truly draw shed (next to) nothing: a meter its watch
            # believes says so, and the shed is what it shows. Not the site's gain: the next
            # kW, below the jobs' true draw, shed as the model's do.
            log.info(
                "site loop: the meter shows %.2f kW for %.2f kW planned: caps above the "
                "jobs' true draw",
                answer_kw,
                planned_kw,
            )
            return max(answer_kw, 0.0)
        elif not 1.0 / ANSWER_STRAY <= gain / pursuit.gain <= ANSWER_STRAY:
            log.info(
                "site loop: the meter's answer %.2f kW to %.2f kW planned is not "
                "believed (gain %.2f)",
                answer_kw,
                planned_kw,
                pursuit.gain,
            )
            return None
        elif abs(planned_kw) >= GAIN_MIN_SHARE * (pursuit.start_facility_kw or 0.0) and (
            abs(answer_kw) >= ANSWER_GAIN_NOISE * self.answer_noise_kw()
        ):
            if not pursuit.answers:  # its first answer: the site's gain from now on
                self.memory.answer_gains.append(gain)
            pursuit.answers += 1
            pursuit.gain = gain
        return answer_kw

    def _meter_since(self, since_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The meter's readings from `since_s` on: when each was read, its kW, and the
        agents' GPU power in the same samples [kW]."""
        samples = [s for s in self.site.history if s.at_s >= since_s and s.facility_kw is not None]
        return (
            np.array([s.reading_at_s for s in samples]),
            np.array([s.facility_kw for s in samples], dtype=float),
            np.array([s.gpu_kw for s in samples], dtype=float),
        )

    def _recent_meter(self) -> tuple[np.ndarray, np.ndarray]:
        """The meter's last window of readings [kW], and the agents' GPU power in them."""
        samples = [s for s in self.site.history if s.facility_kw is not None]
        samples = samples[-self.config.window_readings() :]
        return (
            np.array([s.facility_kw for s in samples], dtype=float),
            np.array([s.gpu_kw for s in samples], dtype=float),
        )

    def answer_noise_kw(self) -> float:
        """`ANSWER_SIGMAS` standard deviations of an answer's noise [kW]: the difference of
        two means of a window's readings."""
        noise_kw = self._rest_noise_kw() * math.sqrt(2.0 / self.config.window_readings())
        return ANSWER_SIGMAS * noise_kw

    def _flat_level_kw(self, meter: np.ndarray, pursuit: Pursuit) -> float | None:
        """The meter's level over these readings [kW]; None unless there are a window's worth
        and their halves agree within 3 sigma of the meter's scatter at rest and
        `ANSWER_FLAT` of the reduction (a cooling step inside them does not)."""
        if meter.size < self.config.window_readings():
            return None
        first, second = np.array_split(meter, 2)
        tolerance_kw = 3.0 * self._rest_noise_kw() + ANSWER_FLAT * pursuit.reduction_kw
        if abs(float(np.mean(first) - np.mean(second))) > tolerance_kw:
            return None
        return float(np.mean(meter))

    def _rest_noise_kw(self) -> float:
        """The meter's scatter, reading to reading (robust: the loop's own steps and a
        cooling step do not count), or as declared if larger [kW]."""
        readings = [s.facility_kw for s in self.site.history if s.facility_kw is not None]
        changes = np.diff(np.array(readings[-4 * self.config.window_readings() :], dtype=float))
        spread = 0.0
        if changes.size > 2:
            spread = _MAD_TO_SD * float(np.median(np.abs(changes - np.median(changes))))
        return max(spread / math.sqrt(2.0), self.config.settings.meter_noise_kw)
