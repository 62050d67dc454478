"""From a facility target to per-node cap commands (docs/architecture.md).

The site's job mix goes to flexmodel's `optimal` allocation. Jobs without a placement on a
known agent cannot be capped, so they give nothing. While the jobs' phases are being scattered
(`gateway.services.scattering`), the allocation's rates are spread by `flexmodel.loops.detune`
(within the same bounds, at the same total power during an event). Each node gets its whole
desired state: a cap for every GPU of every capped job placed on it; GPUs not listed return to
their original limit. The sync verdict of the site's control loops is attached: the site loop's
from its closed-loop response as it runs (`site_loop`, `flexmodel.loopresponse.ClosedLoopResponse`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from flexmodel.allocate import allocate_mix
from flexmodel.jobs import JobMix
from flexmodel.loopresponse import ClosedLoopResponse
from flexmodel.loops import detune, job_unit_coupling, site_loops
from flexmodel.sync import worst_verdict
from gateway.services.fleet import LoopMeasurements
from gateway.settings import GatewaySettings

#: A job whose cap is within this of its maximum is left uncapped.
UNCAPPED_MARGIN_W = 0.5


def plan(
    mix: JobMix,
    facility_kw: float,
    nodes: set[str],
    settings: GatewaySettings,
    down: frozenset[str] = frozenset(),
    measured: LoopMeasurements | None = None,
    rate_spread: float = 0.0,
    site_loop: ClosedLoopResponse | None = None,
    cannot_cap: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The allocation for `facility_kw` at the meter, as per-node commands. Jobs on a node
    that is `down`, or whose agent may not set limits (`cannot_cap`: node -> why), give
    nothing; that node is sent no caps. The loops' verdict is on what the
    agents measure (`measured`), where they do, and on the site loop as it runs (`site_loop`;
    None: no site loop). `rate_spread`: the half-width of the rate offsets that scatter the
    jobs' phases (0: none)."""
    cannot_cap = cannot_cap or {}
    up = nodes - down - set(cannot_cap)
    reachable = np.array(
        [
            bool(job.placement) and all(p.node in up for p in job.placement or ())
            for job in mix.jobs
        ],
        dtype=np.bool_,
    )
    doc = allocate_mix(mix, max(facility_kw, 0.0), strategy="optimal", excluded=~reachable)
    if rate_spread > 0.0:
        _spread_rates(doc, mix, reachable, rate_spread, hold_power=facility_kw > 0.0)
    caps: dict[str, list[dict[str, float]]] = defaultdict(list)
    for job, answer, ok in zip(mix.jobs, doc["jobs"], reachable, strict=True):
        answer.update(
            tier=job.tier,
            min_throughput_fraction=job.min_throughput_fraction,
            protected=job.protected,
        )
        cap = answer["cap_w"]
        if ok and cap < job.max_cap_w - UNCAPPED_MARGIN_W:
            cap_w = round(float(cap), 1)
            for where in job.placement or ():
                caps[where.node] += [{"gpu": g, "cap_w": cap_w} for g in where.gpus]
    doc["commands"] = [{"node": node, "caps": caps.get(node, [])} for node in sorted(nodes)]
    doc["unplaced_jobs"] = [j.id for j, ok in zip(mix.jobs, reachable, strict=True) if not ok]
    doc["unreachable_nodes"] = sorted(down & nodes)
    doc["uncappable_nodes"] = [
        {"node": node, "reason": cannot_cap[node]} for node in sorted(set(cannot_cap) & nodes)
    ]
    doc["shortfall_kw"] = max(facility_kw - doc["achieved_facility_kw"], 0.0)
    doc["sync"] = loops_report(mix, measured, site_loop)
    return doc


def _spread_rates(
    doc: dict[str, Any], mix: JobMix, reachable: np.ndarray, half_width: float, *, hold_power: bool
) -> None:
    """The allocation `doc` with its rates spread (`detune`), and what that costs."""
    allocated = np.array([j["power_w"] for j in doc["jobs"]], dtype=float)
    tuned = detune(mix.problem.excluding(~reachable), allocated, half_width, hold_power=hold_power)
    before = mix.curves.uncapped_throughput
    for j, answer in enumerate(doc["jobs"]):
        answer.update(
            cap_w=float(tuned.cap_w[j]),
            power_w=float(tuned.power_w[j]),
            throughput=float(tuned.throughput[j]),
            throughput_fraction=float(tuned.throughput[j] / before[j]),
            rate_offset=float(tuned.rate_offset[j]),
        )
    k = mix.overhead_factor
    doc["achieved_gpu_kw"] -= tuned.power_change_w / 1000.0
    doc["achieved_facility_kw"] = k * doc["achieved_gpu_kw"]
    doc["throughput_after"] -= tuned.throughput_cost
    doc["scattering"] = {
        "rate_spread": half_width,
        "throughput_cost": tuned.throughput_cost,
        "throughput_cost_fraction": tuned.throughput_cost / float(before.sum()),
        "power_change_facility_kw": k * tuned.power_change_w / 1000.0,
    }


def loops_report(
    mix: JobMix,
    measured: LoopMeasurements | None = None,
    site_loop: ClosedLoopResponse | None = None,
) -> dict[str, Any]:
    """Each control loop's delay and window against the jobs it touches, and the verdict: on
    the jobs' periods and duties under their present caps as the agents measure them
    (`measured`; declared values where nothing was measured yet), the site loop (`site_loop`)
    from its closed-loop response at each job's own coupling (`job_unit_coupling`)."""
    measured = measured or LoopMeasurements({}, {})
    jobs = mix.waving
    periods = [measured.periods_s.get(j.id, j.period_s) for j in jobs]
    duties = [measured.duties.get(j.id, j.duty) for j in jobs]
    duties = [d if 0.0 < d < 1.0 else j.duty for d, j in zip(duties, jobs, strict=True)]
    unit = job_unit_coupling(jobs, periods, mix.overhead_factor) if jobs else 0.0
    loops = [
        loop.evaluate(periods, duties, gain_per_s=unit) for loop in site_loops(site_loop=site_loop)
    ]
    return {"loops": loops, "verdict": worst_verdict([loop["verdict"] for loop in loops])}
