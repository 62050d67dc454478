"""Silent meter faults: readings that look fine but do not answer the site loop's moves.

A stuck Modbus register or a BMS point holding its last value passes every check of the feed
(finite, in range, fresh). What gives it away is the site loop's own plans: when it moves the
caps, the meter must move as its predictor expects (`gateway.services.tracking`: each planned
kW through the loop's dead time and the meter's path). Every sample the watch compares the
meter's move over the last `settle_s` (dead time, three time constants, the averaging, a
period) with the predicted one, when that is at least `check_kw`:

- `stuck`: the readings stayed within the meter's noise;
- `no_response`: they moved less than a quarter of the prediction;
- `wrong_sign`: against it by more than a quarter;
- `implausible`: more than three times it.

A meter whose readings wandered (as a meter's noise does) and then hold one value exactly for a
settling time is `stuck` too, with no move of the loop's needed (a delta held on the site's
gain makes none for hours). How the readings moved is remembered over the last `WANDER_MEMORY`
changes, not only over the interval judged: a freeze after a long steady hold, or after a gap
in the samples, still has the meter's past to be compared with. A meter whose readings come in
steps (a register in 0.5 kW, say: `MeterFeed.step_kw`) holds one value at a steady level for as
long as its noise stays inside a step: with steps of at least twice the meter's noise
(`noise_kw`), a hold is no evidence at all and such a meter's freeze is caught only by the
loop's moves it does not answer (one value held while the loop predicts a move of a step and
twice the noise: `stuck` too, whatever `check_kw`); with finer steps, a hold counts once its
chance at the worst place in a step (the middle) is below `CHANCE_HOLD`, and never with fewer
than `FROZEN_READINGS` readings.

Two `stuck` verdicts in a row make the feed `suspect` (`MeterFeed.suspect`); the others must
hold for two whole settling times, since a disturbance the loop answers (a cooling step, a job
that ended before the scheduler said so) makes the meter's move differ from the loop's own for
up to one. The suspicion dates from a settling time before the first interval judged wrong:
the site loop undoes what it took from those readings and holds, and the site's figures fall
back to the estimate. The suspicion is lifted when the meter answers
plausibly again: its level back within `check_kw` of the prediction, offset as it was before the
fault (the model's error then), with readings that move (not for `stuck`) or a predicted move
answered within a factor of two.

The ratios are wide on purpose: the overhead model may be wrong by tens of percent (the loop
corrects that), but not by a factor of four, and not in sign.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from gateway.meter.feed import MeterFeed

#: Judged moves in a row that make a suspicion.
CONFIRM = 2
#: The meter's move over the prediction's: below LOW or above HIGH is a fault ...
LOW, HIGH = 0.25, 3.0
#: ... and within [1 / ANSWERED, ANSWERED] an answer that lifts one.
ANSWERED = 2.0
#: Without `check_kw`, a prediction of this share of the site's power is judged.
CHECK_SHARE = 0.02
#: ... or of this many standard deviations of the meter's noise, whichever is larger.
CHECK_SIGMAS = 6.0
#: Readings exactly the same, at least this many over a settling time, from a meter whose
#: readings wandered before (their changes changed sign at least `WANDERED` of the time): a
#: value held, judged with no move of the loop's to answer.
FROZEN_READINGS = 4
WANDERED = 0.25
#: The last this many changes of the readings are what "wandered" is judged on.
WANDER_MEMORY = 24
#: Steps of at least this many of the meter's noise: its noise does not cross them, and a
#: hold of one is no evidence of a freeze.
COARSE_STEP_SIGMAS = 2.0
#: A hold of a meter in finer steps is a freeze when its noise makes one as long less likely.
CHANCE_HOLD = 1e-3


@dataclass(frozen=True)
class _Point:
    at_s: float
    #: the meter's reading by the loop's model, but for a constant, with the dead time short
    #: and long by its error [kW]
    early_kw: float
    late_kw: float
    meter_kw: float


class MeterWatch:
    def __init__(self, feed: MeterFeed, *, noise_kw: float, check_kw: float | None) -> None:
        self.feed, self.noise_kw, self.check_kw = feed, noise_kw, check_kw
        self._points: deque[_Point] = deque()
        self._bad = 0  #: judged moves in a row that were wrong
        self._first_bad_s = 0.0  #: where the first of them began [s]
        self._offset_kw = 0.0  #: the meter less the prediction before the suspicion [kW]
        self._last_kw: float | None = None  #: the last fresh reading [kW]
        #: the signs of the readings' last changes (a reading equal to the one before: none)
        self._change_signs: deque[float] = deque(maxlen=WANDER_MEMORY)
        self._held = 0  #: how many readings the value now has been held

    def reset(self) -> None:
        """A new prediction (another event): the old one's points no longer compare (how the
        meter's readings moved still tells what the meter is)."""
        self._points.clear()
        self._bad = 0

    def between_events(self, settle_s: float) -> None:
        """A sample with no prediction to compare with: a meter suspected `stuck` whose
        readings moved beyond its noise over the last `settle_s` [s] is believed again (a
        register that moves is not stuck), so the next event starts from the meter."""
        if (self.feed.suspicion or "").startswith("stuck"):
            readings = [r.power_kw for r in self.feed.recent(settle_s)]
            if len(readings) > CONFIRM and max(readings) - min(readings) > self.noise_kw:
                self.feed.clear_suspicion()

    def observe(
        self,
        at_s: float,
        predicted_kw: tuple[float, float],
        *,
        settle_s: float,
        period_s: float,
    ) -> None:
        """One sample: the loop's prediction now, with the dead time short and long by its
        error, and the meter's last reading if it is fresh. `settle_s`: how long the meter
        takes to show 95% of a move, with the longer dead time [s]."""
        last = self.feed.last()
        if last is None or at_s - last.monotonic_s > period_s / 2:
            return  # no fresh reading: the feed says why
        if self._last_kw is not None and last.power_kw != self._last_kw:
            self._change_signs.append(float(np.sign(last.power_kw - self._last_kw)))
            self._held = 0
        self._held += 1
        self._last_kw = last.power_kw
        self._points.append(_Point(at_s, *predicted_kw, last.power_kw))
        while self._points[0].at_s < at_s - 3 * settle_s:
            self._points.popleft()
        points = list(self._points)
        then = next(i for i, p in enumerate(points) if p.at_s >= at_s - settle_s)
        if then == len(points) - 1 or points[0].at_s > at_s - settle_s:
            return  # not a whole interval seen yet
        meter = np.array([p.meter_kw for p in points])
        check_kw = self.check_kw or max(CHECK_SIGMAS * self.noise_kw, CHECK_SHARE * meter[-1])
        if self.feed.suspicion is None:
            self._judge(points, meter, then, check_kw, settle_s, period_s)
        else:
            self._recheck(points, meter, then, check_kw)

    @staticmethod
    def _expected(points: list[_Point], then: int) -> tuple[float, float]:
        """The predicted move over the interval: the smaller and the larger of the two
        dead times' [kW], signed; (0, 0) when they disagree in sign."""
        moves = sorted(
            (p[-1] - p[then] for p in ([q.early_kw for q in points], [q.late_kw for q in points])),
            key=abs,
        )
        return (0.0, 0.0) if moves[0] * moves[1] <= 0 else (moves[0], moves[1])

    def _judge(
        self,
        points: list[_Point],
        meter: np.ndarray,
        then: int,
        check_kw: float,
        settle_s: float,
        period_s: float,
    ) -> None:
        small_kw, large_kw = self._expected(points, then)
        span = meter[then:]
        step_kw = self.feed.step_kw
        held_long = self._held >= _hold_needed(step_kw, self.noise_kw)
        frozen = held_long and _frozen(span, np.array(self._change_signs))
        # A meter in steps its noise does not cross (a hold is no evidence) shows a move of a
        # step and twice its noise as another step at least.
        coarse = step_kw > 0.0 and step_kw >= COARSE_STEP_SIGMAS * self.noise_kw
        unmoved = coarse and abs(small_kw) >= step_kw + 2.0 * self.noise_kw
        unmoved = unmoved and span.size >= FROZEN_READINGS and bool(np.all(span == span[0]))
        if not frozen and not unmoved and abs(small_kw) < check_kw:
            self._bad = 0
            return
        moved_kw = float(meter[-1] - meter[then])
        along = moved_kw / abs(small_kw) * (1 if small_kw > 0 else -1) if small_kw else 0.0
        if not frozen and not unmoved and along >= LOW and moved_kw / large_kw <= HIGH:
            self._bad = 0
            return
        if frozen:
            reason = "stuck"
            detail = f"{len(span)} readings all {span[-1]:g} kW, where they wandered before"
        elif unmoved:
            reason = "stuck"
            detail = f"{len(span)} readings all {span[-1]:g} kW, in steps of {step_kw:g} kW"
        elif float(span.max() - span.min()) <= self.noise_kw:
            reason = "stuck"
            detail = f"{len(span)} readings within {self.noise_kw:g} kW (the meter's noise)"
        elif along >= LOW:
            reason, detail = "implausible", f"it moved {moved_kw:+.2f} kW"
        elif along < -LOW:
            reason, detail = "wrong_sign", f"it moved {moved_kw:+.2f} kW"
        else:
            reason, detail = "no_response", f"it moved {moved_kw:+.2f} kW"
        self._bad += 1
        needed = CONFIRM if reason == "stuck" else max(CONFIRM, round(2 * settle_s / period_s))
        if self._bad == 1:
            # The readings that made the loop move were already wrong: the fault began up to
            # a settling time before the first move that went unanswered.
            self._first_bad_s = points[then].at_s - settle_s
        if self._bad < needed:
            return
        # The model's error at the meter while it still answered: what the level must return to.
        trusted = [p for p in points if p.at_s <= self._first_bad_s] or points[:1]
        self._offset_kw = float(np.mean([p.meter_kw - _mid(p) for p in trusted]))
        self.feed.suspect(
            reason,
            f"{detail} while the site loop's model predicts {small_kw:+.2f} to "
            f"{large_kw:+.2f} kW over the last {points[-1].at_s - points[then].at_s:.0f} s",
            since_s=self._first_bad_s,
        )

    def _recheck(self, points: list[_Point], meter: np.ndarray, then: int, check_kw: float) -> None:
        small_kw, large_kw = self._expected(points, then)
        moved_kw = float(meter[-1] - meter[then])
        answered = (
            abs(small_kw) >= check_kw
            and moved_kw / small_kw >= 1 / ANSWERED
            and moved_kw / large_kw <= ANSWERED
        )
        level_kw = float(meter[-1] - _mid(points[-1])) - self._offset_kw
        recent = meter[-CONFIRM - 1 :]
        moving = float(recent.max() - recent.min()) > self.noise_kw
        stuck = (self.feed.suspicion or "").startswith("stuck")
        if answered or (abs(level_kw) <= check_kw and (moving or not stuck)):
            self.feed.clear_suspicion()
            self._bad = 0


