"""`flexgate lab --scenario lock`: a site loop that makes jobs phase-lock, and what undoes it.

64 identical-looking training jobs (T = 2 s within 0.3%, d = 1/2, one GPU each, eight to a
simulated node) under the gateway's own services on a stepped clock (`flexgate.lab.simsite`): the
facility meter reads the GPUs' instantaneous power a dead time late, the agents sample their
GPUs and the gateway measures the jobs' phases. An event asks for 10% of the site; three runs:

1. **unsafe loop**: the site loop deliberately inside the attractive window
   (`FLEXGATE_LOOP_UNSAFE`, lab only): a short window, a high gain, and the meter's delay the
   closed-loop analysis of the site loop finds most attractive (`attractive_delay_s`).
   Nothing in the code makes the jobs lock; the loop does, through the simulated GPUs'
   physics (a cap slows a job only while it computes). r1 rises towards 1 and the swing
   ratio towards sqrt(N).
2. **default loop**: the same jobs and meter under the gateway's default, checked loop (its
   window of four periods puts the jobs' harmonics on the sinc's zeros): they stay apart.
3. **scattering**: run 1's locked site goes on with scattering switched on
   (`FLEXGATE_SCATTER=auto`): the jobs' rates are spread and they unlock, under the same loop.

Each run records the true order parameters r1..r3 (from the simulated jobs' phases), the true
facility power (for its spectrum and the swing ratio) and the jobs' true throughput.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flexgate.lab.simsite import SimulatedSite, Truth
from flexmodel.loopresponse import ClosedLoopResponse
from flexmodel.phases import order_parameters, rayleigh_threshold

JOBS = 64
GPUS_PER_NODE = 8
PERIOD_S = 2.0
DUTY = 0.5
#: The jobs' own rate spread: uniform within this fraction of the period
JOB_SPREAD = 0.003
OVERHEAD_FACTOR = 1.3
REDUCTION = 0.1
METER_PERIOD_S = 0.2
SAMPLE_HZ = 10.0
RECONCILE_S = 2.0
WARM_UP_S = 10.0
#: The unsafe loop: a two-sample window and a gain taking the whole error each sample (at 0.5
#: the same loop had not locked them after 80 s)
UNSAFE_WINDOW_S = 0.4
UNSAFE_GAIN = 1.0
#: Scattering in the lab starts wider and widens further than the gateway's defaults: the
#: unsafe loop pulls much harder than any loop the gateway would run.
LAB_SCATTER_SPREAD = 0.04
LAB_SCATTER_MAX_SPREAD = 0.16
#: The swing ratio and the order parameters at the end are taken over the run's last share
SETTLED_SHARE = 0.25


def lock_jobs(count: int = JOBS, seed: int = 7) -> list[dict[str, Any]]:
    """`count` one-GPU jobs of one type, periods within `JOB_SPREAD` of `PERIOD_S`."""
    rng = np.random.default_rng(seed)
    return [
        {
            "id": f"lock-{k:03d}",
            "gpus": 1,
            "power_w": 600.0,
            "throughput": 4000.0,
            "pfi": 1.3,
            "period_s": round(PERIOD_S * (1 + float(rng.uniform(-JOB_SPREAD, JOB_SPREAD))), 5),
            "duty": DUTY,
            "comm_power_fraction": 0.4,
            "placement": [
                {"node": f"node-{k // GPUS_PER_NODE + 1:02d}", "gpus": [k % GPUS_PER_NODE]}
            ],
        }
        for k in range(count)
    ]


def attractive_delay_s(
    period_s: float,
    duty: float,
    *,
    window_s: float,
    hold_s: float,
    integral_gain_per_s: float,
    actuation_s: float = 0.0,
) -> float:
    """The meter's dead time [s] within one period at which the site loop as it runs (sampled
    every `hold_s`, a window of readings, the Smith predictor, `integral_gain_per_s`: the
    `flexmodel.loopresponse.ClosedLoopResponse`) attracts the fundamental most. The predictor takes
    the loop's own moves out of the delay, not the jobs' swing: that reaches the correction
    through the meter's dead time, so the dead time still places the loop's phase."""
    delays = np.linspace(0.0, period_s, 401)[:-1]
    w = 2.0 * np.pi / period_s
    pull = [
        float(
            np.imag(
                ClosedLoopResponse(
                    period_s=hold_s,
                    gain=integral_gain_per_s * hold_s,
                    window_s=window_s,
                    dead_s=float(d),
                    actuation_s=actuation_s,
                ).response(w)
            )
        )
        for d in delays
    ]
    return float(delays[int(np.argmax(pull))])


@dataclass
class LockRun:
    name: str
    time_s: list[float] = field(default_factory=list)
    order: list[list[float]] = field(default_factory=list)  #: r1..r3 at each sample
    facility_kw: list[float] = field(default_factory=list)  #: true, instantaneous
    job_w: list[list[float]] = field(default_factory=list)  #: each job's power
    throughput: list[float] = field(default_factory=list)  #: the jobs' total, true
    loop: dict[str, Any] = field(default_factory=dict)
    scattering: dict[str, Any] = field(default_factory=dict)
    measured_order: dict[str, Any] | None = None  #: what the gateway measured at the end

    def summary(self) -> dict[str, Any]:
        """The run's figures over its settled last part (`SETTLED_SHARE`)."""
        order = np.array(self.order)
        start = int(len(order) * (1 - SETTLED_SHARE))
        site = np.array(self.facility_kw[start:])
        jobs = np.array(self.job_w[start:])
        incoherent = float(np.sqrt(jobs.var(axis=0).sum())) * OVERHEAD_FACTOR / 1000.0
        return {
            "name": self.name,
            "order_parameters": dict(
                zip(("r1", "r2", "r3"), order[start:].mean(axis=0).tolist(), strict=True)
            ),
            "final": dict(zip(("r1", "r2", "r3"), order[-1].tolist(), strict=True)),
            "swing_ratio": float(site.std() / incoherent) if incoherent else 0.0,
            "throughput": float(np.mean(self.throughput[start:])),
            "loop": self.loop,
            "scattering": self.scattering,
            "measured_order": self.measured_order,
        }


