"""The site loop's Smith predictor: what the model's own moves will still do at the meter
(each through the loop's dead time, the meter path's lag and averaging), and the meter watch
that judges the meter against it (`gateway.meter.watch`): readings it stops believing undo
the corrections they drove."""

from __future__ import annotations

import logging
import math

import numpy as np

from flexmodel.meterpath import step_share
from gateway.clock import Clock
from gateway.meter.watch import MeterWatch
from gateway.services.loopconfig import LoopConfig
from gateway.services.pursuit import Pursuit
from gateway.services.site import SitePower

log = logging.getLogger("flexgate.gateway")
_MAD_TO_SD = 1.4826


class SmithPredictor:
    def __init__(self, clock: Clock, site: SitePower, config: LoopConfig) -> None:
        self.clock, self.site, self.config = clock, site, config
        settings = config.settings
        self.watch = None
        if site.feed is not None:
            self.watch = MeterWatch(
                site.feed, noise_kw=settings.meter_noise_kw, check_kw=settings.meter_check_kw
            )

    def watch_meter(self, pursuit: Pursuit) -> None:
        """The meter watch's sample: the predictor's reading now, with the dead time short and
        long by its error, against the meter's (`gateway.meter.watch`)."""
        if self.watch is None or self.clock.monotonic() < pursuit.watch_from_s:
            return
        settle_s = (
            self.config.delay_s
            + self.config.dead_error_s
            + 2 * self.config.lag_s
            + self.config.span_s
        )
        self.watch.observe(
            self.clock.monotonic(),
            (
                self.predicted_kw(pursuit, -self.config.dead_error_s),
                self.predicted_kw(pursuit, self.config.dead_error_s),
            ),
            settle_s=settle_s + self.config.period_s,
            period_s=self.config.period_s,
        )

    def undo_suspected(self, pursuit: Pursuit) -> bool:
        """Readings the meter watch no longer believes (stuck, no response, implausible:
        `gateway.meter.watch`) drove the correction since the suspicion's start: it goes back
        to what it was then, once, and the plan with it. True when the correction moved."""
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
        return True

    def unseen_kw(self, pursuit: Pursuit) -> float:
        """What the model's moves will still do to the window's average: each reading in the
        window shows a move after the loop's dead time (plan and dispatch, actuation, the
        meter's own dead time), through the meter path's lag and averaging, from when it was
        measured (the meter's reading, or on the estimate the agents' telemetry round). The
        same readings the loop averages: no continuous approximation of a window of few
        samples. Moves every reading shows whole are settled."""
        readings = np.array([s.reading_at_s for s in self.site.window(self.config.window_s)])
        if not readings.size:
            readings = np.array([self.clock.monotonic()])
        unseen, live = 0.0, []
        for at_s, move_kw in pursuit.moves:
            seen = float(
                np.mean(step_share(readings - at_s - self.config.dead_s, 0.0, *self.config.path()))
            )
            if seen >= 1.0 - 1e-9:
                pursuit.settled_kw += move_kw
                continue
            unseen += move_kw * (1.0 - seen)
            live.append((at_s, move_kw))
        pursuit.moves = live
        return unseen

    def predicted_kw(self, pursuit: Pursuit, dead_error_s: float) -> float:
        """The meter's last reading by the model, but for a constant [kW]: each of the model's
        moves through the loop's dead time (moved by `dead_error_s`) and the meter's path
        (for the meter watch: `gateway.meter.watch`)."""
        if not pursuit.moves:
            return pursuit.settled_kw
        read_s = self.site.history[-1].reading_at_s if self.site.history else 0.0
        dead_s = max(self.config.dead_s + dead_error_s, 0.0)
        since = read_s - dead_s - np.array([at_s for at_s, _ in pursuit.moves])
        shares = step_share(since, 0.0, *self.config.path())
        return pursuit.settled_kw + float(np.array([kw for _, kw in pursuit.moves]) @ shares)

    def window_noise_kw(self) -> float:
        """One standard deviation of the window's average from the readings' own noise [kW]:
        the scatter of successive readings (robust: the median of their changes, so the loop's
        own steps do not count), or the meter's declared noise if larger."""
        readings = [s.facility_kw for s in self.site.window(self.config.window_s)]
        values = np.array([kw for kw in readings if kw is not None])
        if values.size < 3:
            return 0.0
        changes = np.diff(values)
        spread_kw = _MAD_TO_SD * float(np.median(np.abs(changes - np.median(changes))))
        noise_kw = max(spread_kw / math.sqrt(2.0), self.config.settings.meter_noise_kw)
        return noise_kw / math.sqrt(values.size)
