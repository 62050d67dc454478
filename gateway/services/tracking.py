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
  answer showed (`_hold_on_gain`).
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

import itertools
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flexmodel.jobs import Job, JobMix
from flexmodel.loopresponse import ClosedLoopResponse
from flexmodel.looprobust import SiteLoop, parameter_error, robust_gain
from flexmodel.loops import ControlLoop, combine_delays, job_unit_coupling
from flexmodel.meterpath import step_share
from flexmodel.sync import worst_verdict
from gateway.clock import Clock
from gateway.meter.answercheck import OverheadGains
from gateway.meter.watch import MeterWatch
from gateway.services.fleet import Fleet, job_readings
from gateway.services.jobbook import JobBook
from gateway.services.site import Sample, SitePower
from gateway.services.staticstep import (
    AFTER_READINGS,
    FED_ANSWER_SHARE,
    STEP_FLOOR_SHARE,
    gpu_step_kw,
    shown_gpu_kw,
    static_step_kw,
)
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings

log = logging.getLogger("flexgate.gateway")
#: The loop averages the site's power over at least this many of the longest periods.
WINDOW_PERIODS = 4.0
#: A request that moved less than this share of the reduction (or 0.05 kW) since the last
#: plan is not re-planned.
DEADBAND = 0.002
#: Safe configurations tried, in order, when one is refused: the window doubled, the gain halved.
ADJUSTMENTS = 4
#: A ceiling's margin: the loop's settled errors kept, how many it needs before it trusts
#: them, and the margin's floor and its default before then (shares of the limit).
LIMIT_ERRORS = 2000
#: The correction's bound from past events' model error: how many it needs, how many it keeps,
#: the factor on the largest, and the least share of the reduction it allows.
BOUND_EVENTS = 3
BOUND_EVENTS_KEPT = 20
BOUND_FACTOR = 2.0
BOUND_FLOOR = 0.25
#: The model's gain is read once the plan sheds this share of the site, each settled sample
#: moving it by this share towards what it read (within 0.5 to 1.5: beyond, the meter watch,
#: not the predictor, has something to say).
GAIN_MIN_SHARE = 0.02
GAIN_WEIGHT = 0.03
#: Settled corrections at reductions this far apart (a share of the larger) tell an offset
#: from a gain.
SPREAD = 0.2
#: An error within this many standard deviations of the window's noise is not corrected.
NOISE_SIGMAS = 2.0
#: The agents' GPU power is taken to scatter at least this much, reading to reading [kW].
GPU_NOISE_KW = 0.01
#: The latest readings of the GPU power a step is looked for in (more than any window needs).
GPU_STEP_READINGS = 60
_MAD_TO_SD = 1.4826
LIMIT_MIN_SAMPLES = 30
LIMIT_MARGIN_FLOOR = 0.005
LIMIT_MARGIN_DEFAULT = 0.02
LIMIT_MARGIN_MOST = 0.10
#: A delta held on the site's gain: the events' first answers kept (the site's gain before an
#: event reads its own is their median); the share of a move a reading must show to be on
#: its plateau; the factor an answer may stray from the gain believed and be read (a site's
#: gain per planned kW is not one number: the deeper cut lands on other jobs); the flatness
#: asked of the meter before and after a move (a share of its answer, beyond 3 sigma of the
#: meter's scatter at rest); how close to the reduction the shed must come [share], or within
#: how many standard deviations of an answer's own noise (the difference of two means of a
#: window's readings).
ANSWER_GAINS_KEPT = 9
PLATEAU_SHARE = 0.98
ANSWER_STRAY = 3.0
ANSWER_FLAT = 0.02
ANSWER_CLOSE = 0.02
ANSWER_SIGMAS = 2.0
#: An answer shows the site's gain when it is this many times its noise (`ANSWER_SIGMAS`
#: standard deviations): the gain read is then within 10% of the answer's.
ANSWER_GAIN_NOISE = 10.0


