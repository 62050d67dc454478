"""The load a replayed site draws besides what the gateway caps (`flexgate.replay`).

A facility's meter reads its GPU cluster and everything else: cooling that follows the day's
heat, offices, lighting. `LoadShape` is that, on the site's clock: `cluster_kw` (the GPU
cluster with its own static load, as the simulated site draws it uncapped) plus `other_kw`
scaled by a daily cycle (lowest at 03:00, highest at 15:00 local), each day's level drawn
(a few per cent apart, as weather moves it), lower on weekends and holidays (the cluster too:
fewer jobs run), and noise on each sample.

The replay synthesises quiet days from `kw` directly; during an event the gateway's loop runs
the simulated cluster and the meter reads it plus `other_at` (the part the caps do not touch).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from datetime import date, datetime
from zoneinfo import ZoneInfo

import numpy as np

PEAK_HOUR = 15.0  #: the daily cycle's peak, local time [h]
SWING = 0.6  #: the other load's daily swing, as a share of `other_kw` (trough 0.7, peak 1.3)
OFF_DAY_CLUSTER = 0.85  #: the cluster's load on weekends and holidays, as a share
OFF_DAY_OTHER = 0.6  #: the other load on weekends and holidays, as a share
DAY_SPREAD = 0.03  #: one standard deviation of a day's level, as a share


@dataclass(frozen=True)
class LoadShape:
    """The site's load on the clock of `zone` [kW]; `seed` draws each day's level."""

    cluster_kw: float
    other_kw: float
    zone: ZoneInfo
    holidays: frozenset[date] = frozenset()
    noise_kw: float = 0.0
    seed: int = 0
    _levels: dict[date, float] = field(default_factory=dict, compare=False, repr=False)

    def off_day(self, day: date) -> bool:
        return day.weekday() >= 5 or day in self.holidays

    def day_level(self, day: date) -> float:
        """The day's level, drawn once from the seed and the day."""
        if day not in self._levels:
            rng = np.random.default_rng([self.seed, zlib.crc32(day.isoformat().encode())])
            self._levels[day] = 1.0 + float(rng.normal(0.0, DAY_SPREAD))
        return self._levels[day]

    def other_at(self, at: datetime) -> float:
        """The load besides the cluster at `at` (no noise) [kW]."""
        local = at.astimezone(self.zone)
        hour = local.hour + local.minute / 60 + local.second / 3600
        cycle = 0.5 * (1 - math.cos(2 * math.pi * (hour - PEAK_HOUR + 12) / 24))
        kw = self.other_kw * (1 - SWING / 2 + SWING * cycle) * self.day_level(local.date())
        return kw * (OFF_DAY_OTHER if self.off_day(local.date()) else 1.0)

    def kw(self, at: datetime) -> float:
        """The site's load at `at` with nothing capped (no noise) [kW]."""
        day = at.astimezone(self.zone).date()
        cluster = self.cluster_kw * (OFF_DAY_CLUSTER if self.off_day(day) else 1.0)
        return cluster + self.other_at(at)

    def sample(self, at: datetime, rng: np.random.Generator) -> float:
        """A meter reading of the uncapped site at `at` [kW]."""
        noise = float(rng.normal(0.0, self.noise_kw)) if self.noise_kw else 0.0
        return self.kw(at) + noise
