"""Benchmark and figures for synchronisation (docs/sync.md).

- the simulator: N = 1000 jobs, 600 s of simulated time at dt = T/200 (target < 10 s);
- the analysis of a 10k-job fleet (target < 100 ms);
- the locking threshold against the rate spread, and a gain sweep up and down (hysteresis);
- the onsets of harmonics 2 and 3 (300 jobs, spread 0.005) against the analysis' critical gain;
- the plots in docs/img/;
- scattering in the live gateway (`scattering`): the time to unlock a fleet of 50 and 500 jobs
  started in step, and its throughput cost, through the gateway's own services on a stepped
  clock (`flexgate.lab.simsite`); the live verdict's cost per plan for 10k jobs (it runs on every
  plan) and the rate spread's (`loops.detune`).

    python bench/sync_bench.py             # everything: bench/results/sync.json, docs/img/
    python bench/sync_bench.py scattering  # only the live part, merged into sync.json
    python bench/sync_bench.py coupled     # scattering against couplings 0-0.2 rad/s (syncsim)
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flexgate.lab.plots import plot_sync
from flexgate.lab.simsite import SimulatedSite, Truth, in_step_ids
from flexmodel.jobmix import parse_job_mix
from flexmodel.locking import gain_sweep, locking_gain
from flexmodel.loopresponse import ClosedLoopResponse
from flexmodel.loops import detune, locked_coupling_per_s, unlocking_spread
from flexmodel.phases import order_parameters, rayleigh_threshold
from flexmodel.sync import analyse
from flexmodel.syncsim import simulate_sync
from gateway.services.fleet import LoopMeasurements
from gateway.services.planner import loops_report
from gateway.services.scattering import SIZED_WAIT

ROOT = Path(__file__).resolve().parent.parent
RESULTS, IMAGES = ROOT / "bench" / "results", ROOT / "docs" / "img"
T = 2.0


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def sweep(spread: float, ratios: np.ndarray, throttle: str) -> dict[str, list[float]]:
    up, down = gain_sweep(spread, ratios * 2 * spread * 2 * np.pi / T, throttle=throttle)
    return {"gain_over_2gamma": ratios.tolist(), "r1_up": up, "r1_down": down}


#: (duty, delay [s], harmonic): the delays where harmonic m attracts and the fundamental repels.
HARMONIC_CASES = ((0.25, 0.75, 2), (0.5, 0.5, 3))
HARMONIC_RATIOS = np.array([0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.4, 2.0])
ONSET_ORDER = 0.25  #: r_m well above random phases (1/sqrt(300) = 0.06; Rayleigh 0.14)


def harmonic_onset(duty: float, delay: float, m: int, spread: float = 0.005) -> dict[str, object]:
    """r_m against the gain in units of the analysis' critical gain, two seeds, and the gain at
    which the seeds' mean r_m first reaches ONSET_ORDER (interpolated)."""
    unit = analyse(T, duty, delay_s=delay, spread=spread, gain_per_s=1.0)
    predicted = float(unit.critical_per_s[0, m - 1] / unit.coupling_per_s[0, m - 1])
    orders = [
        [
            float(
                simulate_sync(
                    jobs=300,
                    period_s=T,
                    duty=duty,
                    delay_s=delay,
                    gain_per_s=ratio * predicted,
                    spread=spread,
                    duration_s=600,
                    seed=seed,
                ).final_order[m - 1]
            )
            for seed in (1, 2)
        ]
        for ratio in HARMONIC_RATIOS
    ]
    mean = np.mean(orders, axis=1)
    above = int(np.argmax(mean >= ONSET_ORDER))
    ratio = float(
        np.interp(ONSET_ORDER, mean[above - 1 : above + 1], HARMONIC_RATIOS[above - 1 : above + 1])
    )
    return {
        "duty": duty,
        "delay_s": delay,
        "m": m,
        "predicted_gain_per_s": predicted,
        "measured_gain_per_s": ratio * predicted,
        "gain_over_critical": HARMONIC_RATIOS.tolist(),
        "r_m_by_seed": orders,
    }