@dataclass
class Pursuit:
    event_id: str
    reduction_kw: float  #: the event's target now, by the model [kW]
    level_kw: float | None  #: the event's level at the meter, for a setpoint [kW]
    start_facility_kw: float | None  #: the meter before the event, averaged over the window
    start_baseline_gpu_kw: float  #: the model's baseline when the event began [kW]
    start_placed_gpus: int  #: the placed jobs' GPUs then
    correction_kw: float = 0.0
    planned_kw: float = 0.0  #: the reduction last planned [kW]
    achieved_kw: float = 0.0  #: what that plan achieves by the model [kW]
    baseline_kw: float | None = None  #: the model's facility baseline at the last sample [kW]
    #: (when, kW): moves of the meter's reading expected from then on, by the model
    moves: list[tuple[float, float]] = field(default_factory=list)
    measured_kw: float | None = None
    target_kw: float | None = None
    reference_kw: float | None = None  #: the site without the event, at the meter [kW]
    #: (when, correction kW, gain) as taken: undone to before readings found wrong later
    corrections: list[tuple[float, float, float]] = field(default_factory=list)
    settled_kw: float = 0.0  #: the moves old enough to be wholly seen, summed [kW]
    undone_for_s: float | None = None  #: the suspicion (its start) last undone
    started_s: float = 0.0  #: when the loop took the event on (monotonic) [s]
    ceiling: bool = False  #: the level is a maximum (an import capacity limit)
    margin_kw: float = 0.0  #: planned below a ceiling by this [kW]
    target_since_s: float = 0.0  #: when the target last changed (monotonic) [s]
    watch_from_s: float = 0.0  #: the meter watch judges this event's moves from then on
    #: what the site sheds at the meter per kW the model plans, once settled: the model's
    #: gain error, which the predictor expects of the next moves
    gain: float = 1.0
    #: the correction once settled at each reduction asked (not while the plan was short)
    settled_at: dict[float, float] = field(default_factory=dict)
    #: the correction once settled, as a share of the reduction: the model's error here
    settled_share: float | None = None
    #: a delta held on the site's gain (`FLEXGATE_LOOP_DELTA_BASIS`), not on the meter
    on_gain: bool = False
    #: on the site's gain: the planned moves (when, model kW shed) whose answer at the meter
    #: is awaited (`Tracker._read_answer`), the meter's level before them [kW] (None: not
    #: flat, the answer is the model's), and the shed so far at the meter, each move's answer
    #: read on its own (a static load step between them is in none) [kW]
    answering: list[tuple[float, float]] = field(default_factory=list)
    before_kw: float | None = None
    before_gpu_kw: float | None = None  #: the agents' GPU power in the same readings [kW]
    shed_kw: float = 0.0
    answers: int = 0  #: the moves' answers read (the first is the site's gain)
    #: the meter faulted or was suspected during the event: what it settled on is not the
    #: model's error, and the events after it do not learn from it
    faulted: bool = False
    #: a static load step was last fed forward then: the readings before it are not read again
    fed_s: float = -math.inf
    #: the agents' GPU power over the window before the event, from the site at rest [kW]
    start_gpu_kw: float | None = None
    #: a feed-forward's move as the agents' GPU power should show it: (the GPU power before,
    #: after [kW], what the model planned before it [kW]); None once its answer is read
    fed_gpu: tuple[float, float, float] | None = None
    #: a step of the GPU power no plan made was last fed forward then [s]; what such steps
    #: moved the meter by, until the scheduler reports the job, and the correction by, until
    #: the reduction takes it over, summed [kW]
    gpu_fed_s: float = -math.inf
    gpu_fed_meter_kw: float = 0.0
    #: the job mix last changed then: which GPUs placed jobs hold changed with it [s]
    mix_changed_s: float = -math.inf
    gpu_fed_kw: float = 0.0


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
        self.watch = None
        if site.feed is not None:
            self.watch = MeterWatch(
                site.feed, noise_kw=settings.meter_noise_kw, check_kw=settings.meter_check_kw
            )
        self.pursuit: Pursuit | None = None
        self.window_s = settings.loop_window_s or 0.0
        self.gain = settings.loop_gain
        self.delay_s = 0.0  #: the loop's delay: dead time and the cooling's lag [s]
        self.lag_s = 0.0  #: of which the meter path's first-order lag [s]
        self.span_s = 0.0  #: each reading's own averaging [s]
        self.dead_s = 0.0  #: from a planned move to the first reading that shows it [s]
        self.dead_error_s = 0.0  #: the meter path's dead time's standard error, as planned [s]
        self.gain_rule: str | None = None  #: why the gain is below the configured one
        #: the error at the meter (measured - target) once each event had settled [kW]
        self.settled_errors_kw: deque[float] = deque(maxlen=LIMIT_ERRORS)
        #: each past event's settled model error at the meter: what it planned over what it
        #: asked at the meter, less 1
        self.model_errors: deque[float] = deque(maxlen=BOUND_EVENTS_KEPT)
        self.last_gain = 1.0  #: the last settled event's gain at the meter, where the next starts
        #: the meter's first answer of each delta on the site's gain, per planned kW
        self.answer_gains: deque[float] = deque(maxlen=ANSWER_GAINS_KEPT)
        #: the meter's answers checked on the agents' GPU power (a static step under one)
        self.overhead_gains = OverheadGains()
        self.delays_s: tuple[float, ...] = (0.0,)  #: its distribution (delay_s is the mean)
        self.verdict: str | None = None
        self.reason: str | None = None  #: why the loop was adjusted, held or refused
        #: the strongest attraction the loop puts on any job's harmonic, as checked [rad/s]
        self.coupling_per_s = 0.0
        self._checked: tuple[float, float] | None = None  #: (longest period, delay) checked
        self._plan_s = 0.0  #: how long the last re-plan took to be acked [s]
        self._ready_s = -math.inf  #: no loop step before (the last re-plan's end plus its length)
        targets.site_loop = self.loop_model  # every plan's sync verdict judges this loop
        #: the job mix and delay the loop's configuration was last chosen for outside events
        self._chosen_for: tuple[JobMix, float] | None = None

    @property
    def period_s(self) -> float:
        return self.settings.meter_period_s

    @property
    def integral_gain_per_s(self) -> float:
        return self.gain / self.period_s

    @property
    def site_gain(self) -> float:
        """What the site sheds at the meter per kW the model plans, before an event reads its
        own: the median of the deltas' first answers (`ANSWER_GAINS_KEPT`), else the last
        settled event's."""
        return float(np.median(self.answer_gains)) if self.answer_gains else self.last_gain

    async def pursue(
        self, event_id: str, reduction_kw: float, level_kw: float | None, *, ceiling: bool = False
    ) -> None:
        """Deliver this event's target at the meter from now on (the open-loop plan first).
        A `ceiling` level is a maximum: held below it by the loop's margin (`limit_margin_kw`)."""
        mix = self.book.mix()
        known = self.pursuit if self.pursuit and self.pursuit.event_id == event_id else None
        if known is None:
            self._measure_delay()
            self._choose(mix)
            self._chosen_for = None  # chosen for the event: outside it, choose again
            known = Pursuit(
                event_id,
                reduction_kw,
                level_kw,
                self.site.filtered_kw(self.window_s) if self.settings.tracking else None,
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
            known.gain = self.site_gain if known.on_gain else self.last_gain
            known.start_gpu_kw = self._window_gpu_kw() if held_kw == 0.0 else None
            if known.on_gain:
                # From the site at rest, the meter before the event is the level the first
                # move's answer is read against; from caps held, the model says what they shed.
                known.before_kw = known.start_facility_kw if held_kw == 0.0 else None
                known.before_gpu_kw = self._window_gpu_kw() if held_kw == 0.0 else None
                known.shed_kw = known.gain * (held_kw or 0.0)
            known.correction_kw = self._opening_correction_kw(known)
            self.pursuit = known
            if held_kw is None:
                # Caps stepping back: where the first move starts from is not known, so the
                # meter watch starts once it has settled.
                known.watch_from_s = self.clock.monotonic() + self._settle_s()
            if self.watch is not None:
                self.watch.reset()
        moved = (
            reduction_kw != known.reduction_kw if level_kw is None else level_kw != known.level_kw
        )
        if moved or ceiling != known.ceiling:
            known.target_since_s = self.clock.monotonic()
            if known.on_gain:
                known.correction_kw = reduction_kw / known.gain - reduction_kw
                self._before_move(known)
            elif level_kw is None and known.level_kw is None:
                known.correction_kw = carried_correction_kw(known, reduction_kw)
        elif level_kw is not None and reduction_kw != known.reduction_kw:
            self._taken_over(known, reduction_kw - known.reduction_kw)
        known.reduction_kw, known.level_kw, known.ceiling = reduction_kw, level_kw, ceiling
        margin_kw = self.limit_margin_kw(level_kw) if ceiling and level_kw else 0.0
        if known.target_since_s == self.clock.monotonic():
            # A new target: the open-loop plan takes the margin at once; after that the loop
            # follows it (it moves the target, which the loop's error sees).
            known.correction_kw += margin_kw - known.margin_kw
        known.margin_kw = margin_kw
        await self._plan(known)

    def limit_margin_kw(self, limit_kw: float) -> float:
        """How far below a ceiling the loop plans [kW]: the 95th percentile of its settled error
        at the meter over its recent events (`LIMIT_ERRORS` samples), above the target only
        (a limit is broken by the meter reading high; reading low costs the jobs, not the
        limit), within `LIMIT_MARGIN_FLOOR` and `LIMIT_MARGIN_MOST` of the limit;
        `LIMIT_MARGIN_DEFAULT` of it before it has `LIMIT_MIN_SAMPLES` of its own. At most 10%:
        held at 5%, the campaign's limits on sites whose cooling steps by up to 8% of their
        power were above in the minutes the loop took to answer a step (2.1% of them)."""
        if len(self.settled_errors_kw) < LIMIT_MIN_SAMPLES:
            return LIMIT_MARGIN_DEFAULT * limit_kw
        p95_kw = float(np.percentile(np.array(self.settled_errors_kw), 95))
        return min(max(p95_kw, LIMIT_MARGIN_FLOOR * limit_kw), LIMIT_MARGIN_MOST * limit_kw)

    def release(self) -> None:
        pursuit = self.pursuit
        if pursuit is not None and pursuit.settled_share is not None and not pursuit.faulted:
            self.model_errors.append(pursuit.settled_share)
            self.last_gain = pursuit.gain
            if pursuit.on_gain and pursuit.achieved_kw > 0:  # its shed over its plan, not a slope
                self.last_gain = pursuit.shed_kw / pursuit.achieved_kw
        self.pursuit = None

    def _opening_correction_kw(self, pursuit: Pursuit) -> float:
        """The correction the open-loop plan starts with [kW]: what the site's past events
        needed at the meter (the median of their settled model errors, as a share of what was
        asked, once there are `BOUND_EVENTS`; before, the site's gain its deltas' first answers
        showed, else none), on what this event asks at the meter: for
        a level, the meter before the event less the level, not the model's baseline less it
        (a model whose baseline is off would start the site that far off the level)."""
        if pursuit.on_gain:
            return pursuit.reduction_kw / pursuit.gain - pursuit.reduction_kw
        asked_kw = pursuit.reduction_kw
        if pursuit.level_kw is not None and pursuit.start_facility_kw is not None:
            asked_kw = max(pursuit.start_facility_kw - pursuit.level_kw, 0.0)
        if len(self.model_errors) >= BOUND_EVENTS:
            share = float(np.median(self.model_errors))
        elif self.answer_gains:
            # Before three events have settled, the deltas' first answers have read the
            # site's gain at the meter: a planned kW sheds `site_gain` there.
            share = 1.0 / self.site_gain - 1.0
        else:
            share = 0.0
        return asked_kw * (1.0 + share) - pursuit.reduction_kw

    def correction_bound_kw(self, reduction_kw: float) -> float:
        """The most the correction may take, either way [kW]: `FLEXGATE_LOOP_MAX_CORRECTION` of
        the reduction, and once `BOUND_EVENTS` events have settled, no more than
        `BOUND_FACTOR` times the largest model error they needed at the meter (their settled
        correction, as a share of their reduction), nor less than `BOUND_FLOOR` of it."""
        share = self.settings.loop_max_correction
        if len(self.model_errors) >= BOUND_EVENTS:
            measured = BOUND_FACTOR * max(abs(e) for e in self.model_errors)
            share = min(share, max(measured, BOUND_FLOOR))
        return share * max(reduction_kw, 1.0)

    async def _plan(self, pursuit: Pursuit) -> None:
        requested = max(pursuit.reduction_kw + pursuit.correction_kw, 0.0)
        started_s = self.clock.monotonic()
        await self.targets.hold(requested, pursuit.event_id, self.doc())
        self._plan_s = self.clock.monotonic() - started_s
        # The loop's period is at least its re-plan's length: a fan-out slower than a meter
        # period (thousands of nodes) is not followed by another at once, so the loop never
        # keeps the dispatch busy more than half the time and events' plans get through.
        self._ready_s = self.clock.monotonic() + self._plan_s
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
            if pursuit.on_gain:
                shed_kw = achieved_kw - pursuit.achieved_kw
                pursuit.answering.append((self.targets.planned_at_s, shed_kw))
            pursuit.achieved_kw = achieved_kw

    def _reference_kw(self, pursuit: Pursuit, mix: JobMix) -> float | None:
        """What the site would draw at the meter without the event: the meter before it,
        moved by the model's baseline as the job mix changed, and by the GPU power's steps
        fed forward that the job mix does not show yet (or ever: a job's drift)."""
        if pursuit.start_facility_kw is None:
            return None
        moved_kw = self.site.facility_kw(self._uncapped_gpu_kw(pursuit, mix)) - (
            self.site.facility_kw(pursuit.start_baseline_gpu_kw)
        )
        return pursuit.start_facility_kw + moved_kw + pursuit.gpu_fed_meter_kw

    def _uncapped_gpu_kw(self, pursuit: Pursuit, mix: JobMix) -> float:
        """The GPUs' power without the event by the model [kW]: the placed jobs' baseline, and
        the idle draw of the GPUs the jobs ended since the event began have freed
        (`FLEXGATE_GPU_IDLE_W`; negative for GPUs jobs started since have taken)."""
        freed = pursuit.start_placed_gpus - sum(j.gpus for j in mix.placed)
        return mix.baseline_gpu_kw + freed * self.settings.gpu_idle_w / 1000.0

    async def step(self) -> None:
        """One sample of the loop (after every sample of the site)."""
        pursuit = self.pursuit
        if pursuit is None and self.watch is not None:
            self.watch.between_events(self._settle_s())
        if pursuit is None or not self.settings.tracking:
            return
        mix = self.book.mix()
        self._follow_plans(pursuit)
        self._measure_delay()
        self._check(mix)
        if pursuit.start_facility_kw is None:
            # No whole window of the meter before the event: the model's baseline stands in.
            pursuit.start_facility_kw = self.site.facility_kw(pursuit.start_baseline_gpu_kw)
        baseline_kw = self.site.facility_kw(self._uncapped_gpu_kw(pursuit, mix))
        if pursuit.baseline_kw is not None and baseline_kw != pursuit.baseline_kw:
            move_kw = self._reported(pursuit, baseline_kw - pursuit.baseline_kw)
            pursuit.moves.append((self.clock.monotonic(), move_kw))
            pursuit.mix_changed_s = self.clock.monotonic()
            if pursuit.on_gain:  # the meter's move is not the plan's alone: the model's
                pursuit.shed_kw = pursuit.gain * pursuit.achieved_kw
                pursuit.answering, pursuit.before_kw = [], None
        pursuit.baseline_kw = baseline_kw
        self._watch_meter(pursuit)
        feed = self.site.feed
        if feed is not None and feed.state()["fault"] is not None:
            pursuit.faulted = True
        measured = self.site.filtered_kw(self.window_s)
        reference = self._reference_kw(pursuit, mix)
        target = None if pursuit.level_kw is None else pursuit.level_kw - pursuit.margin_kw
        if target is None and reference is not None:
            target = reference - pursuit.reduction_kw
        pursuit.measured_kw, pursuit.target_kw = measured, target
        pursuit.reference_kw = reference
        if pursuit.on_gain:
            await self._hold_on_gain(pursuit)
            return
        if await self._undo_suspected(pursuit):
            return
        if measured is None or target is None or self.verdict == "held":
            return  # a faulted meter: the correction is held, the plan is the model's
        if self.clock.monotonic() < self._ready_s:
            return  # the last re-plan took longer than a period: this sample is skipped
        plan = self.targets.last_plan or {}
        short = float(plan.get("shortfall_kw", 0.0)) > 1e-6
        if self.clock.monotonic() - pursuit.target_since_s >= self._settle_s():
            self._learn(pursuit, measured - target, reference, short)
        if pursuit.ceiling and pursuit.level_kw:
            pursuit.margin_kw = self.limit_margin_kw(pursuit.level_kw)
            target = pursuit.level_kw - pursuit.margin_kw
            pursuit.target_kw = target
        if await self._feed_forward(pursuit, plan) or await self._gpu_feed_forward(pursuit, plan):
            return
        error_kw = measured + self._unseen_kw(pursuit) - target
        if abs(error_kw) < NOISE_SIGMAS * self._window_noise_kw():
            return  # within what the window's own noise makes: no phantom correction
        if (error_kw > 0 and short) or (error_kw < 0 and pursuit.planned_kw <= 0.0):
            return  # anti-windup: at the fleet's limit the correction does not grow
        correction = pursuit.correction_kw + self.integral_gain_per_s * self.period_s * error_kw
        correction = self._bounded(pursuit, correction, plan)
        pursuit.correction_kw = correction
        now_s = self.clock.monotonic()
        pursuit.corrections.append((now_s, correction, pursuit.gain))
        horizon_s = now_s - 4 * (self.delay_s + self.window_s + self.span_s + self.period_s)
        while len(pursuit.corrections) > 1 and pursuit.corrections[1][0] < horizon_s:
            pursuit.corrections.pop(0)
        moved = abs(max(pursuit.reduction_kw + correction, 0.0) - pursuit.planned_kw)
        if moved > max(DEADBAND * pursuit.reduction_kw, 0.05):
            await self._plan(pursuit)

    def _bounded(self, pursuit: Pursuit, correction: float, plan: dict[str, Any]) -> float:
        """The correction within its bound and what the site can shed at most [kW]."""
        asked_kw = _asked_kw(pursuit)
        bound_kw = self.correction_bound_kw(asked_kw)
        # Bounded around what the meter asks, not around the model's reduction: for a level
        # the model puts the site under, the correction carries all of it (bounded around 0,
        # a site whose past events needed 16% held 2.8 of 9 kW and never reached its level).
        centre_kw = asked_kw - pursuit.reduction_kw
        correction = min(max(correction, centre_kw - bound_kw), centre_kw + bound_kw)
        most_kw = float(plan.get("max_facility_kw", math.inf))
        return min(correction, most_kw - pursuit.reduction_kw)

    async def _feed_forward(self, pursuit: Pursuit, plan: dict[str, Any]) -> bool:
        """A step of the static load under a level, moved at once (`staticstep`): the
        correction becomes what it was before the step showed plus the step, and the integral
        keeps only the residual. True when it re-planned."""
        if await self._fed_answer(pursuit, plan):
            return True
        readings = [s for s in self.site.history if s.facility_kw is not None]
        before = self._window_readings()
        readings = [s for s in readings[-before - AFTER_READINGS :] if s.at_s > pursuit.fed_s]
        if pursuit.level_kw is None or len(readings) < before + AFTER_READINGS:
            return False
        if not self._gpu_span_s():
            return False  # the agents send no power readings
        path = self.site.meter_path()
        since_s = readings[0].reading_at_s - path.dead_s - 5 * path.tau_s - path.averaging_s
        gpus = [s for s in self.site.history if s.at_s >= since_s - self.period_s]
        reading_s = np.array([s.reading_at_s for s in readings])
        gpu_s, gpu_kw = np.array([s.at_s for s in gpus]), np.array([s.all_gpu_kw for s in gpus])
        shown = shown_gpu_kw(gpu_s, gpu_kw, reading_s, path)
        meter = np.array([s.facility_kw for s in readings], dtype=float)
        gain = self._overhead_gain(pursuit, float(np.mean(meter[:before])), shown[:before])
        static = meter - gain * shown
        floors = (self.settings.meter_noise_kw, STEP_FLOOR_SHARE * _asked_kw(pursuit))
        step_kw = static_step_kw(static, shown, before, gain, floors)
        if step_kw == 0.0:
            return False
        showed_s = readings[before].at_s
        taken = [c for at_s, c, _ in pursuit.corrections if at_s < showed_s]
        per_kw = self._meter_per_planned(pursuit, gain, float(np.mean(shown[:before])))
        correction = (taken[-1] if taken else pursuit.correction_kw) + step_kw / per_kw
        pursuit.correction_kw = self._bounded(pursuit, correction, plan)
        pursuit.fed_gpu = (gpu_kw[-1], gpu_kw[-1] - step_kw / gain, pursuit.achieved_kw)
        pursuit.fed_s = self.clock.monotonic()
        pursuit.corrections.append((pursuit.fed_s, pursuit.correction_kw, pursuit.gain))
        log.info("site loop: the static load stepped %+.2f kW: fed forward", step_kw)
        await self._plan(pursuit)
        return True

    async def _gpu_feed_forward(self, pursuit: Pursuit, plan: dict[str, Any]) -> bool:
        """A step of the agents' GPU power under a level that no plan made (a job started,
        ended or drifted: the scheduler reports a job seconds to a minute late, and the meter
        shows it only after its dead time), moved at once: the correction by the step at the
        meter (the overhead gain times it) over the site's gain per planned kW, and the step
        expected at the meter. True when it re-planned."""
        if pursuit.level_kw is None or not self._gpu_span_s():
            return False
        gain = self.overhead_gains.gain or self.site.overhead.current().k
        floors = (GPU_NOISE_KW, STEP_FLOOR_SHARE * _asked_kw(pursuit) / gain)
        ramp = math.ceil(self._gpu_span_s() / self.period_s)
        before = self._window_readings()
        # Every GPU's power, once the last plan is actuated (its own moves are not a step
        # no plan made); and the GPUs no placed job holds, which no plan moves, at once: a
        # job starting on them before the scheduler reports it is seen while the loop is
        # still re-planning, each period, towards a level.
        planned_s = self.targets.planned_at_s + self._actuated_s() + self.period_s
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
        pursuit.correction_kw = self._bounded(pursuit, correction, plan)
        pursuit.gpu_fed_meter_kw += meter_kw
        pursuit.gpu_fed_kw += pursuit.correction_kw - taken_kw
        # The step is on its way to the meter: expected there from when the agents showed it.
        pursuit.moves.append((samples[-AFTER_READINGS].at_s - self._gpu_span_s(), meter_kw))
        pursuit.gpu_fed_s = self.clock.monotonic()
        pursuit.corrections.append((pursuit.gpu_fed_s, pursuit.correction_kw, pursuit.gain))
        log.info("site loop: the GPU power stepped %+.2f kW with no plan: fed forward", step_kw)
        await self._plan(pursuit)
        return True

    def _gpu_since(self, since_s: float) -> list[Sample]:
        """The site's latest samples after `since_s`, in order (at most `GPU_STEP_READINGS`)."""
        since = itertools.takewhile(lambda s: s.at_s > since_s, reversed(self.site.history))
        return list(itertools.islice(since, GPU_STEP_READINGS))[::-1]

    @staticmethod
    def _reported(pursuit: Pursuit, move_kw: float) -> float:
        """The model's baseline moved by `move_kw` at the meter (the scheduler reported a job
        that started or ended): where a GPU power step the same way was fed forward first, the
        meter already expects it, and the site without the event moves by the model's move
        from now on. Returns the move still to expect [kW]."""
        if pursuit.gpu_fed_meter_kw * move_kw <= 0.0:
            return move_kw
        pursuit.gpu_fed_meter_kw = 0.0
        return 0.0

    @staticmethod
    def _taken_over(pursuit: Pursuit, moved_kw: float) -> None:
        """A level's reduction moved by `moved_kw` with the job mix: as far as it moved the
        way a GPU power step fed forward did, it carries that step now, not the correction."""
        fed_kw = pursuit.gpu_fed_kw
        if fed_kw * moved_kw > 0.0:
            pursuit.correction_kw -= math.copysign(min(abs(fed_kw), abs(moved_kw)), fed_kw)
        pursuit.gpu_fed_kw = 0.0

    async def _fed_answer(self, pursuit: Pursuit, plan: dict[str, Any]) -> bool:
        """A feed-forward's answer on the agents' GPU power, once actuated (no meter dead
        time to wait for): what it fell short of, or beyond, the GPU power it aimed at is
        moved by the plan's own answer per planned kW, once. True when it re-planned."""
        if pursuit.fed_gpu is None:
            return False
        if self.clock.monotonic() - pursuit.fed_s < self._actuated_s() + self.period_s:
            return False
        (from_kw, aim_kw, planned_kw), pursuit.fed_gpu = pursuit.fed_gpu, None
        moved_kw, wanted_kw = from_kw - self.site.history[-1].all_gpu_kw, from_kw - aim_kw
        planned_kw = pursuit.achieved_kw - planned_kw
        if moved_kw * wanted_kw <= 0.0 or abs(moved_kw) < FED_ANSWER_SHARE * abs(wanted_kw):
            return False  # not the plan's answer (a job ended, the plan was short)
        correction = pursuit.correction_kw + (wanted_kw - moved_kw) * planned_kw / moved_kw
        pursuit.correction_kw = self._bounded(pursuit, correction, plan)
        pursuit.corrections.append((self.clock.monotonic(), pursuit.correction_kw, pursuit.gain))
        await self._plan(pursuit)
        return True

    def _actuated_s(self) -> float:
        """From a plan to the agents' GPU power showing it whole [s]: planning, the slowest
        actuation measured, and the agents' averaging."""
        measured = self.fleet.loop_measurements()
        return max(measured.actuation_s, default=0.0) + self._plan_s + self._gpu_span_s()

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

    async def _hold_on_gain(self, pursuit: Pursuit) -> None:
        """A delta on the site's gain: each move of the plan is answered at the meter and read
        on its own once whole (`_read_answer`): the shed so far is the sum of the answers, and
        the next move is what is left over the gain the last answer showed (a secant step
        on the site's true curve), until the shed is within `ANSWER_CLOSE` of the reduction.
        No integral of the meter's level: a cooling step, a meter offset or drifting static
        load between moves is not the event's, and is not corrected for."""
        if pursuit.answering and not self._read_answer(pursuit):
            return  # still answering
        if self.clock.monotonic() < self._ready_s:
            return
        left_kw = pursuit.reduction_kw - pursuit.shed_kw
        # What is left is judged against the noise of the answers it was read from, not of one
        # reading: 3 sigmas of one reading let a 2 kW delta on a 0.05 kW meter rest 7% off.
        if abs(left_kw) <= max(ANSWER_CLOSE * pursuit.reduction_kw, self._answer_noise_kw()):
            return
        most_kw = float((self.targets.last_plan or {}).get("max_facility_kw", math.inf))
        # The first answer, from rest, is the gain over the whole cut: caps above what a job
        # truly draws shed nothing, so past them the next kW shed more than that average.
        # Taken no lower than the model's until a move at depth has shown the slope there.
        slope = pursuit.gain if pursuit.answers > 1 else max(pursuit.gain, 1.0)
        requested = min(max(pursuit.planned_kw + left_kw / slope, 0.0), most_kw)
        if abs(requested - pursuit.planned_kw) <= max(DEADBAND * pursuit.reduction_kw, 0.05):
            return  # the plan cannot move closer (at its floor, or all of the fleet)
        pursuit.correction_kw = requested - pursuit.reduction_kw
        self._before_move(pursuit)
        await self._plan(pursuit)

    def _before_move(self, pursuit: Pursuit) -> None:
        """The meter's level a move's answer is read against: its last window, if flat (a
        move planned while another is answered joins it: their level before stands)."""
        if not pursuit.answering:
            meter, gpu = self._recent_meter()
            pursuit.before_kw = self._flat_level_kw(meter, pursuit)
            pursuit.before_gpu_kw = float(np.mean(gpu)) if gpu.size and self._gpu_span_s() else None

    def _read_answer(self, pursuit: Pursuit) -> bool:
        """The meter's answer to the moves awaited, once it shows them whole for a window:
        its level before them less its plateau after, added to the shed, and the gain per
        planned kW it shows; the model's (the gain believed) where the meter was not flat
        before or after, or answered implausibly. False while it is still answering."""
        moves = pursuit.answering
        planned_kw = sum(kw for _, kw in moves)
        read_s, meter, gpu = self._meter_since(moves[0][0])
        shown = sum(
            kw * step_share(read_s - at_s - self.dead_s, 0.0, *self._path()) for at_s, kw in moves
        ) / (planned_kw or 1.0)
        plateau = meter[shown >= PLATEAU_SHARE] if planned_kw else meter
        # The agents' power shows the moves whole once its own averaging is past them.
        gpu_after = gpu[read_s >= moves[-1][0] + self._gpu_span_s() + self.period_s]
        wanted = self._window_readings()
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
                answer_kw = self.overhead_gains.answer_kw(
                    answer_kw, gpu_kw, self._answer_noise_kw()
                )
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
                answer_kw = max(answer_kw, 0.0)
            elif not 1.0 / ANSWER_STRAY <= gain / pursuit.gain <= ANSWER_STRAY:
                log.info(
                    "site loop: the meter's answer %.2f kW to %.2f kW planned is not "
                    "believed (gain %.2f)",
                    answer_kw,
                    planned_kw,
                    pursuit.gain,
                )
                answer_kw = None
            elif abs(planned_kw) >= GAIN_MIN_SHARE * (pursuit.start_facility_kw or 0.0) and (
                abs(answer_kw) >= ANSWER_GAIN_NOISE * self._answer_noise_kw()
            ):
                if not pursuit.answers:  # its first answer: the site's gain from now on
                    self.answer_gains.append(gain)
                pursuit.answers += 1
                pursuit.gain = gain
        pursuit.shed_kw += pursuit.gain * planned_kw if answer_kw is None else answer_kw
        pursuit.settled_share = pursuit.achieved_kw / max(pursuit.reduction_kw, 1e-9) - 1.0
        return True

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
        samples = samples[-self._window_readings() :]
        return (
            np.array([s.facility_kw for s in samples], dtype=float),
            np.array([s.gpu_kw for s in samples], dtype=float),
        )

    def _window_gpu_kw(self) -> float | None:
        """The agents' GPU power over the loop's window [kW] (None: no samples, or the agents
        send no power readings)."""
        window = self.site.window(self.window_s)
        if not window or not self._gpu_span_s():
            return None
        return float(np.mean([s.gpu_kw for s in window]))

    def _gpu_span_s(self) -> float:
        """How long a stretch of readings the agents' GPU power is the mean of, the longest
        [s]: 0 without readings."""
        spans = [
            len(gpu.power_w) * gpu.sample_interval_s
            for node in (self.fleet.last or {}).values()
            for gpu in node.gpus
        ]
        return max(spans, default=0.0)

    def _answer_noise_kw(self) -> float:
        """`ANSWER_SIGMAS` standard deviations of an answer's noise [kW]: the difference of
        two means of a window's readings."""
        noise_kw = self._rest_noise_kw() * math.sqrt(2.0 / self._window_readings())
        return ANSWER_SIGMAS * noise_kw

    def _window_readings(self) -> int:
        return max(round(self.window_s / self.period_s), 3)

    def _flat_level_kw(self, meter: np.ndarray, pursuit: Pursuit) -> float | None:
        """The meter's level over these readings [kW]; None unless there are a window's worth
        and their halves agree within 3 sigma of the meter's scatter at rest and
        `ANSWER_FLAT` of the reduction (a cooling step inside them does not)."""
        if meter.size < self._window_readings():
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
        changes = np.diff(np.array(readings[-4 * self._window_readings() :], dtype=float))
        spread = 0.0
        if changes.size > 2:
            spread = _MAD_TO_SD * float(np.median(np.abs(changes - np.median(changes))))
        return max(spread / math.sqrt(2.0), self.settings.meter_noise_kw)

    def _watch_meter(self, pursuit: Pursuit) -> None:
        """The meter watch's sample: the predictor's reading now, with the dead time short and
        long by its error, against the meter's (`gateway.meter.watch`)."""
        if self.watch is None or self.clock.monotonic() < pursuit.watch_from_s:
            return
        settle_s = self.delay_s + self.dead_error_s + 2 * self.lag_s + self.span_s
        self.watch.observe(
            self.clock.monotonic(),
            (
                self._predicted_kw(pursuit, -self.dead_error_s),
                self._predicted_kw(pursuit, self.dead_error_s),
            ),
            settle_s=settle_s + self.period_s,
            period_s=self.period_s,
        )

    def _learn(
        self, pursuit: Pursuit, error_kw: float, reference_kw: float | None, short: bool
    ) -> None:
        """What a settled sample says of the model: its error at the meter (a ceiling's
        margin), the correction at this reduction (unless the plan is short), the site's gain
        per planned kW, and the event's model error for the events after it."""
        self.settled_errors_kw.append(error_kw)
        if not short:
            pursuit.settled_at[round(pursuit.reduction_kw, 3)] = pursuit.correction_kw
        # Not from a loop the sync analysis finds attracting (the lab's lock scenario): its
        # readings swing with the jobs it locks, and say little of the model's gain.
        measured_kw = pursuit.measured_kw
        if (
            self.verdict == "safe"
            and reference_kw is not None
            and measured_kw is not None
            and pursuit.achieved_kw > 0.0  # a site drawing nothing plans nothing to divide by
            and pursuit.achieved_kw >= GAIN_MIN_SHARE * reference_kw
        ):
            # Slowly: one reading is not evidence, and a meter found wrong later undoes it.
            shed_kw = reference_kw - measured_kw
            seen = float(np.clip(shed_kw / pursuit.achieved_kw, 0.5, 1.5))
            pursuit.gain += GAIN_WEIGHT * (seen - pursuit.gain)
        asked_kw = max(_asked_kw(pursuit), 1.0)
        pursuit.settled_share = (pursuit.reduction_kw + pursuit.correction_kw) / asked_kw - 1

    async def _undo_suspected(self, pursuit: Pursuit) -> bool:
        """Readings the meter watch no longer believes (stuck, no response, implausible:
        `gateway.meter.watch`) drove the correction since the suspicion's start: it goes back
        to what it was then, once, and the plan with it. True when it re-planned."""
        feed = self.site.feed
        since_s = None if feed is None else feed.suspect_since_s
        if since_s is None or pursuit.undone_for_s == since_s:
            return False
        pursuit.undone_for_s = since_s
        before = [(c, g) for at_s, c, g in pursuit.corrections if at_s <= since_s]
        correction, pursuit.gain = before[-1] if before else (0.0, 1.0)
        if correction == pursuit.correction_kw:
            return False
        log.warning(
            "site loop: the meter is not believed since %.0f s ago: correction %.2f -> %.2f kW",
            self.clock.monotonic() - since_s,
            pursuit.correction_kw,
            correction,
        )
        pursuit.correction_kw = correction
        pursuit.corrections = [c for c in pursuit.corrections if c[0] <= since_s]
        await self._plan(pursuit)
        return True

    def _unseen_kw(self, pursuit: Pursuit) -> float:
        """What the model's moves will still do to the window's average: each reading in the
        window shows a move after the loop's dead time (plan and dispatch, actuation, the
        meter's own dead time), through the meter path's lag and averaging, from when it was
        measured (the meter's reading, or on the estimate the agents' telemetry round). The
        same readings the loop averages: no continuous approximation of a window of few
        samples. Moves every reading shows whole are settled."""
        readings = np.array([s.reading_at_s for s in self.site.window(self.window_s)])
        if not readings.size:
            readings = np.array([self.clock.monotonic()])
        unseen, live = 0.0, []
        for at_s, move_kw in pursuit.moves:
            seen = float(np.mean(step_share(readings - at_s - self.dead_s, 0.0, *self._path())))
            if seen >= 1.0 - 1e-9:
                pursuit.settled_kw += move_kw
                continue
            unseen += move_kw * (1.0 - seen)
            live.append((at_s, move_kw))
        pursuit.moves = live
        return unseen

    def _predicted_kw(self, pursuit: Pursuit, dead_error_s: float) -> float:
        """The meter's last reading by the model, but for a constant [kW]: each of the model's
        moves through the loop's dead time (moved by `dead_error_s`) and the meter's path
        (for the meter watch: `gateway.meter.watch`)."""
        if not pursuit.moves:
            return pursuit.settled_kw
        read_s = self.site.history[-1].reading_at_s if self.site.history else 0.0
        dead_s = max(self.dead_s + dead_error_s, 0.0)
        since = read_s - dead_s - np.array([at_s for at_s, _ in pursuit.moves])
        shares = step_share(since, 0.0, *self._path())
        return pursuit.settled_kw + float(np.array([kw for _, kw in pursuit.moves]) @ shares)

    def _window_noise_kw(self) -> float:
        """One standard deviation of the window's average from the readings' own noise [kW]:
        the scatter of successive readings (robust: the median of their changes, so the loop's
        own steps do not count), or the meter's declared noise if larger."""
        readings = [s.facility_kw for s in self.site.window(self.window_s)]
        values = np.array([kw for kw in readings if kw is not None])
        if values.size < 3:
            return 0.0
        changes = np.diff(values)
        spread_kw = _MAD_TO_SD * float(np.median(np.abs(changes - np.median(changes))))
        noise_kw = max(spread_kw / math.sqrt(2.0), self.settings.meter_noise_kw)
        return noise_kw / math.sqrt(values.size)

    def _settle_s(self) -> float:
        """From a move to the window's showing it whole: the loop's delay, three time
        constants, the averaging and the window [s]."""
        return self.delay_s + 2 * self.lag_s + self.span_s + self.window_s + self.period_s

    def _path(self) -> tuple[float, float]:
        """The meter path after its dead time: (time constant, averaging) [s]."""
        return self.lag_s, self.span_s

    # --- the loop's configuration, checked ----------------------------------------------

    def _measure_delay(self) -> None:
        """The loop's measured delay: the meter's age and its path (dead time and lag), plan
        and dispatch, actuation."""
        meter = self.site.meter_doc(0.0)
        age_s = float(meter["age_s"] or 0.0) if not meter["estimated"] else 0.0
        path = self.site.meter_path()
        measured = self.fleet.loop_measurements()
        fixed_s = age_s + path.dead_s + path.tau_s + self._plan_s
        self.lag_s, self.span_s = path.tau_s, path.averaging_s
        self.delays_s = tuple(fixed_s + d for d in combine_delays([measured.actuation_s]))
        self.delay_s = float(np.mean(self.delays_s))
        # From a move to the reading that first shows it: the age is in the reading's time.
        self.dead_s = max(self.delay_s - age_s - path.tau_s, 0.0)
        self.dead_error_s = parameter_error(path.dead_s, path.dead_stderr_s, self.period_s)

    def _choose(self, mix: JobMix) -> None:
        """The window from the jobs' periods (unless set), and the gain configured."""
        periods, _ = self._waving(mix)
        longest = float(periods.max()) if periods.size else 0.0
        chosen = max(WINDOW_PERIODS * longest, 2.0 * self.period_s)
        self.window_s = self.settings.loop_window_s or chosen
        self.gain, self.gain_rule = self._robust_gain()
        self._checked, self.reason = None, None
        self._check(mix)

    def _robust_gain(self) -> tuple[float, str | None]:
        """The configured gain, or less where the meter path is not known well enough for it
        (`flexmodel.looprobust`: stable with a modulus margin for the path wrong by its
        standard errors and the model's gain by `FLEXGATE_LOOP_GAIN_ERROR`). The lab's lock
        scenario keeps its configured loop."""
        configured = self.settings.loop_gain
        if self.settings.loop_unsafe:
            return configured, None
        path, period_s = self.site.meter_path(), self.period_s
        dead_error_s = self.dead_error_s
        tau_error_s = parameter_error(path.tau_s, path.tau_stderr_s, period_s)
        gain = robust_gain(
            configured,
            SiteLoop(
                period_s,
                self.window_s,
                path.tau_s,
                dead_error_s,
                tau_error_s,
                self.settings.loop_gain_error,
            ),
        )
        if gain >= configured:
            return configured, None
        rule = (
            f"gain {gain:.3g} (of {configured:g}): robust to the meter path's dead time "
            f"{path.dead_s:.1f} +/- {dead_error_s:.1f} s, lag {path.tau_s:.1f} +/- "
            f"{tau_error_s:.1f} s ({path.source}) and a model gain error of "
            f"{self.settings.loop_gain_error:.0%}"
        )
        log.info("site loop: %s", rule)
        return gain, rule

    def _check(self, mix: JobMix) -> None:
        """The sync analysis on the loop as it is; on a refusal, a safe configuration."""
        periods, duties = self._waving(mix)
        key = (float(periods.max()) if periods.size else 0.0, round(self.delay_s, 2))
        if self._checked is not None and _close(key, self._checked):
            return
        self._checked = key
        verdict, why = self._verdict(mix, periods, duties)
        if verdict == "safe":
            self.verdict = verdict  # the reason of an earlier adjustment stays: it still holds
            return
        if self.settings.loop_unsafe:
            kept = f"kept by FLEXGATE_LOOP_UNSAFE (lab): {why}"
            if kept != self.reason:
                log.warning("site loop: %s", kept)
            self.verdict, self.reason = verdict, kept
            return
        refused = f"window {self.window_s:g} s, gain {self.gain:g}: {why}"
        for _ in range(ADJUSTMENTS):
            self.window_s, self.gain = 2.0 * self.window_s, self.gain / 2.0
            verdict, why = self._verdict(mix, periods, duties)
            if verdict == "safe":
                self.verdict = "safe"
                self.reason = (
                    f"refused {refused}; adjusted to window {self.window_s:g} s, gain {self.gain:g}"
                )
                log.warning("site loop: %s", self.reason)
                return
        self.verdict, self.reason = "held", f"refused {refused}; no safe configuration: held"
        log.warning("site loop: %s", self.reason)

    def _verdict(self, mix: JobMix, periods: np.ndarray, duties: np.ndarray) -> tuple[str, str]:
        """The sync analysis on the loop as it runs (`flexmodel.sync.ClosedLoopResponse`):
        sampled every period, the window's readings through the meter path, the Smith
        predictor and the integral gain in closed loop, the correction applied after the
        plan and the agents' measured actuation. (An integrator with the lag counted as delay
        got the phase wrong by up to 180 degrees: docs/sync.md, "The closed loop".)"""
        if not periods.size:
            self.coupling_per_s = 0.0
            return "safe", ""
        loop = ControlLoop("site", self._closed_loop(), couples_jobs=True)
        result = loop.evaluate(
            periods,
            duties,
            gain_per_s=job_unit_coupling(self._swinging(mix), periods, mix.overhead_factor),
        )
        self.coupling_per_s = float(result["coupling_per_s"])  # what scattering is sized to
        verdict = worst_verdict([result["verdict"]])
        return verdict, f"the sync analysis says {verdict}"

    def loop_model(self, mix: JobMix) -> ClosedLoopResponse | None:
        """The loop as it runs during an event, or as it would start on `mix` now (its
        configuration chosen and checked for it): what every plan's sync verdict judges
        (`planner.loops_report`). None where the loop is off (`FLEXGATE_TRACKING`)."""
        if not self.settings.tracking:
            return None
        if self.pursuit is None:
            self._measure_delay()
            chosen_for = (mix, round(self.delay_s, 2))
            if self._chosen_for is None or not (
                chosen_for[0] is self._chosen_for[0] and chosen_for[1] == self._chosen_for[1]
            ):
                self._choose(mix)  # once per job mix and delay: it logs what it refuses
                self._chosen_for = chosen_for
        return self._closed_loop()

    def _closed_loop(self) -> ClosedLoopResponse:
        """The loop's configuration now, as `flexmodel.sync` models it."""
        path = self.site.meter_path()
        meter = self.site.meter_doc(0.0)
        age_s = float(meter["age_s"] or 0.0) if not meter["estimated"] else 0.0
        # The delays measured are the reading's age, the path, the plan and the actuation;
        # the jobs get the correction after the last two.
        shown_s = age_s + path.dead_s + path.tau_s
        return ClosedLoopResponse(
            period_s=self.period_s,
            gain=self.gain,
            window_s=self.window_s,
            dead_s=age_s + path.dead_s,
            lag_s=path.tau_s,
            averaging_s=path.averaging_s,
            actuation_s=max(self.delay_s - shown_s, 0.0),
            actuation_samples_s=tuple(max(d - shown_s, 0.0) for d in self.delays_s),
        )

    def _waving(self, mix: JobMix) -> tuple[np.ndarray, np.ndarray]:
        """The capped periods (measured where the agents resolve them) and duties of the
        placed jobs that swing (0 < duty < 1)."""
        measured = {
            j.job_id: j for j in job_readings(self.fleet.last or {}) if j.period_s is not None
        }
        periods, duties = [], []
        for job in self._swinging(mix):
            seen = measured.get(job.id)
            periods.append(seen.period_s if seen and seen.period_s else job.period_s)
            duties.append(seen.duty if seen and seen.duty else job.duty)
        return np.array(periods, dtype=float), np.array(duties, dtype=float)

    @staticmethod
    def _swinging(mix: JobMix) -> list[Job]:
        """The placed jobs whose power swings: the ones this loop can lock."""
        return [j for j in mix.waving if j.placement]

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
            "correction_bound_kw": (
                self.correction_bound_kw(_asked_kw(pursuit)) if pursuit else None
            ),
            "period_s": self.period_s,
            "window_s": self.window_s,
            "delay_s": self.delay_s,
            "integral_gain_per_s": self.integral_gain_per_s,
            "gain_rule": self.gain_rule,
            "verdict": self.verdict,
            "reason": self.reason,
            "coupling_per_s": self.coupling_per_s,
            #: "gain" (a delta on the site's gain), "meter" (a delta or level at the meter)
            "basis": None if pursuit is None else "gain" if pursuit.on_gain else "meter",
            "site_gain": pursuit.gain if pursuit else self.site_gain,
            #: facility kW per GPU kW as the meter answered the loop's moves (None: not yet),
            #: and the answers taken on the agents' GPU power instead (a static step in them)
            "overhead_gain": self.overhead_gains.gain,
            "answers_replaced": self.overhead_gains.replaced,
        }


