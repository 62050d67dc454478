"""Benchmark: a campaign of unannounced events on realistic sites (issue 31, item 9).

Random sites of 2-8 nodes (`flexgate.lab.realsite.draw_site`: meter dead time 0-60 s, lag 1-60 s,
averaging 0-60 s, noise, quantisation; the overhead factor off by up to 30%, job power off by
up to 15% and drifting, cooling cycling) each take a series of events, one after another over
simulated days, on a stepped clock. Each event: a target type (a delta `reduction_kw`, a
setpoint `level_kw`, or an import limit `level_kw` scored as a ceiling), a depth of 5-40% of
the site's power, a duration log-uniform from 15 minutes to 10 hours, a notice of 0-60 s
(recorded only: the loop is handed the target when it starts, as the events service does),
jobs that end and restart mid-event (the scheduler's report 5-60 s late), a job's power
drifting, and in at least a fifth of events a meter fault (frozen, a dropout, an offset).

Strides: every meter period is simulated while the loop ramps and settles, and for a while
after anything changes (a job, the cooling, a drift, a fault); after that, for as long as the
true power still moves by more than 1% of the request (`STEADY`) unless it cycles about a mean
that holds (a loop on a coarse meter's steps), and for as long as the loop's correction moves
at a rate that would carry it 1% of the request through the stride (a loop still integrating
an error the true power does not show yet). In between, the clock strides to the next change;
the last watch's samples, repeated, stand for the stride in the scores (the site is not
simulated through it: the loop resumes where it was). Scores weigh each sample by the time it
stands for; `samples` counts those simulated.

Scored on the site's true power (before the meter): deltas against the oracle's uncapped power
now, setpoints and limits against their level; where a job that ended left the site unable
to shed what was asked (its other GPUs idle or at their floor), against what it could shed
then (`short_by_site`: the share of the settled time that was so); fault-free events within
+-5% of the request by their settled mean; limits by the share of 1-minute intervals above
the limit after the ramp allowance; time to 90% of the request on the true power and at the
meter; the largest overshoot of the step response (an event begun while a cooling step was
still on its way through the meter apart: `unseen_step`). Faulted events apart.

    python bench/campaign_bench.py [--events 200] [--jobs 2] [--loop-root ../base] [--out campaign]

`--loop-root` runs the same events against another tree's gateway and loop (its `gateway`,
`flexmodel`, `agents` and `flexgate.lab.simsite`), with this tree's site model.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import importlib
import inspect
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from campaign_scoring import FAULTS, TYPES, Trace, plot, score, summary

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
EVENTS_PER_SITE = 10
METER_PERIOD_S = 5.0
#: The clock strides between the site's changes only while the true power holds within this
#: share of the request (over the last watch): a loop that still moves is ticked through.
STEADY = 0.01


@dataclass
class Plan:
    """One event as drawn: when things happen are seconds from its start."""

    kind: str
    depth: float
    duration_s: float
    notice_s: float
    gap_s: float  #: idle time before it
    churn: list[tuple[float, str]] = field(default_factory=list)  #: (at, "end"/"start")
    report_s: float = 30.0  #: the scheduler's report lag
    drift_at_s: float | None = None
    drift_to: float = 1.0
    fault: str | None = None
    fault_at_s: float = 0.0
    fault_for_s: float = 0.0
    fault_kw: float = 0.0  #: a freeze's or an offset's kW off the truth


def draw_plans(rng: Any, count: int) -> list[Plan]:
    plans = []
    for k in range(count):
        duration_s = float(math.exp(rng.uniform(math.log(900.0), math.log(36000.0))))
        plan = Plan(
            kind=TYPES[k % 3],
            depth=float(rng.uniform(0.05, 0.40)),
            duration_s=duration_s,
            notice_s=float(rng.uniform(0.0, 60.0)),
            gap_s=float(rng.uniform(600.0, 4 * 3600.0)),
            report_s=float(rng.uniform(5.0, 60.0)),
        )
        if rng.random() < 0.4:
            end_s = float(rng.uniform(0.2, 0.8)) * duration_s
            plan.churn.append((end_s, "end"))
            if rng.random() < 0.6:
                plan.churn.append((end_s + float(rng.uniform(120.0, 1200.0)), "start"))
        if rng.random() < 0.5:
            plan.drift_at_s = float(rng.uniform(0.1, 0.9)) * duration_s
            plan.drift_to = float(rng.uniform(0.85, 1.15))
        if rng.random() < 0.3:
            plan.fault = FAULTS[int(rng.integers(len(FAULTS)))]
            plan.fault_at_s = float(rng.uniform(0.15, 0.6)) * duration_s
            plan.fault_for_s = float(rng.uniform(300.0, 3600.0))
            plan.fault_kw = float(rng.choice([-1, 1]) * rng.uniform(0.03, 0.10))
        plans.append(plan)
    return plans


async def tick(site: Any, trace: Trace, start_s: float) -> None:
    reading = await site.sim.tick()
    trace.add(site, start_s, reading)


async def run_event(site: Any, plan: Plan, name: str) -> dict[str, Any]:
    from flexgate.lab.realsite import DRIFT

    sim, meter = site.sim, site.meter
    oracle0 = site.oracle_uncapped_kw()
    # An event deeper than the site can truly shed would be refused: at most 85% of that.
    depth_kw = min(plan.depth * oracle0, 0.85 * (oracle0 - site.oracle_floor_kw()))
    level_kw = None if plan.kind == "delta" else oracle0 - depth_kw

    def reduction_kw() -> float:
        if level_kw is None:
            return depth_kw
        modelled = sim.power.facility_kw(site.book.mix().baseline_gpu_kw)
        return max(modelled - level_kw, 0.0)

    settle_s = site.draw.path.dead_s + 3 * site.draw.path.lag_s + site.draw.path.averaging_s
    allowance_s = 300.0 + settle_s
    watch_s = 60.0 + 1.5 * settle_s
    # (at, action): everything that changes during the event, in order
    actions: list[tuple[float, str]] = []
    running = sorted({j for _, _, j in site._gpu_jobs() if j is not None})
    churn_job = running[len(running) // 2] if running else None
    for at_s, what in plan.churn:
        if churn_job and at_s < plan.duration_s:
            actions += [(at_s, f"{what}"), (at_s + plan.report_s, "report")]
    if plan.drift_at_s is not None:
        actions.append((plan.drift_at_s, "drift"))
    if plan.fault:
        actions.append((plan.fault_at_s, "fault"))
        actions.append((plan.fault_at_s + plan.fault_for_s, "clear"))
    start_s = site.clock.monotonic()
    cooling = site.draw.cooling
    # A cooling step the meter had not shown whole when the event began (within its dead
    # time, lag and averaging before the start): the target was planned on a reading of the
    # old static load, which nothing the loop can see tells it of. The step response is then
    # not the loop's own: it is scored apart (`unseen_step`).
    unseen_step = start_s - cooling.last_step_s(start_s) < settle_s
    at_s = cooling.next_step_s(start_s)
    while at_s < start_s + plan.duration_s:
        actions.append((at_s - start_s, "cooling"))
        at_s = cooling.next_step_s(at_s + 1.0)
    actions = sorted(a for a in actions if a[0] < plan.duration_s)
    # The step response is the event's own until the site first changes under it.
    changed_s = actions[0][0] if actions else plan.duration_s
    trace = Trace(METER_PERIOD_S)
    # A limit is a ceiling where the loop knows them (not d96b321's: it held limits as setpoints).
    ceiling = {"ceiling": True} if plan.kind == "limit" and _knows_ceilings(site) else {}
    await site.tracker.pursue(name, reduction_kw(), level_kw, **ceiling)
    dense_until_s = allowance_s + 120.0
    fault_s: float | None = None
    while True:
        now_s = site.clock.monotonic() - start_s
        if now_s >= plan.duration_s:
            break
        while actions and actions[0][0] <= now_s:
            _, what = actions.pop(0)
            dense_until_s = max(dense_until_s, now_s + watch_s)
            if what == "end" and churn_job:
                site.end_job(churn_job)
            elif what == "start" and churn_job:
                site.start_job(churn_job)
            elif what == "report":
                await site.report_jobs()
                await site.tracker.pursue(name, reduction_kw(), level_kw, **ceiling)
            elif what == "drift" and running:
                job = running[0]
                site.draw.drift[job] = min(max(plan.drift_to, 1 - DRIFT), 1 + DRIFT)
            elif what == "fault":
                fault_s = now_s
                if plan.fault == "freeze":
                    meter.freeze(plan.fault_kw * oracle0)
                elif plan.fault == "dropout":
                    meter.fault = "stop"
                else:
                    meter.fault, meter.offset_kw = "offset", plan.fault_kw * oracle0
            elif what == "clear" and plan.fault != "offset":
                meter.fault = None
        next_s = min([actions[0][0] if actions else plan.duration_s, plan.duration_s])
        stride_s = math.floor((next_s - now_s) / METER_PERIOD_S) * METER_PERIOD_S
        steady_kw = STEADY * depth_kw
        if (
            now_s < dense_until_s
            or (trace.moving(watch_s, steady_kw) and not trace.repeating(watch_s, steady_kw))
            or trace.creep_kw(watch_s, stride_s) > steady_kw
        ):
            await tick(site, trace, start_s)
            continue
        if stride_s >= METER_PERIOD_S:
            trace.repeat(watch_s, now_s + stride_s + METER_PERIOD_S)
            site.clock.step(stride_s)
        await tick(site, trace, start_s)
    site.tracker.release()
    meter.fault, meter.offset_kw = None, 0.0
    site.draw.drift.clear()
    for job in list(site.ended):
        site.start_job(job)
    await site.report_jobs()
    await sim.targets.hold(0.0, "idle")
    return score(plan, trace, depth_kw, level_kw, allowance_s, fault_s, changed_s) | {
        "unseen_step": unseen_step
    }


def _knows_ceilings(site: Any) -> bool:
    return "ceiling" in inspect.signature(site.tracker.pursue).parameters


async def run_site(seed: int, plans: list[Plan], folder: Path) -> list[dict[str, Any]]:
    import numpy as np

    from flexgate.lab.realsite import RealisticSite, draw_site

    draw = draw_site(np.random.default_rng(10_000 + seed))
    site = RealisticSite(draw, seed=seed, meter_period_s=METER_PERIOD_S, folder=folder)
    out = []
    try:
        await site.start()
        for k, plan in enumerate(plans):
            site.clock.step(math.floor(plan.gap_s / METER_PERIOD_S) * METER_PERIOD_S)
            await site.run_for(300.0)  # the meter's window before the event
            result = await run_event(site, plan, f"ev-{seed}-{k}")
            result |= {
                "site": seed,
                "nodes": len(site.backends),
                "meter": asdict(draw.path),
                "true_overhead_factor": draw.overhead_factor,
                "cooling_step_kw": draw.cooling.step_kw,
            }
            out.append(result)
    finally:
        site.close()
    return out


def campaign(events: int, seed: int = 31, jobs: int = 1) -> list[dict[str, Any]]:
    """The events on their sites, `jobs` sites at a time (each site's run is its own: one
    process each, results in site order)."""
    import numpy as np

    plans = draw_plans(np.random.default_rng(seed), events)
    tmp = Path(tempfile.mkdtemp(prefix="campaign-bench-"))
    sites = [
        (s, plans[s * EVENTS_PER_SITE : (s + 1) * EVENTS_PER_SITE], tmp / f"site-{s}")
        for s in range(math.ceil(events / EVENTS_PER_SITE))
    ]
    runs: list[dict[str, Any]] = []
    try:
        pool = concurrent.futures.ProcessPoolExecutor(jobs) if jobs > 1 else None
        with pool or contextlib.nullcontext():
            for s, site_runs in enumerate((pool.map if pool else map)(_run_site, sites)):
                runs += site_runs
                print(f"site {s}: {len(runs)} events", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def _run_site(site: tuple[int, list[Plan], Path]) -> list[dict[str, Any]]:
    return asyncio.run(run_site(*site))


def use_loop_root(loop_root: Path) -> None:
    """Another tree's `gateway`, `flexmodel`, `agents` and simulated site (its
    `flexgate/lab/simsite.py`, or `flexgate/simsite.py` in a tree from before `flexgate/lab/`)
    under this tree's site model (`flexgate.lab`: `realsite`, `jobs`)."""
    sys.path.insert(0, str(loop_root))
    import flexgate

    flexgate.__path__.append(str(ROOT / "flexgate"))
    _load("flexgate.lab", ROOT / "flexgate" / "lab" / "__init__.py", package=True)
    simsite = loop_root / "flexgate" / "lab" / "simsite.py"
    _load(
        "flexgate.lab.simsite",
        simsite if simsite.exists() else simsite.parent.parent / "simsite.py",
    )