def _frozen(span: np.ndarray, change_signs: np.ndarray) -> bool:
    """Every reading of the span the same (`FROZEN_READINGS` or more), where before it they
    wandered as a meter's noise does (a steady approach of a noise-free model does not): the
    signs of their last changes flipped at least `WANDERED` of the time."""
    if span.size < FROZEN_READINGS or np.any(span != span[0]):
        return False
    if change_signs.size < FROZEN_READINGS:
        return False
    return float(np.mean(np.diff(change_signs) != 0)) >= WANDERED


def _hold_needed(step_kw: float, noise_kw: float) -> float:
    """The readings one value must be held to be a freeze: never where the meter's steps are
    `COARSE_STEP_SIGMAS` of its noise or more (a level inside a step reads the same for as long
    as it stays);
    otherwise as many as make the hold less likely than `CHANCE_HOLD` at a step's middle,
    where a reading repeats the last with probability erf(step / (2 sqrt(2) noise)), and at
    least `FROZEN_READINGS`."""
    if step_kw <= 0.0:
        return FROZEN_READINGS
    if step_kw >= COARSE_STEP_SIGMAS * noise_kw:
        return math.inf
    repeats = math.erf(step_kw / (2.0 * math.sqrt(2.0) * noise_kw))
    return max(FROZEN_READINGS, 1 + math.ceil(math.log(CHANCE_HOLD) / math.log(repeats)))


def _mid(point: _Point) -> float:
    return (point.early_kw + point.late_kw) / 2
