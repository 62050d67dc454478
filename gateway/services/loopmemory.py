"""What the site loop learns from one event for the next: its settled errors at the meter (a
ceiling's margin), each event's model error (the correction's bound and the next open-loop
plan), and the site's gain per planned kW."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from gateway.services.pursuit import Pursuit, asked_at_meter_kw
from gateway.settingsgroups.loop import LoopSettings

#: A ceiling's margin: the loop's settled errors kept, how many it needs before it trusts
#: them, and the margin's floor and its default before then (shares of the limit).
LIMIT_ERRORS = 2000
LIMIT_MIN_SAMPLES = 30
LIMIT_MARGIN_FLOOR = 0.005
LIMIT_MARGIN_DEFAULT = 0.02
LIMIT_MARGIN_MOST = 0.10
#: The correction's bound from past events' model error: how many it needs, how many it keeps,
#: the factor on the largest, and the least share of the reduction it allows.
BOUND_EVENTS = 3
BOUND_EVENTS_KEPT = 20
BOUND_FACTOR = 2.0
BOUND_FLOOR = 0.25
#: The deltas' first answers kept (the site's gain before an event reads its own is their
#: median).
ANSWER_GAINS_KEPT = 9
#: The model's gain is read once the plan sheds this share of the site, each settled sample
#: moving it by this share towards what it read (within 0.5 to 1.5: beyond, the meter watch,
#: not the predictor, has something to say).
GAIN_MIN_SHARE = 0.02
GAIN_WEIGHT = 0.03


class LoopMemory:
    def __init__(self, settings: LoopSettings) -> None:
        self.settings = settings
        #: the error at the meter (measured - target) once each event had settled [kW]
        self.settled_errors_kw: deque[float] = deque(maxlen=LIMIT_ERRORS)
        #: each past event's settled model error at the meter: what it planned over what it
        #: asked at the meter, less 1; and the same in kW (what it planned less what it asked)
        self.model_errors: deque[float] = deque(maxlen=BOUND_EVENTS_KEPT)
        self.model_errors_kw: deque[float] = deque(maxlen=BOUND_EVENTS_KEPT)
        self.last_gain = 1.0  #: the last settled event's gain at the meter, where the next starts
        #: the meter's first answer of each delta on the site's gain, per planned kW
        self.answer_gains: deque[float] = deque(maxlen=ANSWER_GAINS_KEPT)

    @property
    def site_gain(self) -> float:
        """What the site sheds at the meter per kW the model plans, before an event reads its
        own: the median of the deltas' first answers (`ANSWER_GAINS_KEPT`), else the last
        settled event's."""
        return float(np.median(self.answer_gains)) if self.answer_gains else self.last_gain

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

    def opening_correction_kw(self, pursuit: Pursuit) -> float:
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
        `BOUND_FACTOR` times the largest model error they needed at the meter, as a share of
        the reduction (nor less than `BOUND_FLOOR` of it) or in kW, whichever is more. A
        model's error is part gain, part offset (caps above what a job truly draws shed
        nothing at first): bounded by the share alone, a 2.4 kW setpoint on a site whose
        deeper events needed 26% was held 9% short of its level, its correction at the bound
        while the meter showed the gap."""
        most_kw = self.settings.loop_max_correction * max(reduction_kw, 1.0)
        if len(self.model_errors) < BOUND_EVENTS:
            return most_kw
        share = max(BOUND_FACTOR * max(abs(e) for e in self.model_errors), BOUND_FLOOR)
        measured_kw = BOUND_FACTOR * max((abs(e) for e in self.model_errors_kw), default=0.0)
        return min(most_kw, max(share * max(reduction_kw, 1.0), measured_kw))

    def pursuit_bound_kw(self, pursuit: Pursuit) -> float:
        """The correction's bound in this event [kW]: `correction_bound_kw` of what it asks at
        the meter, widened by the static load's steps fed forward (a measured disturbance, not
        the model's error: bounded by the share of a 9 kW limit, a 2.2 kW chiller step left
        the site above the limit for a quarter of an hour)."""
        return self.correction_bound_kw(asked_at_meter_kw(pursuit)) + abs(pursuit.static_fed_kw)

    def bounded(self, pursuit: Pursuit, correction: float, plan: dict[str, Any]) -> float:
        """The correction within its bound and what the site can shed at most [kW]."""
        asked_kw = asked_at_meter_kw(pursuit)
        bound_kw = self.pursuit_bound_kw(pursuit)
        # Bounded around what the meter asks, not around the model's reduction: for a level
        # the model puts the site under, the correction carries all of it (bounded around 0,
        # a site whose past events needed 16% held 2.8 of 9 kW and never reached its level).
        centre_kw = asked_kw - pursuit.reduction_kw
        correction = min(max(correction, centre_kw - bound_kw), centre_kw + bound_kw)
        most_kw = float(plan.get("max_facility_kw", math.inf))
        return min(correction, most_kw - pursuit.reduction_kw)

    def learn(
        self,
        pursuit: Pursuit,
        error_kw: float,
        reference_kw: float | None,
        short: bool,
        *,
        safe: bool,
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
            safe
            and reference_kw is not None
            and measured_kw is not None
            and pursuit.achieved_kw > 0.0  # a site drawing nothing plans nothing to divide by
            and pursuit.achieved_kw >= GAIN_MIN_SHARE * reference_kw
        ):
            # Slowly: one reading is not evidence, and a meter found wrong later undoes it.
            shed_kw = reference_kw - measured_kw
            seen = float(np.clip(shed_kw / pursuit.achieved_kw, 0.5, 1.5))
            pursuit.gain += GAIN_WEIGHT * (seen - pursuit.gain)
        asked_kw = max(asked_at_meter_kw(pursuit), 1.0)
        pursuit.settled_share = (pursuit.reduction_kw + pursuit.correction_kw) / asked_kw - 1
        pursuit.settled_error_kw = pursuit.settled_share * asked_kw

    def remember(self, pursuit: Pursuit) -> None:
        """An event ended: what it settled on, for the next, unless its meter faulted or its
        job mix changed (a job's end left a limit 96% of its reduction it did not need, and
        the next delta opened 10% short on the gain it read)."""
        if pursuit.settled_share is not None and not (pursuit.faulted or pursuit.churned):
            self.model_errors.append(pursuit.settled_share)
            self.model_errors_kw.append(pursuit.settled_error_kw)
            self.last_gain = pursuit.gain
            if pursuit.on_gain and pursuit.achieved_kw > 0:  # its shed over its plan, not a slope
                self.last_gain = pursuit.shed_kw / pursuit.achieved_kw