def in_step_jobs(count: int) -> list[dict[str, Any]]:
    """One-GPU jobs at one period (2 s, d = 1/2), eight to a node, whose simulated starting
    phases (drawn from their ids) lie within 2% of a cycle: a fleet locked from the start."""
    return [
        {
            "id": name,
            "gpus": 1,
            "power_w": 600.0,
            "throughput": 3000.0 + 10.0 * (k % 50),
            "pfi": 1.4,
            "period_s": T,
            "duty": 0.5,
            "comm_power_fraction": 0.4,
            "placement": [{"node": f"node-{k // 8 + 1:03d}", "gpus": [k % 8]}],
        }
        for k, name in enumerate(in_step_ids(count))
    ]


def unlock(count: int, spread: float, most_s: float = 400.0) -> dict[str, Any]:
    """A fleet of `count` jobs locked from the start, no event, the gateway's defaults but the
    first rate spread (`FLEXGATE_SCATTER_SPREAD`): from
    the alarm to r1 (as the gateway measures it) below the Rayleigh threshold, the episode's
    end, and the throughput the caps took meanwhile (the agents' truth)."""
    jobs = in_step_jobs(count)
    site = SimulatedSite(
        jobs,
        Truth(jobs, 1.3, 0.0),
        declared_overhead_factor=1.3,
        meter_period_s=0.5,
        time_constant_s=0.0,
        sample_hz=10.0,
        folder=Path(tempfile.mkdtemp(prefix="flexgate-bench-")),
        reconcile_period_s=2.0,
        telemetry_max_age_s=2.0,
        scatter_spread=spread,
    )
    threshold = rayleigh_threshold(count)

    def throughput() -> float:
        return sum(sum(b.job_throughput().values()) for b in site.backends)

    async def run() -> dict[str, Any]:
        await site.start()
        uncapped = throughput()
        lost, started, below, ended = 0.0, None, None, None
        wall = time.perf_counter()
        while site.clock.monotonic() < most_s and ended is None:
            await site.tick()
            now = site.clock.monotonic()
            if site.scatterer.episode is not None and started is None:
                started = now
            if started is not None:
                lost += (uncapped - throughput()) * site.settings.meter_period_s
                order = site.fleet.phases and order_parameters(list(site.fleet.phases.values()))
                if below is None and order is not None and len(order) and order[0] < threshold:
                    below = now
            if site.scatterer.ended:
                ended = now
        episode = site.scatterer.ended[-1] if site.scatterer.ended else site.scatterer.episode
        return {
            "jobs": count,
            "threshold": threshold,
            "alarm_to_below_threshold_s": None
            if below is None or started is None
            else below - started,
            "episode_s": None if ended is None or started is None else ended - started,
            "rate_spread": episode.rate_spread if episode else None,
            "widened": episode.widened if episode else None,
            "cost_while_scattering": episode.throughput_cost_fraction if episode else None,
            "tokens_lost_over_episode_in_site_seconds": lost / uncapped,
            "wall_s": time.perf_counter() - wall,
        }

    try:
        return asyncio.run(run())
    finally:
        site.close()


