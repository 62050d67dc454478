"""Steps under a level that no plan made, moved at once rather than left to the integral: the
static load's (a chiller cycling: the meter less the GPU power it shows), and the agents' GPU
power's (a job that started, ended or drifted before the scheduler reports it)."""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import numpy as np

from gateway.clock import Clock
from gateway.meter.answercheck import OverheadGains
from gateway.services.loopconfig import LoopConfig
from gateway.services.loopmemory import GAIN_MIN_SHARE, LoopMemory
from gateway.services.pursuit import Pursuit, asked_at_meter_kw
from gateway.services.site import Sample, SitePower
from gateway.services.staticstep import (
    AFTER_READINGS,
    FED_ANSWER_SHARE,
    METER_STEPS,
    STEP_FLOOR_SHARE,
    gpu_step_kw,
    shown_gpu_kw,
    static_step_kw,
)
from gateway.services.targets import Targets

log = logging.getLogger("flexgate.gateway")
#: The agents' GPU power is taken to scatter at least this much, reading to reading [kW].
GPU_NOISE_KW = 0.01
#: The latest readings of the GPU power a step is looked for in (more than any window needs).
GPU_STEP_READINGS = 60


class FeedForward:
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

    def moved(self, pursuit: Pursuit, plan: dict[str, Any]) -> bool:
        """A feed-forward's answer read, or a step no plan made fed forward: True when the
        correction moved and is to be planned."""
        return (
            self._fed_answer(pursuit, plan)
            or self._static_step(pursuit, plan)
            or self._gpu_step(pursuit, plan)
        )

    def _static_step(self, pursuit: Pursuit, plan: dict[str, Any]) -> bool:
        """A step of the static load under a level, moved at once (`staticstep`): the
        correction becomes what it was before the step showed plus the step, and the integral
        keeps only the residual."""
        readings = [s for s in self.site.history if s.facility_kw is not None]
        before = self.config.window_readings()
        readings = [s for s in readings[-before - AFTER_READINGS :] if s.at_s > pursuit.fed_s]
        if pursuit.level_kw is None or len(readings) < before + AFTER_READINGS:
            return False
        if not self.config.gpu_span_s():
            return False  # the agents send no power readings
        path = self.site.meter_path()
        since_s = readings[0].reading_at_s - path.dead_s - 5 * path.tau_s - path.averaging_s
        gpus = [s for s in self.site.history if s.at_s >= since_s - self.config.period_s]
        reading_s = np.array([s.reading_at_s for s in readings])
        gpu_s, gpu_kw = np.array([s.at_s for s in gpus]), np.array([s.all_gpu_kw for s in gpus])
        shown = shown_gpu_kw(gpu_s, gpu_kw, reading_s, path)
        meter = np.array([s.facility_kw for s in readings], dtype=float)
        gain = self._overhead_gain(pursuit, float(np.mean(meter[:before])), shown[:before])
        static = meter - gain * shown
        meter_step_kw = 0.0 if self.site.feed is None else self.site.feed.step_kw
        floors = (
            self.config.settings.meter_noise_kw,
            max(STEP_FLOOR_SHARE * asked_at_meter_kw(pursuit), METER_STEPS * meter_step_kw),
        )
        step_kw = static_step_kw(static, shown, before, gain, floors)
        if step_kw == 0.0:
            return False
        showed_s = readings[before].at_s
        taken = [c for at_s, c, _ in pursuit.corrections if at_s < showed_s]
        per_kw = self._meter_per_planned(pursuit, gain, float(np.mean(shown[:before])))
        correction = (taken[-1] if taken else pursuit.correction_kw) + step_kw / per_kw
        pursuit.static_fed_kw += step_kw / per_kw  # the correction's bound widens by it
        pursuit.correction_kw = self.memory.bounded(pursuit, correction, plan)
        pursuit.fed_gpu = (gpu_kw[-1], gpu_kw[-1] - step_kw / gain, pursuit.achieved_kw)
        pursuit.fed_s = self.clock.monotonic()
        pursuit.corrections.append((pursuit.fed_s, pursuit.correction_kw, pursuit.gain))
        log.info("site loop: the static load stepped %+.2f kW: fed forward", step_kw)
        return True

    def _gpu_step(self, pursuit: Pursuit, plan: dict[str, Any]) -> bool:
        """A step of the agents' GPU power under a level that no plan made (a job started,
        ended or drifted: the scheduler reports a job seconds to a minute late, and the meter
        shows it only after its dead time), moved at once: the correction by the step at the
        meter (the overhead gain times it) over the site's gain per planned kW, and the step
        expected at the meter. True when the correction moved."""
        if pursuit.level_kw is None or not self.config.gpu_span_s():
            return False
        gain = self.overhead_gains.gain or self.site.overhead.current().k
        floors = (GPU_NOISE_KW, STEP_FLOOR_SHARE * asked_at_meter_kw(pursuit) / gain)
        ramp = math.ceil(self.config.gpu_span_s() / self.config.period_s)
        before = self.config.window_readings()
        # Every GPU's power, once the last plan is actuated (its own moves are not a step
        # no plan made); and the GPUs no placed job holds, which no plan moves, at once: a
        # job starting on them before the scheduler reports it is seen while the loop is
        # still re-planning, each period, towards a level.
        planned_s = self.targets.planned_at_s + self.config.actuated_s() + self.config.period_s
        every = self._gpu_since(max(planned_s, pursuit.gpu_fed_s))
        unheld = self._gpu_since(max(pursuit.mix_changed_s, pursuit.gpu_fed_s))
        # Unheld GPUs are idle or a job no plan caps: a shorter stretch before a step will do.
        short = max(min(before, len(unheld) - ramp - AFTER_READINGS), 2)
        samples = every
        step_kw = gpu_step_kw(np.array([s.all_gpu_kw for s in every]), before, ramp, floors)
        if step_kw == 0.0:
            samples = unheld
            power = np.array([s.all_gpu_kw - s.gpu_kw for s in unheld])
            step_kw = gpu_step_kw(power, short, ramp, floors)
        if step_kw == 0.0:
            return False
        meter_kw = gain * step_kw
        if pursuit.reference_kw is not None:  # the site without the event moved with it
            pursuit.reference_kw += meter_kw
        taken_kw = pursuit.correction_kw
        correction = pursuit.correction_kw + meter_kw / pursuit.gain
        pursuit.correction_kw = self.memory.bounded(pursuit, correction, plan)
        pursuit.gpu_fed_meter_kw += meter_kw
        pursuit.gpu_fed_kw += pursuit.correction_kw - taken_kw
        # The step is on its way to the meter: expected there from when the agents showed it.
        pursuit.moves.append((samples[-AFTER_READINGS].at_s - self.config.gpu_span_s(), meter_kw))
        pursuit.gpu_fed_s, pursuit.churned = self.clock.monotonic(), True
        pursuit.corrections.append((pursuit.gpu_fed_s, pursuit.correction_kw, pursuit.gain))
        log.info("site loop: the GPU power stepped %+.2f kW with no plan: fed forward", step_kw)
        return True

    def reported_at_s(self, pursuit: Pursuit, move_kw: float) -> float:
        """When the agents' GPU power showed the job mix's move the scheduler reports now
        (`move_kw` at the meter: a job that ended or started): the largest step of every
        GPU's power since the mix last changed, the plans' own moves taken out, the same way
        as the move and beyond the GPU feed-forward's floor. Expected at the meter from
        the report instead, a move the meter has been showing since would be counted twice:
        under a level the loop gave a job's end back twice, 5% over a limit for minutes.
        Now where no such step shows (the feed-forward took it, or the agents send no power)."""
        now_s = self.clock.monotonic()
        samples = self._gpu_since(pursuit.mix_changed_s)
        span_s = self.config.gpu_span_s()
        ramp = math.ceil(span_s / self.config.period_s)
        edge = AFTER_READINGS
        if move_kw == 0.0 or not span_s or len(samples) < 2 * edge + ramp:
            return now_s
        at_s = np.array([s.at_s for s in samples])
        actuated_s = self.config.actuated_s()
        made = pursuit.planned_gpu
        planned_kw = np.array([sum(kw for s, kw in made if s + actuated_s <= t) for t in at_s])
        residual_kw = np.array([s.all_gpu_kw for s in samples]) - planned_kw
        # A job ends or starts capped: its GPUs step by its capped draw, not by the baseline's
        # move, so any step the same way beyond the feed-forward's floor is taken.
        gain = self.overhead_gains.gain or self.site.overhead.current().k
        stepped_s, largest_kw = now_s, STEP_FLOOR_SHARE * asked_at_meter_kw(pursuit) / gain
        for i in range(edge, len(samples) - ramp - edge + 1):
            after_kw = float(np.mean(residual_kw[i + ramp : i + ramp + edge]))
            step_kw = after_kw - float(np.mean(residual_kw[i - edge : i]))
            if step_kw * move_kw > 0.0 and abs(step_kw) >= largest_kw:
                stepped_s, largest_kw = float(at_s[i + ramp]) - span_s, abs(step_kw)
        return stepped_s

    def _gpu_since(self, since_s: float) -> list[Sample]:
        """The site's latest samples after `since_s`, in order (at most `GPU_STEP_READINGS`)."""
        since = itertools.takewhile(lambda s: s.at_s > since_s, reversed(self.site.history))
        return list(itertools.islice(since, GPU_STEP_READINGS))[::-1]

    @staticmethod
    def reported(pursuit: Pursuit, move_kw: float) -> float:
        """The model's baseline moved by `move_kw` at the meter (the scheduler reported a job
        that started or ended): where a GPU power step the same way was fed forward first, the
        meter already expects it, and the site without the event moves by the model's move
        from now on. Returns the move still to expect [kW]."""
        if pursuit.gpu_fed_meter_kw * move_kw <= 0.0:
            return move_kw
        pursuit.gpu_fed_meter_kw = 0.0
        return 0.0

    @staticmethod
    def taken_over(pursuit: Pursuit, moved_kw: float) -> None:
        """A level's reduction moved by `moved_kw` with the job mix: as far as it moved the
        way a GPU power step fed forward did, it carries that step now, not the correction."""
        fed_kw = pursuit.gpu_fed_kw
        if fed_kw * moved_kw > 0.0:
            pursuit.correction_kw -= math.copysign(min(abs(fed_kw), abs(moved_kw)), fed_kw)
        pursuit.gpu_fed_kw = 0.0

    def _fed_answer(self, pursuit: Pursuit, plan: dict[str, Any]) -> bool:
        """A feed-forward's answer on the agents' GPU power, once actuated (no meter dead
        time to wait for): what it fell short of, or beyond, the GPU power it aimed at is
        moved by the plan's own answer per planned kW, once. True when the correction moved."""
        if pursuit.fed_gpu is None:
            return False
        if self.clock.monotonic() - pursuit.fed_s < self.config.actuated_s() + self.config.period_s:
            return False
        (from_kw, aim_kw, planned_kw), pursuit.fed_gpu = pursuit.fed_gpu, None
        moved_kw, wanted_kw = from_kw - self.site.history[-1].all_gpu_kw, from_kw - aim_kw
        planned_kw = pursuit.achieved_kw - planned_kw
        if moved_kw * wanted_kw <= 0.0 or abs(moved_kw) < FED_ANSWER_SHARE * abs(wanted_kw):
            return False  # not the plan's answer (a job ended, the plan was short)
        correction = pursuit.correction_kw + (wanted_kw - moved_kw) * planned_kw / moved_kw
        pursuit.correction_kw = self.memory.bounded(pursuit, correction, plan)
        pursuit.corrections.append((self.clock.monotonic(), pursuit.correction_kw, pursuit.gain))
        return True

    def _overhead_gain(self, pursuit: Pursuit, meter_kw: float, shown_kw: np.ndarray) -> float:
        """Facility kW per GPU kW at the meter: as this event's shed showed it (the meter
        before it less `meter_kw` now, per GPU kW the meter shows shed, `shown_kw`), or as
        the deltas' answers did, or the overhead model's."""
        fallback = self.overhead_gains.gain or self.site.overhead.current().k
        start_kw, gpu_kw = pursuit.start_facility_kw, pursuit.start_gpu_kw
        if start_kw is None or gpu_kw is None:
            return fallback
        shed_gpu_kw = gpu_kw - float(np.mean(shown_kw))
        if shed_gpu_kw * fallback < GAIN_MIN_SHARE * start_kw:
            return fallback
        seen = (start_kw - meter_kw) / shed_gpu_kw
        return seen if 0.5 * fallback <= seen <= 2.0 * fallback else fallback

    @staticmethod
    def _meter_per_planned(pursuit: Pursuit, gain: float, gpu_kw: float) -> float:
        """The meter's kW per kW the model plans in this event: the agents' GPU power the
        plan shed since the event began (`gpu_kw` now) times the overhead `gain`, per planned
        kW; the predictor's gain where that is not known or out of its bounds."""
        if pursuit.start_gpu_kw is None or pursuit.achieved_kw <= 0.0:
            return pursuit.gain
        per_kw = gain * (pursuit.start_gpu_kw - gpu_kw) / pursuit.achieved_kw
        return per_kw if 0.5 <= per_kw <= 1.5 else pursuit.gain