def carried_correction_kw(pursuit: Pursuit, reduction_kw: float) -> float:
    """The correction for a new reduction asked of the same event: the model's error as an
    offset and a gain, `a + b * reduction`, fitted on the corrections it settled at two or more
    reductions at least `SPREAD` apart; with fewer, all of it a gain (a model's error at the
    meter is mostly in what the caps shed: the baseline was read at the meter before the event),
    scaled from the reduction it was taken at. A correction kept as kW misread a deep cut's
    error at a shallow one: 19 kW then 4 kW shed 5.7 kW (+43%) for 30 s."""
    points = sorted(pursuit.settled_at.items())
    if len(points) >= 2 and points[-1][0] - points[0][0] >= SPREAD * points[-1][0]:
        asked = np.array([r for r, _ in points])
        taken = np.array([c for _, c in points])
        b, a = np.polyfit(asked, taken, 1)
        return float(a + b * reduction_kw)
    if pursuit.reduction_kw <= 0.0:
        return pursuit.correction_kw
    return pursuit.correction_kw * reduction_kw / pursuit.reduction_kw


def _asked_kw(pursuit: Pursuit) -> float:
    """The reduction the event asks at the meter [kW]: the model's, or for a level the meter's
    own distance to it when that is more (a model whose baseline is low asks too little, and
    a correction bounded by that could never reach the level)."""
    if pursuit.reference_kw is None or pursuit.target_kw is None or pursuit.level_kw is None:
        return pursuit.reduction_kw
    return max(pursuit.reduction_kw, pursuit.reference_kw - pursuit.target_kw)


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Periods and delays within 5% (or 10 ms) of those last checked need no new check."""
    return all(abs(x - y) <= max(0.05 * abs(y), 0.01) for x, y in zip(a, b, strict=True))
