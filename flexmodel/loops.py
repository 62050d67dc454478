"""A site's control loops, their phase-locking verdicts, and phase scattering (docs/sync.md).

The loops of a flexgate site, each with its own delay and measurement window:

1. `firmware`: each GPU's power cap, enforced by the GPU from its own power within
   milliseconds. It couples no jobs: always safe.
2. `agent-node-budget`: an agent holding a node budget (rather than per-GPU caps) couples the
   jobs sharing the node; its delay is the agent's measured actuation delay.
3. `gateway`: the site loop (`gateway.services.tracking`), the one loop that moves caps on
   what the meter reads, as it runs: its `loopresponse.ClosedLoopResponse` (sample period,
   window, the meter path, the Smith predictor, its gain, the measured actuation), so every
   verdict on it comes from its closed-loop response. Reconciliation only sends the same caps
   again: it reads no power and couples nothing.

Each loop carries its frequency response (`loopresponse.LoopResponse` for the open loops,
`loopresponse.ClosedLoopResponse` for the site loop).

`scatter` plans the mitigation: small per-job cap offsets that spread iteration rates beyond
the locking range of every attractive harmonic, and splay phase offsets, with their cost.
`detune` applies a spread to an allocation the gateway is about to send: per-job rate offsets
within each job's power bounds (QoS floor, protection), at the same total power when asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.curves import Array, cap_for_power, power_for_throughput, throughput_at_power
from flexmodel.errors import FlexModelError
from flexmodel.jobs import Job, JobMix
from flexmodel.loopresponse import ClosedLoopResponse, LoopResponse
from flexmodel.problem import AllocationProblem
from flexmodel.sync import (
    DEFAULT_GAIN_PER_S,
    HARMONICS,
    MIN_DUTY,
    Analysis,
    analyse_loop,
    critical_coupling_per_s,
    finite_or_none,
    rate_coupling_per_s,
    worst_verdict,
)

FIRMWARE_DELAY_S = 0.05


@dataclass(frozen=True)
class ControlLoop:
    name: str
    response: LoopResponse | ClosedLoopResponse  #: as it runs, for a sampled loop
    couples_jobs: bool

    def evaluate(
        self,
        period_s: ArrayLike,
        duty: ArrayLike,
        *,
        gain_per_s: ArrayLike = DEFAULT_GAIN_PER_S,
        spread: float = 0.0,
    ) -> dict[str, Any]:
        """This loop's verdict on the jobs it touches, and its delay against their half periods.

        `gain_per_s` [rad/s]: the coupling at the fundamental per unit of the loop's response,
        one for all jobs or one per job (`sync.rate_coupling_per_s` from their swing and rate
        per watt, so the loop's own gains are its real ones)."""
        periods = np.atleast_1d(np.asarray(period_s, dtype=float))
        delays = np.asarray(self.response.delay_samples_s or [self.response.delay_s])
        base = {
            "name": self.name,
            "delay_s": self.response.delay_s,
            "delay_p99_s": float(np.percentile(delays, 99)),
            "delays_measured": len(self.response.delay_samples_s),
            "window_s": self.response.window_s,
            "couples_jobs": self.couples_jobs,
            "shortest_half_period_s": float(periods.min() / 2) if periods.size else None,
        }
        if not self.couples_jobs or periods.size == 0:
            return base | {"verdict": "safe", "max_safe_delay_s": None}
        # Jobs alike (period, duty, coupling) are judged once: a site's jobs share few periods.
        rows = np.column_stack(
            np.broadcast_arrays(periods, np.asarray(duty, float), np.asarray(gain_per_s, float))
        )
        unique = np.unique(rows, axis=0)
        result = analyse_loop(
            unique[:, 0],
            unique[:, 1],
            self.response,
            unit_coupling_per_s=unique[:, 2],
            spread=spread,
        )
        pulls = np.where(result.attractive & result.significant, result.coupling_per_s, 0.0)
        return base | {
            "verdict": worst_verdict(result.verdict),
            "max_safe_delay_s": finite_or_none(result.max_safe_delay_s.min()),
            #: the strongest attraction on any significant harmonic of any job [rad/s]
            "coupling_per_s": float(pulls.max()),
        }


def combine_delays(stages: Sequence[ArrayLike], points: int = 8) -> tuple[float, ...]:
    """The distribution of a delay made of independent stages (dispatch, actuation, a meter's
    age), each given by measured samples: every sum of one point from each stage, each stage
    cut to `points` evenly spaced quantiles (so at most `points ** len(stages)` sums)."""
    total = np.zeros(1)
    for stage in stages:
        samples = np.asarray(stage, dtype=float).ravel()
        if samples.size == 0:
            continue
        if samples.size > points:
            samples = np.quantile(samples, (np.arange(points) + 0.5) / points)
        total = (total[:, None] + samples[None, :]).ravel()
    return tuple(float(v) for v in total)


def site_loops(
    *,
    site_loop: ClosedLoopResponse | None,
    agent_delay_s: float | None = None,
    agent_window_s: float = 0.0,
) -> list[ControlLoop]:
    """The loops of a site: the firmware's, the agent's only when agents hold node budgets, and
    the site loop (`gateway`) as it runs, where there is one."""
    loops = [ControlLoop("firmware", LoopResponse(FIRMWARE_DELAY_S), couples_jobs=False)]
    if agent_delay_s is not None:
        agent = LoopResponse(agent_delay_s, agent_window_s)
        loops.append(ControlLoop("agent-node-budget", agent, couples_jobs=True))
    if site_loop is not None:
        loops.append(ControlLoop("gateway", site_loop, couples_jobs=True))
    return loops


def job_unit_coupling(jobs: Sequence[Job], period_s: ArrayLike, overhead_factor: float) -> Array:
    """Each job's coupling per unit of the site loop's response [rad/s], at its worst: its whole
    swing read at the meter, and the whole correction on its own caps (its relative throughput
    loss per watt at the facility, from its curve's steepest part: 1 / power at the floor
    cap). A job with no placement gets no caps: none."""
    k = overhead_factor
    swing, rate, duties = [], [], []
    for job in jobs:
        compute_w = job.power_w / (job.duty + (1 - job.duty) * job.comm_power_fraction)
        swing.append(k * job.gpus * compute_w * (1 - job.comm_power_fraction))
        rate.append(1.0 / (k * job.gpus * max(job.min_cap_w, 1.0)) if job.placement else 0.0)
        duties.append(job.duty)
    return rate_coupling_per_s(period_s, duties, swing_w=np.array(swing), rate_per_w=rate)


def required_spread(result: Analysis) -> float:
    """The rate spread (fraction of the rate, Lorentzian half-width) at which no significant
    harmonic of any job attracts beyond its critical coupling (`sync.critical_coupling_per_s`,
    solved for the spread by bisection: it grows monotonically with the spread)."""
    jobs, index = np.nonzero(result.attractive & result.significant)
    if jobs.size == 0:
        return 0.0
    target = result.coupling_per_s[jobs, index]
    m = HARMONICS[index].astype(float)
    w = 2.0 * np.pi / result.period_s[jobs]
    tau = result.loop.effective_delay_s
    lo, hi = np.zeros_like(target), np.ones_like(target)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = critical_coupling_per_s(m, mid * w, tau) < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return float(hi.max())


def scatter(
    mix: JobMix,
    loop: ControlLoop,
    *,
    gain_per_s: float = DEFAULT_GAIN_PER_S,
    spread: float = 0.0,
    budget_fraction: float = 0.02,
) -> dict[str, Any]:
    """Per-job cap offsets (detuning) and splay phase offsets that keep `loop` from locking.

    Rates can only be lowered by caps, so jobs are slowed by evenly spaced fractions in
    `[0, 2 * delta]`. A uniform spread of half-width `delta` has critical coupling `4 delta/pi`
    (Kuramoto) against `2 gamma` for a Lorentzian of half-width `gamma`, so
    `delta = (pi / 2) * gamma_needed`, less the spread the jobs already have. The largest
    offsets go to the jobs with the least throughput (the cheapest order). Each job's cap is the
    one its curve gives for the slower throughput. `feasible` is whether the cost stays within
    `budget_fraction` of the site's throughput.
    """
    if not 0.0 <= budget_fraction <= 1.0:
        raise FlexModelError("budget_fraction must lie in [0, 1]")
    jobs = mix.jobs
    if not jobs:
        return {
            "loop": loop.name,
            "required_spread": 0.0,
            "jobs": [],
            "throughput_cost": 0.0,
            "throughput_cost_fraction": 0.0,
            "feasible": True,
        }
    needed = _spread_needed(mix, loop, gain_per_s, spread)
    half_width = max(np.pi / 2.0 * (needed - spread), 0.0)
    order = np.argsort(mix.curves.uncapped_throughput)  # least throughput first
    slow = np.zeros(len(jobs))
    if half_width > 0 and len(jobs) > 1:
        slow[order] = np.linspace(2.0 * half_width, 0.0, len(jobs))
    curves = mix.curves
    before = curves.uncapped_throughput
    floor_power = power_for_throughput(curves, (1.0 - slow) * before)
    caps = cap_for_power(curves, floor_power)
    cost = float((slow * before).sum())
    splay = 2.0 * np.pi * np.arange(len(jobs)) / len(jobs)
    return {
        "loop": loop.name,
        "required_spread": needed,
        "jobs": [
            {
                "id": job.id,
                "rate_offset": -float(slow[j]),
                "cap_w": float(caps[j]),
                "phase_offset_rad": float(splay[j]),
            }
            for j, job in enumerate(jobs)
        ],
        "throughput_cost": cost,
        "throughput_cost_fraction": cost / float(before.sum()) if before.sum() else 0.0,
        "feasible": cost <= budget_fraction * float(before.sum()),
    }


def _spread_needed(mix: JobMix, loop: ControlLoop, gain_per_s: float, spread: float) -> float:
    """The Lorentzian half-width (relative) the mix's jobs need so that `loop` locks none of
    them (0 for a loop that couples no jobs)."""
    result = analyse_loop(
        mix.array("period_s"),
        np.clip(mix.array("duty"), MIN_DUTY, 1 - MIN_DUTY),
        loop.response,
        unit_coupling_per_s=gain_per_s,
        spread=spread,
    )
    return required_spread(result) if loop.couples_jobs else 0.0


@dataclass(frozen=True)
class Detuning:
    """An allocation with its jobs' rates spread (`detune`); per job, whole-job figures."""

    power_w: np.ndarray  #: (J,) mean power per GPU [W]
    cap_w: np.ndarray  #: (J,) the caps that give it [W]
    throughput: np.ndarray  #: (J,) [tokens/s]
    rate_offset: np.ndarray  #: (J,) relative change of each job's rate (< 0: slower)
    throughput_cost: float  #: throughput lost against the allocation [tokens/s]
    power_change_w: float  #: total power against the allocation [W] (< 0: less)


def detune(
    problem: AllocationProblem, power_w: ArrayLike, half_width: float, *, hold_power: bool
) -> Detuning:
    """Spread the iteration rates of an allocation (`power_w` per GPU) by `half_width`.

    A job's rate is its throughput over its tokens per iteration, so a rate offset `o` moves
    its throughput to `(1 + o)` times the allocation's, within its power bounds
    (`problem.lo_w` to uncapped: QoS floors and protected jobs hold). The offsets are evenly
    spaced over `2 * half_width`, the slowest to the jobs with the least throughput, as in
    `scatter`: they lie in `[-2 half_width, 0]`, as caps can only slow. With `hold_power` the
    jobs already capped below their uncapped power are all sped up by one more offset, found by
    bisection, so that the total power stays the allocation's as far as the bounds let: they
    pay for the slowed ones, and the spread between the jobs is kept.
    """
    if not 0.0 <= half_width <= 0.5:
        raise FlexModelError(f"half_width must lie in [0, 0.5], got {half_width!r}")
    curves, gpus = problem.curves, problem.gpus
    power = np.asarray(power_w, dtype=float)
    before = throughput_at_power(curves, power)
    lowest = throughput_at_power(curves, problem.lo_w)
    highest = curves.uncapped_throughput
    movable = np.flatnonzero(highest - lowest > 1e-9 * np.maximum(highest, 1.0))
    base = np.zeros(len(power))
    if movable.size > 1 and half_width > 0:
        order = movable[np.argsort(highest[movable])]  # least throughput first: slowed most
        base[order] = np.linspace(-2.0 * half_width, 0.0, order.size)

    still = np.ones(len(power), dtype=bool)
    still[movable] = False
    below_uncapped = before < highest * (1.0 - 1e-9)

    def place(shift: float) -> tuple[np.ndarray, np.ndarray]:
        offset = np.where(still, 0.0, base + np.where(below_uncapped, shift, 0.0))
        x = np.clip(before * (1.0 + offset), np.minimum(lowest, before), highest)
        return x, np.where(still, power, power_for_throughput(curves, x))

    def power_change_w(shift: float) -> float:
        return float((gpus * (place(shift)[1] - power)).sum())

    shift = 0.0
    if hold_power and movable.size > 1 and half_width > 0:
        lo, hi = 0.0, 1.0
        if power_change_w(hi) < 0.0:
            shift = hi  # the bounds let no more: the rest is the power change reported
        else:
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if power_change_w(mid) < 0.0 else (lo, mid)
            shift = hi
    throughput, placed = place(shift)
    with np.errstate(divide="ignore", invalid="ignore"):
        offset = np.where(before > 0, throughput / before - 1.0, 0.0)
    return Detuning(
        power_w=placed,
        cap_w=cap_for_power(curves, placed),
        throughput=throughput,
        rate_offset=offset,
        throughput_cost=float((before - throughput).sum()),
        power_change_w=float((gpus * (placed - power)).sum()),
    )


#: `unlocking_spread`'s factor over the onset (the simulator's unlocking starts within 10% of
#: `pi K / 4`: `tests/flexmodel/test_scattering_sizing.py`).
UNLOCK_MARGIN = 1.25


def unlocking_spread(coupling_per_s: float, period_s: float, *, delay_s: float = 0.0) -> float:
    """The rate spread (`detune`'s half-width, a fraction of the rate) that unlocks a fleet
    held together by a loop's attraction `coupling_per_s` [rad/s] on jobs of `period_s`.

    `detune` spaces the offsets evenly: a uniform spread of half-width `D = spread * w`. A
    Lorentzian spread unlocks above `2 gamma = K`, but a fleet already locked under a uniform
    spread stays locked until `D > pi K / 4` (the Kuramoto model's locking boundary for a
    uniform distribution: the slowest and fastest jobs' offset equals the pull `K r` with
    `r = pi / 4` at the boundary). The margin: `UNLOCK_MARGIN`, and the delay's decoherence
    factor `exp(D tau)` as in `sync.critical_coupling_per_s`."""
    if not (coupling_per_s >= 0 and period_s > 0 and delay_s >= 0):
        raise FlexModelError("coupling_per_s and delay_s must be at least 0, period_s positive")
    onset_per_s = np.pi * coupling_per_s / 4.0
    w = 2.0 * np.pi / period_s
    return float(UNLOCK_MARGIN * onset_per_s * np.exp(onset_per_s * delay_s) / w)


def locked_coupling_per_s(r1: float, spread: float, period_s: float) -> float | None:
    """The coupling [rad/s] that holds a fleet at order `r1` under `detune`'s uniform spread
    of half-width `spread` (a fraction of the rate) on jobs of `period_s`; None where `r1`
    says nothing (no spread, or a fleet not locked: `r1` below `pi / 4`).

    A fully locked Kuramoto fleet under a uniform spread of half-width `D` [rad/s] holds at
    `r = f(x) = (sqrt(1 - x^2) + arcsin(x) / x) / 2`, `x = D / (K r)`: from 1 at no spread
    to `pi / 4` at the boundary. So `r1` measured under a known spread gives `x`, and
    `K = D / (x r1)`: how hard the loop pulls, whatever pulls it."""
    if not (spread > 0 and period_s > 0) or not np.pi / 4 <= r1 < 1.0:
        return None
    x_grid = np.linspace(1e-6, 1.0, 4001)
    f = (np.sqrt(1.0 - x_grid**2) + np.arcsin(x_grid) / x_grid) / 2.0  # falls from 1 to pi/4
    x = float(np.interp(r1, f[::-1], x_grid[::-1]))
    d_per_s = spread * 2.0 * np.pi / period_s
    return d_per_s / (x * r1)