def live_verdict_cost(count: int = 10_000) -> dict[str, float]:
    """What every plan adds for `count` jobs: the loops' verdict on the measured periods and
    site loop (`planner.loops_report`, its closed-loop response), and the rate spread
    (`loops.detune`), each against the
    allocation itself (`flexmodel.allocate.allocate_mix`) in the same run."""
    from flexmodel.allocate import allocate_mix

    rng = np.random.default_rng(1)
    docs = [
        {
            "id": f"j{k}",
            "gpus": 8,
            "power_w": float(rng.uniform(450, 650)),
            "throughput": float(rng.uniform(1e4, 5e4)),
            "pfi": float(rng.uniform(1.1, 2.6)),
            "period_s": float(rng.uniform(1.0, 10.0)),
            "duty": float(rng.uniform(0.3, 0.9)),
            "placement": [{"node": f"n{k}", "gpus": list(range(8))}],
        }
        for k in range(count)
    ]
    mix = parse_job_mix({"jobs": docs})
    measured = LoopMeasurements(
        {d["id"]: 1.1 * d["period_s"] for d in docs}, {d["id"]: d["duty"] for d in docs}
    )
    # The site loop at the defaults on a meter of 10 s dead time and 3 s lag, its actuation
    # measured (64 delays, as `combine_delays` keeps of dispatch and actuation).
    site = ClosedLoopResponse(
        period_s=5.0,
        gain=0.5,
        window_s=44.0,
        dead_s=10.0,
        lag_s=3.0,
        actuation_samples_s=tuple(rng.uniform(0.03, 0.5, 64)),
    )
    facility_kw = 0.2 * mix.overhead_factor * sum(d["power_w"] * 8 for d in docs) / 1000
    loops_report(mix, measured, site)  # warm up
    allocation = allocate_mix(mix, facility_kw)
    power = np.array([j["power_w"] for j in allocation["jobs"]])
    best = {
        "verdict_s": min(timed(lambda: loops_report(mix, measured, site))[0] for _ in range(5)),
        "detune_s": min(
            timed(lambda: detune(mix.problem, power, 0.02, hold_power=True))[0] for _ in range(5)
        ),
        "allocate_s": min(timed(lambda: allocate_mix(mix, facility_kw))[0] for _ in range(3)),
    }
    return best | {
        "jobs": count,
        "verdict_over_allocation": best["verdict_s"] / best["allocate_s"],
        "detune_over_allocation": best["detune_s"] / best["allocate_s"],
    }


def scattering() -> dict[str, Any]:
    fleets = [unlock(count, spread) for spread in (0.01, 0.02) for count in (50, 500)]
    for f in fleets:
        print(
            f"scattering {f['jobs']} jobs at {f['rate_spread']}: r1 below {f['threshold']:.3f} "
            f"{f['alarm_to_below_threshold_s']} s after the alarm, episode {f['episode_s']} s, "
            f"spread {f['rate_spread']}, cost while scattering {f['cost_while_scattering']:.2%} "
            f"(wall {f['wall_s']:.0f} s)",
            flush=True,
        )
    verdict = live_verdict_cost()
    print(
        f"per plan, 10k jobs: verdict {verdict['verdict_s'] * 1e3:.1f} ms, detune "
        f"{verdict['detune_s'] * 1e3:.1f} ms, allocation {verdict['allocate_s'] * 1e3:.1f} ms",
        flush=True,
    )
    return {"unlock": fleets, "per_plan_10k_jobs": verdict}


COUPLED_JOBS = 60
COUPLINGS_PER_S = (0.0, 0.05, 0.1, 0.15, 0.2)


