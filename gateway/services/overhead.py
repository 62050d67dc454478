"""The facility overhead in force: facility kW = static + k * GPU kW (docs/model.md, section 3).

Precedence, highest first: the latest calibration on the site's meter (once one exists),
then the site's settings (`FLEXGATE_OVERHEAD_FACTOR`, `FLEXGATE_STATIC_LOAD_KW`). A job-mix
file's own `overhead_factor` is for the command line only; the gateway's mix takes the site's.

With a real meter, the site's power is sampled every meter period (GPU power from the agents,
facility power from the meter, side by side) and the factor is fitted on the steps in that
history every `calibration_every_s` (`flexmodel.calibration`). An identifiable fit is stored
and takes over; one that is not says why, and the previous values stay.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexmodel.calibration import NotIdentifiable, OverheadCalibration, fit_overhead
from flexmodel.meterpath import MeterPath
from gateway.clock import Clock
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import iso

log = logging.getLogger("flexgate.gateway")


@dataclass(frozen=True)
class OverheadModel:
    k: float  #: facility kW per GPU kW
    k_stderr: float
    static_kw: float  #: facility load that does not move with the GPUs [kW]
    source: str  #: configured or calibrated
    points: int | None = None  #: steps the calibration used
    calibrated_at: datetime | None = None
    path: MeterPath | None = None  #: how a GPU step reaches the meter, as last fitted

    def facility_kw(self, gpu_kw: float) -> float:
        return self.static_kw + self.k * gpu_kw

    def doc(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "k_stderr": self.k_stderr,
            "static_kw": self.static_kw,
            "points": self.points,
            "source": self.source,
            "calibrated_at": iso(self.calibrated_at),
            "lag_s": None if self.path is None else self.path.half_rise_s,
        }


def meter_path_doc(path: MeterPath) -> dict[str, Any]:
    """The `meter_path` object of `GET /v1/site` `overhead`."""
    return {
        "dead_s": path.dead_s,
        "dead_stderr_s": path.dead_stderr_s,
        "tau_s": path.tau_s,
        "tau_stderr_s": path.tau_stderr_s,
        "averaging_s": path.averaging_s,
        "source": path.source,
    }


class Overhead:
    def __init__(self, settings: GatewaySettings, store: Store, clock: Clock) -> None:
        self.settings, self.store, self.clock = settings, store, clock
        self.last_attempt: str | None = None  #: why the last fit was not taken, if it was not
        self._listeners: list[Callable[[], None]] = []
        self._samples: deque[tuple[float, float]] = deque(
            maxlen=max(int(settings.calibration_history_s / settings.meter_period_s), 2)
        )
        self._last_fit_s = clock.monotonic()
        self._model = self._configured()
        with store.session() as s:
            row = repo.latest_calibration(s)
        if row is not None:
            path = None
            if row.dead_s is not None and row.tau_s is not None:
                path = MeterPath(
                    row.dead_s,
                    row.tau_s,
                    row.averaging_s or 0.0,
                    row.dead_stderr_s,
                    row.tau_stderr_s,
                    row.path_source or "identified",
                )
            self._model = OverheadModel(
                row.k, row.k_stderr, row.static_kw, "calibrated", row.points, row.at, path
            )

    def _configured(self) -> OverheadModel:
        s = self.settings
        return OverheadModel(
            s.overhead_factor, s.overhead_factor_stderr, s.static_load_kw, "configured"
        )

    def subscribe(self, listener: Callable[[], None]) -> None:
        """`listener()` is called when the values in force change."""
        self._listeners.append(listener)

    def current(self) -> OverheadModel:
        return self._model

    def meter_path(self) -> MeterPath:
        """The meter path the site loop plans with: the calibration's parts it identified,
        the settings' (`FLEXGATE_METER_DEAD_S`, `_LAG_S`, `_AVERAGING_S`) for the rest, each
        of those with no standard error (the loop then assumes the stated default error)."""
        s = self.settings
        fitted = self._model.path
        configured = MeterPath(s.meter_dead_s, s.meter_lag_s, s.meter_averaging_s)
        if fitted is None or fitted.source.startswith("not identified: dead_s, tau_s"):
            return configured
        dead_known = "dead_s" not in fitted.source
        tau_known = "tau_s" not in fitted.source
        return MeterPath(
            fitted.dead_s if dead_known else configured.dead_s,
            fitted.tau_s if tau_known else configured.tau_s,
            s.meter_averaging_s,
            fitted.dead_stderr_s if dead_known else None,
            fitted.tau_stderr_s if tau_known else None,
            fitted.source,
        )

    def record(self, gpu_kw: float, facility_kw: float | None, meter_source: str) -> None:
        """One sample of the site, every meter period; a missing meter reading breaks the
        series (the fit needs even spacing), so the history starts again."""
        if facility_kw is None:
            self._samples.clear()
            return
        self._samples.append((gpu_kw, facility_kw))
        due = self.clock.monotonic() - self._last_fit_s >= self.settings.calibration_every_s
        if due and self.settings.calibrate:
            self._last_fit_s = self.clock.monotonic()
            self.refit(meter_source)

    def refit(self, meter_source: str) -> OverheadCalibration | NotIdentifiable:
        gpu = [g for g, _ in self._samples]
        facility = [f for _, f in self._samples]
        fit = (
            fit_overhead(
                gpu,
                facility,
                period_s=self.settings.meter_period_s,
                window_s=self.settings.calibration_window_s,
                settle_s=self.settings.calibration_settle_s,
                averaging_s=self.settings.meter_averaging_s,
            )
            if len(gpu) >= 2
            else NotIdentifiable("no samples yet")
        )
        if isinstance(fit, NotIdentifiable):
            self.last_attempt = fit.reason
            return fit
        now = self.clock.now()
        with self.store.session() as s:
            repo.add_calibration(s, fit=fit, meter_source=meter_source, at=now)
            s.commit()
        self.last_attempt = None
        self._model = OverheadModel(
            fit.k, fit.k_stderr, fit.static_kw, "calibrated", fit.points, now, fit.path
        )
        log.info(
            "overhead calibrated: k %.3f +- %.3f, static %.1f kW; meter path: dead %.1f s, "
            "tau %.1f s (%s)",
            fit.k,
            fit.k_stderr,
            fit.static_kw,
            fit.path.dead_s,
            fit.path.tau_s,
            fit.path.source,
        )
        for listener in self._listeners:
            listener()
        return fit
