"""The site loop's configuration: its delay as measured, its window and gain, and the sync
analysis's verdict on them (`flexmodel.sync`): chosen before each event and whenever the
capped periods or the measured delay move, and what every plan's sync verdict judges."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from flexmodel.jobs import Job, JobMix
from flexmodel.loopresponse import ClosedLoopResponse
from flexmodel.looprobust import SiteLoop, parameter_error, robust_gain
from flexmodel.loops import ControlLoop, combine_delays, job_unit_coupling
from flexmodel.sync import worst_verdict
from gateway.services.fleet import Fleet, job_readings
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings

log = logging.getLogger("flexgate.gateway")
#: The loop averages the site's power over at least this many of the longest periods.
WINDOW_PERIODS = 4.0
#: Safe configurations tried, in order, when one is refused: the window doubled, the gain halved.
ADJUSTMENTS = 4


class LoopConfig:
    def __init__(self, settings: GatewaySettings, site: SitePower, fleet: Fleet) -> None:
        self.settings, self.site, self.fleet = settings, site, fleet
        self.window_s = settings.loop_window_s or 0.0
        self.gain = settings.loop_gain
        self.delay_s = 0.0  #: the loop's delay: dead time and the cooling's lag [s]
        self.lag_s = 0.0  #: of which the meter path's first-order lag [s]
        self.span_s = 0.0  #: each reading's own averaging [s]
        self.dead_s = 0.0  #: from a planned move to the first reading that shows it [s]
        self.dead_error_s = 0.0  #: the meter path's dead time's standard error, as planned [s]
        self.gain_rule: str | None = None  #: why the gain is below the configured one
        self.delays_s: tuple[float, ...] = (0.0,)  #: its distribution (delay_s is the mean)
        self.verdict: str | None = None
        self.reason: str | None = None  #: why the loop was adjusted, held or refused
        #: the strongest attraction the loop puts on any job's harmonic, as checked [rad/s]
        self.coupling_per_s = 0.0
        self.plan_s = 0.0  #: how long the last re-plan took to be acked [s]
        self._checked: tuple[float, float] | None = None  #: (longest period, delay) checked
        #: the job mix and delay the configuration was last chosen for outside events
        self._chosen_for: tuple[JobMix, float] | None = None

    @property
    def period_s(self) -> float:
        return self.settings.meter_period_s

    @property
    def integral_gain_per_s(self) -> float:
        return self.gain / self.period_s

    def for_event(self, mix: JobMix) -> None:
        """Chosen and checked for an event that begins on `mix` (outside it, chosen again)."""
        self.measure_delay()
        self.choose(mix)
        self._chosen_for = None

    def between_events(self, mix: JobMix) -> None:
        """Chosen and checked as the loop would start on `mix` now: once per job mix and
        delay (it logs what it refuses)."""
        self.measure_delay()
        chosen_for = (mix, round(self.delay_s, 2))
        if self._chosen_for is None or not (
            chosen_for[0] is self._chosen_for[0] and chosen_for[1] == self._chosen_for[1]
        ):
            self.choose(mix)
            self._chosen_for = chosen_for

    def doc(self) -> dict[str, Any]:
        """The configuration in the loop's state (`Tracker.doc`)."""
        return {
            "period_s": self.period_s,
            "window_s": self.window_s,
            "delay_s": self.delay_s,
            "integral_gain_per_s": self.integral_gain_per_s,
            "gain_rule": self.gain_rule,
            "verdict": self.verdict,
            "reason": self.reason,
            "coupling_per_s": self.coupling_per_s,
        }

    def measure_delay(self) -> None:
        """The loop's measured delay: the meter's age and its path (dead time and lag), plan
        and dispatch, actuation."""
        meter = self.site.meter_doc(0.0)
        age_s = float(meter["age_s"] or 0.0) if not meter["estimated"] else 0.0
        path = self.site.meter_path()
        measured = self.fleet.loop_measurements()
        fixed_s = age_s + path.dead_s + path.tau_s + self.plan_s
        self.lag_s, self.span_s = path.tau_s, path.averaging_s
        self.delays_s = tuple(fixed_s + d for d in combine_delays([measured.actuation_s]))
        self.delay_s = float(np.mean(self.delays_s))
        # From a move to the reading that first shows it: the age is in the reading's time.
        self.dead_s = max(self.delay_s - age_s - path.tau_s, 0.0)
        self.dead_error_s = parameter_error(path.dead_s, path.dead_stderr_s, self.period_s)

    def choose(self, mix: JobMix) -> None:
        """The window from the jobs' periods (unless set), and the gain configured."""
        periods, _ = self._waving(mix)
        longest = float(periods.max()) if periods.size else 0.0
        chosen = max(WINDOW_PERIODS * longest, 2.0 * self.period_s)
        self.window_s = self.settings.loop_window_s or chosen
        self.gain, self.gain_rule = self._robust_gain()
        self._checked, self.reason = None, None
        self.check(mix)

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

    def check(self, mix: JobMix) -> None:
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
        """The sync analysis on the loop as it runs (`flexmodel.loopresponse.ClosedLoopResponse`):
        sampled every period, the window's readings through the meter path, the Smith
        predictor and the integral gain in closed loop, the correction applied after the
        plan and the agents' measured actuation. (An integrator with the lag counted as delay
        got the phase wrong by up to 180 degrees: docs/sync.md, "The closed loop".)"""
        if not periods.size:
            self.coupling_per_s = 0.0
            return "safe", ""
        loop = ControlLoop("site", self.closed_loop(), couples_jobs=True)
        result = loop.evaluate(
            periods,
            duties,
            gain_per_s=job_unit_coupling(self._swinging(mix), periods, mix.overhead_factor),
        )
        self.coupling_per_s = float(result["coupling_per_s"])  # what scattering is sized to
        verdict = worst_verdict([result["verdict"]])
        return verdict, f"the sync analysis says {verdict}"

    def closed_loop(self) -> ClosedLoopResponse:
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

    def settle_s(self) -> float:
        """From a move to the window's showing it whole: the loop's delay, three time
        constants, the averaging and the window [s]."""
        return self.delay_s + 2 * self.lag_s + self.span_s + self.window_s + self.period_s

    def path(self) -> tuple[float, float]:
        """The meter path after its dead time: (time constant, averaging) [s]."""
        return self.lag_s, self.span_s

    def gpu_span_s(self) -> float:
        """How long a stretch of readings the agents' GPU power is the mean of, the longest
        [s]: 0 without readings."""
        spans = [
            len(gpu.power_w) * gpu.sample_interval_s
            for node in (self.fleet.last or {}).values()
            for gpu in node.gpus
        ]
        return max(spans, default=0.0)

    def actuated_s(self) -> float:
        """From a plan to the agents' GPU power showing it whole [s]: planning, the slowest
        actuation measured, and the agents' averaging."""
        measured = self.fleet.loop_measurements()
        return max(measured.actuation_s, default=0.0) + self.plan_s + self.gpu_span_s()

    def window_readings(self) -> int:
        return max(round(self.window_s / self.period_s), 3)


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Periods and delays within 5% (or 10 ms) of those last checked need no new check."""
    return all(abs(x - y) <= max(0.05 * abs(y), 0.01) for x, y in zip(a, b, strict=True))
