"""The closed site loop: during an event, the meter's reading is held at the event's target.

The planner's caps come from the declared job mix and the overhead model; the meter sees
the truth. Every sample of the site (`SitePower`, each meter period) the loop compares the
facility power, averaged over its window, with the target level and integrates the error into
a correction of the requested reduction, re-planned through the same allocator:

    error = measured + unseen - target level   [kW at the meter; > 0: shed more]
    correction += k_i * period * error         (held while the meter faults)
    requested = event's reduction + correction, within [0, the site's most]

- The target level is the event's level (a setpoint), or the facility power just before the
  event (averaged over the window; the model's baseline when the meter had no whole window
  yet) less its reduction, moved by the model's baseline when the job mix changes.
- A delta where there is a meter is held on the site's gain instead (`FLEXGATE_LOOP_DELTA_BASIS`
  `gain`, the default): no integral of the meter's level, which a cooling step moves as much
  as the event; each move of the plan is read on the meter's own answer to it, once whole, the
  shed is the sum of the answers, and the next move is what is left over the gain the last
  answer showed (`gateway.services.gainhold`).
- The meter sees each move late: a re-plan after the loop's dead time (the meter's age, the
  plan and dispatch, the agents' actuation), through the cooling's lag, spread over the window
  the reading is averaged on. The loop does not wait for it (a Smith predictor): `unseen` is
  what its own plans and the job mix's model baseline have moved but the window does not show
  yet, so the loop integrates only the model's error, from the event's first sample on.
- `k_i = loop_gain / period`: each sample takes `loop_gain` of that error. The delay is out of
  the loop's nominal path; what goes round it is the model's error only, so with `loop_gain`
  <= 1 the loop is stable whenever the site's true response per planned kW is within 100% of
  the model's (the small-gain theorem: that residual loop has gain |1 - true/model| < 1).
- Pacing: after a re-plan that took longer than a period (a fan-out to thousands of nodes)
  the loop skips samples for as long as it took, so it never keeps the dispatch busy more
  than half the time and events' plans get through; its period is then that long.
- Anti-windup: the correction stops growing while the plan is short (every job at its floor)
  and stops falling while nothing is requested; it is bounded by `loop_max_correction` of the
  reduction.
- The window averages the site's power over at least four of the longest capped iteration
  periods, so the loop barely sees the jobs' own swings. Before the loop acts, and whenever the
  capped periods or the measured delay move, its configuration (delay, window, sample-and-hold,
  integral gain, at the gain the jobs' rate per watt gives it) goes through the sync analysis
  (`flexmodel.sync`) for every significant harmonic. A configuration it rejects is refused
  with the reason and the loop runs a safe one (a longer window, a lower gain), or holds. Only
  the lab's lock scenario keeps a rejected one (`FLEXGATE_LOOP_UNSAFE`, refused outside the
  lab), with the verdict and the reason said.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from flexmodel.jobs import JobMix
from flexmodel.loopresponse import ClosedLoopResponse
from gateway.clock import Clock
from gateway.meter.answercheck import OverheadGains
from gateway.services.feedforward import FeedForward
from gateway.services.fleet import Fleet
from gateway.services.gainhold import DEADBAND, GainHold
from gateway.services.jobbook import JobBook
from gateway.services.loopconfig import LoopConfig
from gateway.services.loopmemory import LoopMemory
from gateway.services.pursuit import (
    PLANNED_KEPT,
    Pursuit,
    carried_correction_kw,
)
from gateway.services.reference import SiteReference
from gateway.services.site import SitePower
from gateway.services.smithpredictor import SmithPredictor
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings

log = logging.getLogger("flexgate.gateway")
#: An error within this many standard deviations of the window's noise is not corrected.
NOISE_SIGMAS = 2.0
_MAD_TO_SD = 1.4826


class Tracker:
    def __init__(
        self,
        settings: GatewaySettings,
        clock: Clock,
        site: SitePower,
        targets: Targets,
        book: JobBook,
        fleet: Fleet,
    ) -> None:
        self.settings, self.clock, self.site = settings, clock, site
        self.targets, self.book, self.fleet = targets, book, fleet
        self.pursuit: Pursuit | None = None
        self.config = LoopConfig(settings, site, fleet)
        self.predictor = SmithPredictor(clock, site, self.config)
        self.memory = LoopMemory(settings)
        #: the meter's answers checked on the agents' GPU power (a static step under one)
        self.overhead_gains = OverheadGains()
        parts = (clock, site, targets, self.config, self.memory, self.overhead_gains)
        self.gain_hold = GainHold(*parts)
        self.feed_forward = FeedForward(*parts)
        self.reference = SiteReference(settings, clock, site, self.config, self.feed_forward)
        self._ready_s = -math.inf  #: no loop step before (the last re-plan's end plus its length)
        targets.site_loop = self.loop_model  # every plan's sync verdict judges this loop

    async def pursue(
        self, event_id: str, reduction_kw: float, level_kw: float | None, *, ceiling: bool = False
    ) -> None:
        """Deliver this event's target at the meter from now on (the open-loop plan first).
        A `ceiling` level is a maximum: held below it by the loop's margin (`limit_margin_kw`)."""
        known = self.pursuit if self.pursuit and self.pursuit.event_id == event_id else None
        if known is None:
            known = self._begin(event_id, reduction_kw, level_kw)
        moved = (
            reduction_kw != known.reduction_kw if level_kw is None else level_kw != known.level_kw
        )
        if moved or ceiling != known.ceiling:
            known.target_since_s = self.clock.monotonic()
            if known.on_gain:
                known.correction_kw = reduction_kw / known.gain - reduction_kw
                self.gain_hold.before_move(known)
            elif level_kw is None and known.level_kw is None:
                known.correction_kw = carried_correction_kw(known, reduction_kw)
        elif level_kw is not None and reduction_kw != known.reduction_kw:
            FeedForward.taken_over(known, reduction_kw - known.reduction_kw)
        known.reduction_kw, known.level_kw, known.ceiling = reduction_kw, level_kw, ceiling
        margin_kw = self.memory.limit_margin_kw(level_kw) if ceiling and level_kw else 0.0
        if known.target_since_s == self.clock.monotonic():
            # A new target: the open-loop plan takes the margin at once; after that the loop
            # follows it (it moves the target, which the loop's error sees).
            known.correction_kw += margin_kw - known.margin_kw
        known.margin_kw = margin_kw
        await self._plan(known)

    def _begin(self, event_id: str, reduction_kw: float, level_kw: float | None) -> Pursuit:
        """A new event: the loop configured for it, and where its first move starts from."""
        mix = self.book.mix()
        self.config.for_event(mix)
        known = Pursuit(
            event_id,
            reduction_kw,
            level_kw,
            self.site.filtered_kw(self.config.window_s) if self.settings.tracking else None,
            mix.baseline_gpu_kw,
            sum(j.gpus for j in mix.placed),
            started_s=self.clock.monotonic(),
            target_since_s=self.clock.monotonic(),
        )
        known.on_gain = (
            level_kw is None
            and self.site.feed is not None
            and self.settings.loop_delta_basis == "gain"
        )
        held_kw = self.targets.held_reduction_kw
        # The first plan moves the site from what is held now (another event's caps).
        known.achieved_kw = known.planned_kw = held_kw or 0.0
        known.gain = self.memory.site_gain if known.on_gain else self.memory.last_gain
        known.start_gpu_kw = self.reference.window_gpu_kw() if held_kw == 0.0 else None
        if known.on_gain:
            # From the site at rest, the meter before the event is the level the first
            # move's answer is read against; from caps held, the model says what they shed.
            known.before_kw = known.start_facility_kw if held_kw == 0.0 else None
            known.before_gpu_kw = self.reference.window_gpu_kw() if held_kw == 0.0 else None
            known.shed_kw = known.gain * (held_kw or 0.0)
        known.correction_kw = self.memory.opening_correction_kw(known)
        self.pursuit = known
        if held_kw is None:
            # Caps stepping back: where the first move starts from is not known, so the
            # meter watch starts once it has settled.
            known.watch_from_s = self.clock.monotonic() + self.config.settle_s()
        if self.predictor.watch is not None:
            self.predictor.watch.reset()
        return known

    def release(self) -> None:
        if self.pursuit is not None:
            self.memory.remember(self.pursuit)
        self.pursuit = None

    async def _plan(self, pursuit: Pursuit) -> None:
        requested = max(pursuit.reduction_kw + pursuit.correction_kw, 0.0)
        started_s = self.clock.monotonic()
        await self.targets.hold(requested, pursuit.event_id, self.doc())
        self.config.plan_s = self.clock.monotonic() - started_s
        # The loop's period is at least its re-plan's length: a fan-out slower than a meter
        # period (thousands of nodes) is not followed by another at once, so the loop never
        # keeps the dispatch busy more than half the time and events' plans get through.
        self._ready_s = self.clock.monotonic() + self.config.plan_s
        pursuit.planned_kw = requested
        self._follow_plans(pursuit)

    def _follow_plans(self, pursuit: Pursuit) -> None:
        """What the plan held now sheds by the model, expected at the meter from when it was
        made: the loop's own plans, and the steps the targets plan on their own towards what
        it asked (a ramp limit holding it back: `gateway.services.ramp`)."""
        short_kw = float((self.targets.last_plan or {}).get("shortfall_kw", 0.0))
        achieved_kw = max(pursuit.planned_kw - short_kw, 0.0)
        if achieved_kw != pursuit.achieved_kw:
            # Each planned kW is expected at the meter as the site has answered the plans so far.
            move_kw = pursuit.gain * (pursuit.achieved_kw - achieved_kw)
            pursuit.moves.append((self.targets.planned_at_s, move_kw))
            gpu_kw = (pursuit.achieved_kw - achieved_kw) / self.site.overhead.current().k
            planned = (self.targets.planned_at_s, gpu_kw)
            pursuit.planned_gpu = [*pursuit.planned_gpu[-PLANNED_KEPT + 1 :], planned]
            if pursuit.on_gain:
                shed_kw = achieved_kw - pursuit.achieved_kw
                pursuit.answering.append((self.targets.planned_at_s, shed_kw))
            pursuit.achieved_kw = achieved_kw

    async def step(self) -> None:
        """One sample of the loop (after every sample of the site)."""
        pursuit = self.pursuit
        watch = self.predictor.watch
        if pursuit is None and watch is not None:
            watch.between_events(self.config.settle_s())
        if pursuit is None or not self.settings.tracking:
            return
        mix = self.book.mix()
        self._follow_plans(pursuit)
        self.config.measure_delay()
        self.config.check(mix)
        self.reference.follow_mix(pursuit, mix)
        self.predictor.watch_meter(pursuit)
        feed = self.site.feed
        if feed is not None and feed.state()["fault"] is not None:
            pursuit.faulted = True
        self.reference.read(pursuit, mix)
        if pursuit.on_gain:
            if self.gain_hold.next_move(pursuit, ready=self.clock.monotonic() >= self._ready_s):
                await self._plan(pursuit)
            return
        if self.predictor.undo_suspected(pursuit):
            await self._plan(pursuit)
            return
        if pursuit.measured_kw is None or pursuit.target_kw is None:
            return  # a faulted meter: the correction is held, the plan is the model's
        if self.config.verdict == "held":
            return
        if self.clock.monotonic() < self._ready_s:
            return  # the last re-plan took longer than a period: this sample is skipped
        await self._correct(pursuit, pursuit.measured_kw, pursuit.target_kw)

    async def _correct(self, pursuit: Pursuit, measured: float, target: float) -> None:
        """The loop's correction from a settled sample: what it teaches, a step no plan made
        fed forward, else the integral of the error the predictor leaves."""
        plan = self.targets.last_plan or {}
        short = float(plan.get("shortfall_kw", 0.0)) > 1e-6
        if self.clock.monotonic() - pursuit.target_since_s >= self.config.settle_s():
            safe = self.config.verdict == "safe"
            self.memory.learn(pursuit, measured - target, pursuit.reference_kw, short, safe=safe)
        if pursuit.ceiling and pursuit.level_kw:
            pursuit.margin_kw = self.memory.limit_margin_kw(pursuit.level_kw)
            target = pursuit.level_kw - pursuit.margin_kw
            pursuit.target_kw = target
        if self.feed_forward.moved(pursuit, plan):
            await self._plan(pursuit)
            return
        error_kw = measured + self.predictor.unseen_kw(pursuit) - target
        if abs(error_kw) < NOISE_SIGMAS * self.predictor.window_noise_kw():
            return  # within what the window's own noise makes: no phantom correction
        if (error_kw > 0 and short) or (error_kw < 0 and pursuit.planned_kw <= 0.0):
            return  # anti-windup: at the fleet's limit the correction does not grow
        config = self.config
        correction = pursuit.correction_kw + config.integral_gain_per_s * config.period_s * error_kw
        correction = self.memory.bounded(pursuit, correction, plan)
        pursuit.correction_kw = correction
        now_s = self.clock.monotonic()
        pursuit.corrections.append((now_s, correction, pursuit.gain))
        horizon_s = now_s - 4 * (config.delay_s + config.window_s + config.span_s + config.period_s)
        while len(pursuit.corrections) > 1 and pursuit.corrections[1][0] < horizon_s:
            pursuit.corrections.pop(0)
        moved = abs(max(pursuit.reduction_kw + correction, 0.0) - pursuit.planned_kw)
        if moved > max(DEADBAND * pursuit.reduction_kw, 0.05):
            await self._plan(pursuit)

    def loop_model(self, mix: JobMix) -> ClosedLoopResponse | None:
        """The loop as it runs during an event, or as it would start on `mix` now (its
        configuration chosen and checked for it): what every plan's sync verdict judges
        (`planner.loops_report`). None where the loop is off (`FLEXGATE_TRACKING`)."""
        if not self.settings.tracking:
            return None
        if self.pursuit is None:
            self.config.between_events(mix)
        return self.config.closed_loop()

    def doc(self) -> dict[str, Any]:
        """The loop's state for `GET /v1/site` and the event's plan (`tracking`)."""
        pursuit = self.pursuit
        measured = pursuit.measured_kw if pursuit else None
        target = pursuit.target_kw if pursuit else None
        return {
            "active": pursuit is not None and self.settings.tracking,
            "event_id": pursuit.event_id if pursuit else None,
            "source": self.site.source,
            "target_facility_kw": target,
            "measured_facility_kw": measured,
            "error_kw": None if measured is None or target is None else measured - target,
            "requested_reduction_kw": pursuit.reduction_kw if pursuit else None,
            "ceiling": pursuit.ceiling if pursuit else False,
            "limit_margin_kw": pursuit.margin_kw if pursuit else 0.0,
            "correction_kw": pursuit.correction_kw if pursuit else 0.0,
            "correction_bound_kw": self.memory.pursuit_bound_kw(pursuit) if pursuit else None,
            **self.config.doc(),
            #: "gain" (a delta on the site's gain), "meter" (a delta or level at the meter)
            "basis": None if pursuit is None else "gain" if pursuit.on_gain else "meter",
            "site_gain": pursuit.gain if pursuit else self.memory.site_gain,
            #: facility kW per GPU kW as the meter answered the loop's moves (None: not yet),
            #: and the answers taken on the agents' GPU power instead (a static step in them)
            "overhead_gain": self.overhead_gains.gain,
            "answers_replaced": self.overhead_gains.replaced,
        }