def spectrum(
    facility_kw: list[float], period_s: float = METER_PERIOD_S
) -> tuple[np.ndarray, np.ndarray]:
    """The power spectral density of facility power, its mean removed: (frequencies [Hz],
    density [kW^2/Hz])."""
    x = np.asarray(facility_kw, dtype=float)
    x = x - x.mean()
    density = np.abs(np.fft.rfft(x * np.hanning(x.size))) ** 2 * 2 * period_s / x.size
    return np.fft.rfftfreq(x.size, period_s), density


def site_settings(unsafe: bool) -> dict[str, Any]:
    loop: dict[str, Any] = (
        {"loop_window_s": UNSAFE_WINDOW_S, "loop_gain": UNSAFE_GAIN, "loop_unsafe": True}
        if unsafe
        else {}
    )
    return loop | {
        # The loop that can lock is the integral at the meter: a delta held on the site's gain
        # (the default) moves only to reach its shed, then holds, and pulls no job.
        "loop_delta_basis": "meter",
        "scatter": "off",
        "scatter_spread": LAB_SCATTER_SPREAD,
        "scatter_max_spread": LAB_SCATTER_MAX_SPREAD,
        "reconcile_period_s": RECONCILE_S,
        "telemetry_max_age_s": RECONCILE_S,  # one round of the agents' telemetry a reconciliation
        "lease_s": 30.0,
    }


def open_site(
    jobs: list[dict[str, Any]], delay_s: float, unsafe: bool, folder: Path
) -> SimulatedSite:
    return SimulatedSite(
        jobs,
        Truth(jobs, OVERHEAD_FACTOR, 0.0),
        declared_overhead_factor=OVERHEAD_FACTOR,
        meter_period_s=METER_PERIOD_S,
        time_constant_s=0.0,
        waveform_meter=True,
        meter_delay_s=delay_s,
        sample_hz=SAMPLE_HZ,
        gpus_per_node=GPUS_PER_NODE,
        folder=folder,
        **site_settings(unsafe),
    )


async def record(site: SimulatedSite, run: LockRun, seconds: float, say: Any) -> None:
    """Tick the site for `seconds`, recording the truth at every meter period."""
    backends = site.backends
    report_every = max(round(10.0 / METER_PERIOD_S), 1)
    for k in range(round(seconds / METER_PERIOD_S)):
        await site.tick()
        phases = [2 * np.pi * p for b in backends for p in b.job_phases().values()]
        watts = [b.power_w(i) for b in backends for i in range(b.count())]
        run.time_s.append(site.clock.monotonic())
        run.order.append([float(r) for r in order_parameters(phases)])
        run.job_w.append(watts)
        run.facility_kw.append(OVERHEAD_FACTOR * sum(watts) / 1000.0)
        run.throughput.append(sum(sum(b.job_throughput().values()) for b in backends))
        if (k + 1) % report_every == 0:
            r1, r2, r3 = run.order[-1]
            say(f"{run.name}: t = {run.time_s[-1]:.0f} s, r1 {r1:.2f}, r2 {r2:.2f}, r3 {r3:.2f}")
    tracker = site.tracker
    run.loop = {
        "window_s": tracker.config.window_s,
        "gain": tracker.config.gain,
        "integral_gain_per_s": tracker.config.integral_gain_per_s,
        "delay_s": tracker.config.delay_s,
        "verdict": tracker.config.verdict,
        "reason": tracker.config.reason,
    }
    run.scattering = site.scatterer.doc()
    run.measured_order = (await site.fleet.phase_doc())["order_parameters"]