def coupled_unlock(coupling_per_s: float, start_spread: float = 0.01) -> dict[str, Any]:
    """The gateway's scattering against a loop's coupling, in the simulator: 60 jobs started in
    phase, a proportional loop at tau = 0.75 T, the detune's evenly spaced offsets. The spread
    starts at `start_spread`; after `T / (2 spread)` still locked, it is sized from r1
    (`locked_coupling_per_s`, `unlocking_spread`), or doubled where r1 says nothing, as
    `gateway.services.scattering` does. Time to unlock: to r1 below the Rayleigh threshold.
    Cost: `scattering_cost` for each spread applied, weighted by how long it was: the
    spread times the share of throughput that can move outside events; during one the total
    is held and only the allocation off its optimum costs."""
    threshold = rayleigh_threshold(COUPLED_JOBS)
    phases, spread, elapsed_s, spreads = np.zeros(COUPLED_JOBS), start_spread, 0.0, []
    unlocked_s, wait = None, 1.0
    stages: list[tuple[float, float]] = []  #: (spread, seconds it was applied)
    for _ in range(6):
        spreads.append(spread)
        stage_s = wait * T / (2.0 * spread)
        run = simulate_sync(
            jobs=COUPLED_JOBS,
            period_s=T,
            duty=0.5,
            delay_s=0.75 * T,
            gain_per_s=coupling_per_s,
            spread=spread,
            duration_s=stage_s,
            initial_phases=phases,
            offsets="even",
            steps_per_period=50,
        )
        below = np.flatnonzero(run.order[:, 0] < threshold)
        if below.size:
            unlocked_s = elapsed_s + float(run.time_s[below[0]])
            stages.append((spread, float(run.time_s[below[0]])))
            break
        elapsed_s += stage_s
        stages.append((spread, stage_s))
        phases = run.final_phases
        r1 = float(run.order[-max(len(run.order) // 10, 1) :, 0].mean())
        estimate = locked_coupling_per_s(r1, spread, T)
        sized = 0.0 if estimate is None else unlocking_spread(estimate, T, delay_s=0.75 * T)
        spread, wait = (sized, SIZED_WAIT) if sized > spread else (2.0 * spread, 1.0)
    costs = {spread: scattering_cost(spread) for spread, _ in stages}
    out: dict[str, Any] = {
        "coupling_per_s": coupling_per_s,
        "spreads": spreads,
        "unlock_s": unlocked_s,
        "final_spread": spreads[-1],
    }
    for where in ("outside", "inside"):
        out[f"cost_{where}_events"] = costs[spreads[-1]][where]
        out[f"throughput_lost_{where}_events_s"] = sum(costs[d][where] * t for d, t in stages)
    return out


def cost_mix() -> Any:
    """The fleet whose throughput the scattering costs are measured on: 60 jobs of the study's
    PFI range, a quarter protected (they do not move): the movable share is what it is."""
    rng = np.random.default_rng(7)
    return parse_job_mix(
        {
            "jobs": [
                {
                    "id": f"j{k}",
                    "gpus": 8,
                    "power_w": float(rng.uniform(450, 650)),
                    "throughput": float(rng.uniform(1e4, 5e4)),
                    "pfi": float(rng.uniform(1.1, 2.67)),
                    "period_s": T,
                    "duty": 0.5,
                    "protected": k % 4 == 0,
                    "placement": [{"node": f"n{k}", "gpus": list(range(8))}],
                }
                for k in range(COUPLED_JOBS)
            ]
        }
    )


def scattering_cost(spread: float, cut: float = 0.2) -> dict[str, float]:
    """The share of the fleet's uncapped throughput a spread costs, measured the same way
    inside and outside events: `loops.detune` on the allocation the gateway would send, by
    the job curves. Outside events, on the uncapped allocation (caps can only slow); during an
    event of `cut` of the site, at the same total (the sped-up jobs pay for the slowed)."""
    from flexmodel.allocate import allocate_mix

    mix = cost_mix()
    uncapped = float(mix.curves.uncapped_throughput.sum())
    site_kw = mix.overhead_factor * mix.baseline_gpu_kw
    out = {}
    for where, facility_kw in (("outside", 0.0), ("inside", cut * site_kw)):
        allocation = allocate_mix(mix, facility_kw)
        power = np.array([j["power_w"] for j in allocation["jobs"]])
        tuned = detune(mix.problem, power, spread, hold_power=facility_kw > 0)
        out[where] = tuned.throughput_cost / uncapped
    return out


def coupled() -> list[dict[str, Any]]:
    out = [coupled_unlock(k) for k in COUPLINGS_PER_S]
    for f in out:
        print(
            f"coupling {f['coupling_per_s']:.2f} rad/s: spreads {f['spreads']}, unlocked "
            f"{f['unlock_s']} s, cost while scattering {f['cost_outside_events']:.2%} outside "
            f"events, {f['cost_inside_events']:.2%} inside; throughput lost "
            f"{f['throughput_lost_outside_events_s']:.2f} s, "
            f"{f['throughput_lost_inside_events_s']:.2f} s",
            flush=True,
        )
    return out


def main() -> None:
    if sys.argv[1:] == ["coupled"]:
        path = RESULTS / "sync.json"
        doc = json.loads(path.read_text()) if path.exists() else {"benchmark": "sync"}
        doc["scattering_coupled"] = coupled()
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return
    if sys.argv[1:] == ["scattering"]:
        path = RESULTS / "sync.json"
        doc = json.loads(path.read_text()) if path.exists() else {"benchmark": "sync"}
        doc["scattering"] = scattering()
        doc["scattering_machine"] = "2 CPU cores shared with three other developers' work"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return
    sim_s, run = timed(
        lambda: simulate_sync(
            jobs=1000, period_s=T, duty=0.5, delay_s=1.5, gain_per_s=0.2, duration_s=600
        )
    )
    print(
        f"simulate 1000 jobs x 600 s at T/200: {sim_s:.2f} s (r1 {run.final_order[0]:.3f}, "
        f"swing ratio {run.swing_ratio:.1f})",
        flush=True,
    )
    rng = np.random.default_rng(0)
    periods, duties = rng.uniform(1, 10, 10_000), rng.uniform(0.3, 0.9, 10_000)
    analyse(periods, duties, delay_s=1.0, window_s=0.5, spread=0.01)  # warm numpy up
    fleet_s = min(
        timed(lambda: analyse(periods, duties, delay_s=1.0, window_s=0.5, spread=0.01).verdict)[0]
        for _ in range(5)
    )
    print(f"analyse 10k jobs: {fleet_s * 1e3:.1f} ms", flush=True)
    spreads = [0.005, 0.01, 0.02, 0.03, 0.04]
    gains = [locking_gain(s, steps=8) for s in spreads]
    slope, offset = np.polyfit(spreads, gains, 1)
    print(
        f"locking threshold: slope {slope:.2f} rad/s per unit spread (theory 2w = "
        f"{4 * np.pi / T:.2f}), offset {offset:.4f} rad/s",
        flush=True,
    )
    harmonics = [harmonic_onset(*case) for case in HARMONIC_CASES]
    for h in harmonics:
        print(
            f"harmonic {h['m']} onset (r_m = {ONSET_ORDER}): measured "
            f"{h['measured_gain_per_s']:.3f}, predicted {h['predicted_gain_per_s']:.3f} rad/s",
            flush=True,
        )
    ratios = np.array([0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4, 1.7, 2.0])
    hysteresis = {"linear": sweep(0.01, ratios, "linear"), "cap": sweep(0.01, 2 * ratios, "cap")}
    IMAGES.mkdir(parents=True, exist_ok=True)
    figures = {  # name: (delay, gain, spread)
        "locking": (1.5, 0.3, 0.005),
        "anti-phase": (0.6, 0.3, 0.005),
        "clusters": (0.5, 0.5, 0.0),  # identical jobs: harmonic 3 locks into three groups
    }
    for name, (delay, gain, spread) in figures.items():
        example = simulate_sync(
            jobs=48,
            period_s=T,
            duty=0.5,
            delay_s=delay,
            gain_per_s=gain,
            spread=spread,
            noise=0.003,
            duration_s=300,
            seed=4,
        )
        plot_sync(example, IMAGES / f"sync-{name}.png")
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "benchmark": "sync",
        "simulate_1000_jobs_600_s": {
            "seconds": sim_s,
            "r1": float(run.final_order[0]),
            "swing_ratio": run.swing_ratio,
        },
        "analyse_10k_jobs_s": fleet_s,
        "threshold": {
            "spreads": spreads,
            "gains": gains,
            "slope": slope,
            "offset": offset,
            "theory_slope": 4 * np.pi / T,
        },
        "harmonic_onsets": harmonics,
        "hysteresis": hysteresis,
        "scattering": scattering(),
        "scattering_coupled": coupled(),
    }
    (RESULTS / "sync.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
