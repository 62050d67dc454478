"""Flexibility tiers: how much slowdown a job's owner tolerates, as the allocator's bounds.

A job tagged with tier `t` tolerates the slowdown `s = slowdowns[t]` (by default 0, 10, 25 and
50 % for tiers 0 to 3). That becomes its floor `min_throughput_fraction`:

- `throughput` reading (the default): the job keeps at least `1 - s` of its throughput, so
  tier 3 keeps at least half;
- `duration` reading: the job may take `1 + s` times as long, so it keeps `1 / (1 + s)`.

A tier that tolerates no slowdown is protected: never capped. A job's own
`min_throughput_fraction` or `protected` still applies when it is stricter than its tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmodel.errors import InvalidJobError

DEFAULT_SLOWDOWNS = (0.0, 0.10, 0.25, 0.50)
READINGS = ("throughput", "duration")


@dataclass(frozen=True)
class TierTable:
    slowdowns: tuple[float, ...] = DEFAULT_SLOWDOWNS  #: tolerated slowdown per tier, tier 0 first
    reading: str = "throughput"  #: how a slowdown becomes a floor: `throughput` or `duration`

    def __post_init__(self) -> None:
        if self.reading not in READINGS:
            raise InvalidJobError(
                f"tiers: the reading must be one of {', '.join(READINGS)}, got {self.reading!r}"
            )
        if not self.slowdowns:
            raise InvalidJobError("tiers: give at least one tier")
        for tier, s in enumerate(self.slowdowns):
            if not 0.0 <= s <= 1.0:
                raise InvalidJobError(
                    f"tiers: tier {tier} tolerates a slowdown of {s:g}; it must be a fraction "
                    "from 0 to 1 (0.25 for 25 %)"
                )
        if list(self.slowdowns) != sorted(self.slowdowns):
            raise InvalidJobError(
                "tiers: each tier must tolerate at least the slowdown of the tier before it"
            )

    @property
    def count(self) -> int:
        return len(self.slowdowns)

    def floor(self, tier: int) -> float:
        """The least share of its throughput a job of `tier` keeps."""
        s = self.slowdowns[tier]
        return 1.0 - s if self.reading == "throughput" else 1.0 / (1.0 + s)

    def protected(self, tier: int) -> bool:
        """A tier that tolerates no slowdown is never capped."""
        return self.slowdowns[tier] == 0.0

    def rows(self) -> list[dict[str, float | int | bool]]:
        """The table as shown by the API: per tier its slowdown, floor and protection."""
        return [
            {
                "tier": t,
                "slowdown": s,
                "min_throughput_fraction": round(self.floor(t), 6),
                "protected": self.protected(t),
            }
            for t, s in enumerate(self.slowdowns)
        ]


DEFAULT_TIERS = TierTable()