def _load(name: str, path: Path, *, package: bool = False) -> None:
    """The module (or package) at `path`, imported as `name`."""
    import importlib.util

    where = [str(path.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=where)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _results(parser: argparse.ArgumentParser, path: Path) -> dict[str, Any]:
    """A campaign's results file, or the parser's error naming what is wrong with it."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        parser.error(f"--plot {path}: cannot be read ({exc.strerror})")
    except json.JSONDecodeError as exc:
        parser.error(f"--plot {path}: not JSON ({exc})")
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        parser.error(f"--plot {path}: not a campaign's results (no 'runs' list)")
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument(
        "--loop-root",
        type=Path,
        help="another checkout's loop, e.g. ../base from git worktree add ../base d96b321",
    )
    parser.add_argument("--out", default="campaign", help="bench/results/<out>.json")
    parser.add_argument("--jobs", type=int, default=1, help="sites run at once, one process each")
    parser.add_argument("--plot", nargs="+", type=Path, help="only plot these results")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    # One thread of BLAS per site (before numpy loads): its small products gain nothing from
    # threads, and `--jobs` processes would fight over the cores.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    if args.plot:
        # campaign.json is this tree's run, campaign_<rev>.json another loop's
        names = [
            p.stem.removeprefix("campaign_") if "_" in p.stem else "this tree" for p in args.plot
        ]
        docs = {n: _results(parser, p) for n, p in zip(names, args.plot, strict=True)}
        plot(docs, RESULTS / "campaign.png")
        return
    if args.loop_root:
        use_loop_root(args.loop_root)
    begin = time.perf_counter()
    runs = campaign(args.events, jobs=args.jobs)
    doc = {
        "benchmark": "campaign",
        "loop": str(args.loop_root or "this tree"),
        "tracking_module": importlib.import_module("gateway.services.tracking").__file__,
        "events": len(runs),
        "meter_period_s": METER_PERIOD_S,
        "strides": "every meter period while the loop ramps and settles (300 s plus the "
        "meter's dead time, 3 lags and averaging, then 120 s more) and for 60 s plus 1.5 "
        "times that settling after every change (job end, start, report, drift, cooling step, "
        "fault); then while the true power moves by more than 1% of the request over that "
        "last watch (unless its mean held over the last two watches: a steady cycle), or the "
        "loop's correction moves at a rate that would carry it 1% of the request through the "
        "stride; otherwise the clock strides to the next change, the last watch's samples "
        "repeated through it in the scores",
        "jobs": args.jobs,
        "wall_s": time.perf_counter() - begin,
        "summary": summary(runs),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("wall_s", "summary")}, indent=2, default=str)[:4000])


if __name__ == "__main__":
    main()
