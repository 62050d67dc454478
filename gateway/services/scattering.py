"""Phase scattering: when the jobs lock, spread their rates until they come apart.

After every watch of the jobs' phases (each reconciliation) the scatterer looks at the fleet:

- **Starts** when the Rayleigh alarm has been held over its confirmation time (three windows)
  on any harmonic, when the fleet is at risk (some `r_m` above the Rayleigh threshold while
  a loop that couples the jobs is `at-risk` or `unsafe` by the sync analysis), or when the
  site's oscillation is above its limit (`gateway.services.oscillation`, checked first).
  From then on every plan spreads the jobs' rates by `scatter_spread`
  (`Targets.spread_rates`, applied by `flexmodel.loops.detune`): small per-job cap offsets
  within each job's bounds (QoS floor, protected jobs untouched); during an event the total
  stays at the target (the slowed jobs pay for the sped-up ones), outside one caps can only
  slow.
- **Widens** the spread while the fleet stays above the threshold for as long as the spread
  needs to pull the most detuned jobs a whole cycle apart (`T / (2 spread)`, T the longest
  measured period): a loop that still binds them. To the spread the coupling asks: a fleet
  locked under a uniform spread holds at an `r1` that says how hard it is pulled
  (`flexmodel.loops.locked_coupling_per_s`), and `unlocking_spread` sizes the spread to it
  (about `pi K / 4`, with a margin for the site loop's delay); doubling where `r1` tells
  nothing or the estimate asks for no more. Up to `scatter_max_spread` (the QoS floors bound
  each job's offset in `detune`).
- **Ends** once every `r_m` has been below the threshold for the confirmation time, no loop
  that couples the jobs attracts any more (`safe`) and the oscillation is within its limit:
  under a loop that still attracts, the offsets are what keeps the jobs apart, so they stay.

Each episode keeps its reason, start, end, spread and throughput cost (by the job curves, as
each plan states it); `doc()` is `GET /v1/sync`'s `scattering`. Below 8 jobs the Rayleigh test
is useless and the pairwise phase-locking values stand in; scattering does not act on them
(only on the oscillation's alarm).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from flexmodel.loops import locked_coupling_per_s, unlocking_spread
from flexmodel.phases import MIN_JOBS_FOR_RAYLEIGH, order_parameters, rayleigh_threshold
from flexmodel.sync import VERDICTS, worst_verdict
from gateway.clock import Clock
from gateway.services.fleet import Fleet
from gateway.services.oscillation import OscillationWatch
from gateway.services.targets import Targets
from gateway.services.tracking import Tracker
from gateway.settingsgroups.loop import SyncSettings
from gateway.store.models import iso

log = logging.getLogger("flexgate.gateway")
#: Ended episodes kept for `GET /v1/sync`.
EPISODES_KEPT = 10
#: After a spread sized to the coupling, this many dephasing times before it is widened again:
#: at `UNLOCK_MARGIN` above the onset the slowest jobs slip a cycle in about 3.3 of them (their
#: drift is `sqrt(D^2 - D_c^2)`, `D_c = pi K / 4`: 0.6 D at D = 1.25 D_c).
SIZED_WAIT = 4.0
#: Verdicts under which a loop still pulls the jobs together.
ATTRACTING = ("at-risk", "unsafe")


@dataclass
class Episode:
    reason: str
    started: str  #: ISO time
    rate_spread: float  #: the half-width of the rate offsets now
    order_at_start: dict[str, float]
    ended: str | None = None
    order_at_end: dict[str, float] | None = None
    watches: int = 0  #: watches of the phases since it started
    throughput_cost: float = 0.0  #: the last plan's, by the job curves [tokens/s]
    throughput_cost_fraction: float = 0.0  #: of the site's uncapped throughput
    widened: list[float] = field(default_factory=list)  #: the spreads it was widened to
    #: the coupling the spread was last sized to, from r1 under the spread [rad/s]
    coupling_per_s: float | None = None
    sized: bool = False  #: the spread now is sized to the coupling (not doubled)


class Scatterer:
    def __init__(
        self,
        settings: SyncSettings,
        clock: Clock,
        fleet: Fleet,
        targets: Targets,
        tracker: Tracker,
        oscillation: OscillationWatch,
    ) -> None:
        self.settings, self.clock = settings, clock
        self.fleet, self.targets, self.tracker = fleet, targets, tracker
        self.oscillation = oscillation
        self.mode = settings.scatter  #: `auto` or `off` (the lab switches it on a running site)
        self.episode: Episode | None = None  #: the one under way
        self.ended: deque[Episode] = deque(maxlen=EPISODES_KEPT)
        self._clear = 0  #: watches in a row with every r_m below the threshold
        self._spread_at = 0.0  #: when the spread last changed (monotonic) [s]

    def loop_verdict(self) -> str:
        """The worst verdict of the loops that couple the jobs now: the site loop while it
        pursues an event, and the gateway's loops in the last plan."""
        plan = self.targets.last_plan
        verdicts = [str(plan["sync"]["verdict"])] if plan else []
        loop_verdict = self.tracker.config.verdict
        if self.tracker.pursuit is not None and loop_verdict in VERDICTS:
            verdicts.append(str(loop_verdict))  # a held loop does not act: it pulls none
        return worst_verdict(verdicts)

    async def step(self) -> None:
        """After a watch of the phases: check the oscillation; start, widen or end scattering."""
        await self.oscillation.check()
        oscillating = self.oscillation.alarm_reason()
        phases = list(self.fleet.phases.values())
        if self.mode == "off" or not phases:
            return
        if len(phases) < MIN_JOBS_FOR_RAYLEIGH and oscillating is None and self.episode is None:
            return
        alarm = self.fleet.alarm
        r1, r2, r3 = (float(r) for r in order_parameters(phases))
        order = {"r1": r1, "r2": r2, "r3": r3}
        limit = rayleigh_threshold(len(phases), alarm.false_alarm)
        above = [m for m, r in enumerate(order.values(), start=1) if r > limit]
        verdict = self.loop_verdict()
        episode = self.episode
        if episode is None:
            reason = oscillating or self._reason(above, order, limit, verdict)
            if reason is not None:
                await self._start(reason, order)
            return
        episode.watches += 1
        if above:
            self._clear = 0
            widest = self.settings.scatter_max_spread
            waited_s = self.clock.monotonic() - self._spread_at
            if waited_s >= self._dephasing_s(episode) and episode.rate_spread < widest:
                sized = self._sized_spread(episode, r1)
                episode.sized = sized > episode.rate_spread
                grown = sized if episode.sized else 2 * episode.rate_spread
                episode.rate_spread = min(grown, widest)
                episode.widened.append(episode.rate_spread)
                self._spread_at = self.clock.monotonic()
                log.warning(
                    "scattering: still locked (r1 %.2f, coupling %s rad/s), spread widened to %g",
                    r1,
                    "?" if episode.coupling_per_s is None else f"{episode.coupling_per_s:.3g}",
                    episode.rate_spread,
                )
                await self.targets.spread_rates(episode.rate_spread)
        else:
            self._clear += 1
            calm = oscillating is None
            if self._clear >= alarm.hold and verdict not in ATTRACTING and calm:
                await self._end(order)
                return
        if not self.targets.holding and not self.targets.recovering:
            await self.targets.spread_rates(episode.rate_spread)  # an event ended meanwhile
        self._note_cost(episode)

    def _reason(
        self, above: list[int], order: dict[str, float], limit: float, verdict: str
    ) -> str | None:
        alarm = self.fleet.alarm
        held = [m for m, streak in enumerate(alarm.streak, start=1) if streak >= alarm.hold]
        if held:
            return (
                f"Rayleigh alarm on harmonic {', '.join(map(str, held))} held for "
                f"{alarm.hold} windows: {_orders(order)} above {limit:.3f}"
            )
        if above and verdict in ATTRACTING:
            return (
                f"at risk: {_orders(order)}, harmonic {', '.join(map(str, above))} above "
                f"{limit:.3f}, under a loop the sync analysis finds {verdict}"
            )
        return None

    async def _start(self, reason: str, order: dict[str, float]) -> None:
        spread = self.settings.scatter_spread
        self.episode = Episode(reason, iso(self.clock.now()) or "", spread, order)
        self._clear, self._spread_at = 0, self.clock.monotonic()
        log.warning("scattering: %s; rates spread by %g", reason, spread)
        await self.targets.spread_rates(spread)
        self._note_cost(self.episode)

    async def _end(self, order: dict[str, float]) -> None:
        episode = self.episode
        assert episode is not None
        episode.ended, episode.order_at_end = iso(self.clock.now()), order
        self.ended.append(episode)
        self.episode = None
        log.warning("scattering ended: %s", _orders(order))
        await self.targets.spread_rates(0.0)

    def _sized_spread(self, episode: Episode, r1: float) -> float:
        """The spread that unlocks the coupling holding the fleet (`flexmodel.loops`): the
        coupling from how far the spread in force has loosened it (`locked_coupling_per_s`),
        the spread from that (`unlocking_spread`, a margin for the site loop's delay); 0 where
        `r1` tells nothing (the doubling then stands). Noted on the episode."""
        periods = self.fleet.loop_measurements().periods_s.values()
        longest_s = max(periods, default=0.0)
        coupling = locked_coupling_per_s(r1, episode.rate_spread, longest_s)
        episode.coupling_per_s = coupling
        if coupling is None:
            return 0.0
        config = self.tracker.config
        delay_s = config.delay_s + (config.window_s + config.period_s) / 2.0
        return unlocking_spread(coupling, longest_s, delay_s=delay_s)

    def _dephasing_s(self, episode: Episode) -> float:
        """How long the spread takes to move the most detuned jobs a cycle apart [s]."""
        periods = self.fleet.loop_measurements().periods_s.values()
        wait = SIZED_WAIT if episode.sized else 1.0
        return wait * max(periods, default=0.0) / (2.0 * episode.rate_spread)

    def _note_cost(self, episode: Episode) -> None:
        scattering = (self.targets.last_plan or {}).get("scattering")
        if scattering:
            episode.throughput_cost = float(scattering["throughput_cost"])
            episode.throughput_cost_fraction = float(scattering["throughput_cost_fraction"])

    def doc(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "active": self.episode is not None,
            "episode": asdict(self.episode) if self.episode else None,
            "ended": [asdict(e) for e in self.ended],
        }


def _orders(order: dict[str, float]) -> str:
    return ", ".join(f"{name} = {value:.3f}" for name, value in order.items())