def run_lock(
    *,
    lock_s: float = 120.0,
    default_s: float = 60.0,
    scatter_s: float = 180.0,
    folder: Path,
    say: Any = print,
    jobs: int = JOBS,
) -> dict[str, Any]:
    """The three runs; their records and figures."""
    mix = lock_jobs(jobs)
    delay_s = attractive_delay_s(
        PERIOD_S,
        DUTY,
        window_s=UNSAFE_WINDOW_S,
        hold_s=METER_PERIOD_S,
        integral_gain_per_s=UNSAFE_GAIN / METER_PERIOD_S,
    )
    reduction_kw = REDUCTION * OVERHEAD_FACTOR * sum(j["power_w"] * j["gpus"] for j in mix) / 1000
    say(
        f"lock lab: {jobs} jobs, T = {PERIOD_S:g} s within {JOB_SPREAD:.1%}, d = {DUTY:g}; "
        f"the event asks for {reduction_kw:.1f} kW; the meter's delay {delay_s:.2f} s (most "
        f"attractive for the site loop as it runs, window {UNSAFE_WINDOW_S:g} s)"
    )
    lengths = (lock_s, default_s, scatter_s)
    records = asyncio.run(three_runs(mix, delay_s, reduction_kw, lengths, folder, say))
    return {
        "jobs": jobs,
        "period_s": PERIOD_S,
        "duty": DUTY,
        "meter_delay_s": delay_s,
        "requested_kw": reduction_kw,
        **figures(records, jobs),
        "records": records,
    }


async def three_runs(
    mix: list[dict[str, Any]],
    delay_s: float,
    reduction_kw: float,
    lengths: tuple[float, float, float],
    folder: Path,
    say: Any,
) -> list[LockRun]:
    """The unsafe loop's event, the default loop's, then scattering switched on on the unsafe
    loop's locked site (each run's length in `lengths`, in that order)."""
    lock_s, default_s, scatter_s = lengths

    async def event(site: SimulatedSite, run: LockRun, seconds: float) -> None:
        await site.start()
        await site.run_for(WARM_UP_S)
        await site.tracker.pursue(f"lock-{run.name}", reduction_kw, None)
        await record(site, run, seconds, say)

    unsafe = open_site(mix, delay_s, True, folder / "unsafe")
    default = open_site(mix, delay_s, False, folder / "default")
    try:
        locked, safe, scattered = (
            LockRun("unsafe loop"),
            LockRun("default loop"),
            LockRun("scattering"),
        )
        await event(unsafe, locked, lock_s)
        await event(default, safe, default_s)
        unsafe.scatterer.mode = "auto"  # switched on, on the running, locked site
        await record(unsafe, scattered, scatter_s, say)
        return [locked, safe, scattered]
    finally:
        unsafe.close()
        default.close()


def figures(records: list[LockRun], jobs: int) -> dict[str, Any]:
    """The runs' summaries, the Rayleigh threshold, scattering's unlock time and its cost."""
    summaries = [r.summary() for r in records]
    locked_throughput = summaries[0]["throughput"]
    cost = 1.0 - summaries[2]["throughput"] / locked_throughput if locked_throughput else 0.0
    threshold = rayleigh_threshold(jobs)
    scattered = records[2]
    below = [t for t, r in zip(scattered.time_s, scattered.order, strict=True) if r[0] < threshold]
    return {
        "threshold": threshold,
        "sqrt_n": float(np.sqrt(jobs)),
        "runs": summaries,
        "loop_gain": UNSAFE_GAIN,
        "integral_gain_per_s": UNSAFE_GAIN / METER_PERIOD_S,
        #: from scattering switched on to r1 first below the threshold [s]
        "unlock_s": below[0] - scattered.time_s[0] + METER_PERIOD_S if below else None,
        #: the jobs' true throughput: scattering's settled part against the locked run's
        "scattering_throughput_cost": cost,
    }
