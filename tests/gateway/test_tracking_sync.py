"""The site loop's sync verdict against the loop that runs (issue 35, case 1).

A lock-in on the real `Tracker`: its site, plans and clock are a light harness (no agents,
no planner), the GPUs' power a sinusoid at the harmonic's frequency plus the loop's own
reduction, read by a meter of dead time, first-order lag and averaging simulated on a fine
grid (50 points a period, the lag integrated exactly). The loop's correction in kW, fitted
to the sinusoid, is compared with `flexmodel.loopresponse.ClosedLoopResponse.correction`.

The harness turns off the two gates that are not linear: the window-noise gate (a sinusoid's
own changes read as noise, and errors within it are skipped: it lowers the coupling, so the
linear model is the worse case) and the re-plan deadband (a quantisation of the correction).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

from flexmodel.loopresponse import ClosedLoopResponse, LoopResponse
from flexmodel.meterpath import MeterPath
from gateway.services import tracking
from gateway.services.site import Sample, SitePower
from gateway.services.tracking import Tracker

BASE_KW, REDUCTION_KW, SWING_KW = 2000.0, 1000.0, 100.0
FINE = 50  #: points of the simulated meter path per loop period


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s


class _Site:
    """What the loop reads of `SitePower`: its own window and average, on our readings."""

    feed = None
    source = "meter"

    def __init__(self, clock: _Clock, path: MeterPath) -> None:
        self.clock, self.path, self.history = clock, path, []
        self.window = SitePower.window.__get__(self)
        self.filtered_kw = SitePower.filtered_kw.__get__(self)
        # the overhead model `facility_kw` follows: a facility kW per GPU kW
        self.overhead = SimpleNamespace(current=lambda: SimpleNamespace(k=1.0))

    def facility_kw(self, gpu_kw: float) -> float:
        return gpu_kw

    def meter_doc(self, gpu_kw: float) -> dict:
        return {"age_s": 0.0, "estimated": False}

    def meter_path(self) -> MeterPath:
        return self.path


class _Targets:
    def __init__(self, clock: _Clock) -> None:
        self.clock, self.plans, self.planned_at_s = clock, [(-math.inf, 0.0)], 0.0
        self.held_reduction_kw, self.last_plan = 0.0, {"shortfall_kw": 0.0}

    async def hold(self, requested_kw: float, event_id: str, doc: dict) -> None:
        self.planned_at_s = self.clock.monotonic()
        self.plans.append((self.planned_at_s, requested_kw))


def lock_in(
    loop: ClosedLoopResponse, period_s: float, cycles: float = 30.0
) -> tuple[complex, float]:
    """The real loop's correction per kW of the jobs' swing at `period_s`, and the fit's
    signal-to-noise ratio: `loop` gives the site (its `model_*` the loop's belief)."""
    h, w = loop.period_s, 2 * math.pi / period_s
    clock = _Clock()
    belief = MeterPath(
        loop.dead_s if loop.model_dead_s is None else loop.model_dead_s,
        loop.lag_s if loop.model_lag_s is None else loop.model_lag_s,
        loop.averaging_s,
        0.0,
        0.0,
    )
    site, targets = _Site(clock, belief), _Targets(clock)
    settings = SimpleNamespace(
        meter_period_s=h,
        loop_window_s=loop.window_s,
        loop_gain=loop.gain,
        tracking=True,
        meter_noise_kw=0.0,
        meter_check_kw=1.0,
        loop_max_correction=1.0,
        loop_unsafe=True,
        loop_gain_error=0.0,
        gpu_idle_w=0.0,
    )
    mix = SimpleNamespace(baseline_gpu_kw=BASE_KW, waving=[], placed=())
    book = SimpleNamespace(mix=lambda: mix)
    fleet = SimpleNamespace(
        loop_measurements=lambda: SimpleNamespace(actuation_s=[loop.actuation_s]), last=None
    )
    tracker = Tracker(settings, clock, site, targets, book, fleet)
    tracker.predictor.window_noise_kw = lambda: 0.0  # the lock-in reads every correction
    dt = h / FINE
    alpha = math.exp(-dt / loop.lag_s) if loop.lag_s > 0 else 0.0
    averaged = max(round(loop.averaging_s / dt), 1)
    settle_s = loop.delay_s + 8 * loop.lag_s + loop.averaging_s + loop.window_s
    warm = math.ceil((settle_s + 20 * h) / h)
    steps = warm + math.ceil(cycles * max(period_s, 8 * h) / h)
    ys: list[float] = [0.0]

    def applied(at_s: np.ndarray) -> np.ndarray:
        times = np.array([t for t, _ in targets.plans])
        kws = np.array([kw for _, kw in targets.plans])
        return kws[np.searchsorted(times, at_s - loop.actuation_s, side="right") - 1]

    async def run() -> list[float]:
        for n in range(-round(loop.window_s / h) - 2, 0):  # the site before the event
            site.history.append(Sample(n * h, BASE_KW, BASE_KW, n * h))
        await tracker.pursue("ev", REDUCTION_KW, None)
        out = []
        for n in range(steps):
            s = n * h + dt * (np.arange(FINE) + 1.0) - loop.dead_s
            u = SWING_KW * np.cos(w * s) - applied(s)
            y = ys[-1]
            for value in u:  # the lag, exact for a value held over dt
                y = alpha * y + (1 - alpha) * value
                ys.append(y)
            reading = BASE_KW + float(np.mean(ys[-averaged:]))
            clock.now_s = (n + 1) * h
            site.history.append(Sample(clock.now_s, BASE_KW, reading, clock.now_s))
            await tracker.step()
            out.append(tracker.pursuit.correction_kw)
        return out

    corrections = np.array(asyncio.run(run()))[warm:]
    t = h * (np.arange(corrections.size) + warm + 1)
    design = np.column_stack([np.ones_like(t), t - t.mean(), np.cos(w * t), np.sin(w * t)])
    fit, *_ = np.linalg.lstsq(design, corrections, rcond=None)
    residual = corrections - design @ fit
    value = complex(fit[2], -fit[3]) / SWING_KW
    sd = float(np.std(residual)) * math.sqrt(2.0 / t.size) / SWING_KW
    return value, abs(value) / max(sd, 1e-15)


@pytest.fixture(autouse=True)
def no_deadband(monkeypatch):
    monkeypatch.setattr(tracking, "DEADBAND", 0.0)


def test_case_1_the_loop_does_not_attract_where_the_integrator_model_said_it_did():
    """Issue 35, case 1: a 1 s period, a 2 s window, a 3 s lag. The old verdict's model
    (an integrator, the lag counted as delay) put the response at +9 degrees (T = 6.2 s,
    gain 0.5) and +135 (T = 12 s, gain 1): attracting. The loop's correction lags the swing
    instead (-131 and -73 degrees here, -88 and -30 for a loop reading the swing one period
    late and unfiltered: `k / (z - 1 + k)`), and the closed-loop model says so."""
    for period_s, gain, old_deg, real_deg in ((6.2, 0.5, 9.0, -131.0), (12.0, 1.0, 135.0, -72.5)):
        w = 2 * math.pi / period_s
        old = LoopResponse(3.0, 2.0, 1.0, 0.0, gain / 1.0).response(w)
        assert math.degrees(np.angle(old)) == pytest.approx(old_deg, abs=1.0)
        loop = ClosedLoopResponse(period_s=1.0, gain=gain, window_s=2.0, lag_s=3.0)
        model = complex(loop.correction(w))
        measured, snr = lock_in(loop, period_s)
        assert snr >= 10
        assert math.degrees(np.angle(measured)) == pytest.approx(real_deg, abs=3.0)
        assert abs(model - measured) <= 0.2 * abs(measured)
        core = ClosedLoopResponse(period_s=1.0, gain=gain, dead_s=1.0)
        assert math.degrees(np.angle(core.correction(w))) == pytest.approx(
            -88.0 if period_s == 6.2 else -30.0, abs=1.0
        )
        assert np.imag(old) > 0
        assert np.imag(loop.response(w)) < 0


def grid() -> list[ClosedLoopResponse | tuple]:
    """36 points over the harmonic's period, the gain, the window, the dead time and the lag,
    some with the predictor's model wrong, on a 1 s or a 5 s loop."""
    points = []
    combos = itertools.product(
        (2.5, 4.0, 6.2, 12.0), (0.3, 1.0), ((2.0, 0.0, 3.0), (4.0, 2.0, 1.0), (3.0, 1.0, 6.0))
    )
    for i, (period, gain, (window, dead, lag)) in enumerate(combos):
        points.append((period, ClosedLoopResponse(1.0, gain, window, dead, lag, actuation_s=0.5)))
        if i % 4 == 0:  # the predictor's model wrong by a second of dead time and half the lag
            points.append(
                (
                    period,
                    ClosedLoopResponse(
                        1.0, gain, window, dead, lag, 0.0, 0.5, 0.0, dead + 1.0, lag * 0.5
                    ),
                )
            )
    for period, gain in itertools.product((12.0, 25.0, 40.0), (0.5, 1.0)):
        points.append((period, ClosedLoopResponse(5.0, gain, 10.0, 10.0, 3.0, 2.0, 1.0)))
    return points


def test_the_closed_loop_model_matches_a_lock_in_on_the_loop_over_a_grid():
    """Complex error at most 20% of max(|H|, 5% of the loop's peak gain) where the lock-in's
    signal-to-noise ratio is at least 10; at least 30 points judged."""
    judged, errors = 0, []
    for period_s, loop in grid():
        measured, snr = lock_in(loop, period_s, cycles=20.0)
        if snr < 10:
            continue
        judged += 1
        model = complex(loop.correction(2 * math.pi / period_s))
        scale = max(abs(model), 0.05 * loop.peak_gain())
        errors.append((abs(model - measured) / scale, period_s, loop))
    assert judged >= 30
    worst = max(errors, key=lambda e: e[0])
    assert worst[0] <= 0.2, worst


@pytest.mark.parametrize(("gain", "verdict"), [(1.0, "safe"), (0.3, "unsafe")])
def test_the_site_loops_verdict_is_the_closed_loops(tmp_path, gain, verdict):
    """16 jobs of 2 s under a 0.5 s loop with a 0.5 s window and a 0.6 s meter delay. The
    integrator model called both unsafe; the loop as it runs, at gain 1, takes each sample's
    whole error, so its correction follows the swing as read, without the integrator's
    quarter period of lag: it does not attract. At 0.3 it lags more and does."""
    from tests.gateway.test_scattering import Site

    site = Site(tmp_path, meter_delay_s=0.6, loop_window_s=0.5, loop_gain=gain, loop_unsafe=True)

    async def run() -> None:
        await site.start()
        await site.tracker.pursue("ev-1", 2.5, None)

    try:
        asyncio.run(run())
    finally:
        site.close()
    assert site.tracker.config.verdict == verdict
    assert (site.tracker.config.coupling_per_s > 0) == (verdict == "unsafe")
    # Every plan's verdict judges the same loop (it judged a 3-period window, 6 s, and the
    # reconciliation period as delay: a loop that does not run).
    loops = {loop["name"]: loop for loop in site.targets.last_plan["sync"]["loops"]}
    assert loops["gateway"]["verdict"] == verdict
    assert loops["gateway"]["window_s"] == site.tracker.config.window_s
