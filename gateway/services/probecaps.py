"""A probe's caps: planned from a job's curve before it starts (`probe_caps`), and kept where
the job's power shows its period once its uncapped level is measured (`after_reference`);
and what a probe records at the end of each step (`record_stretch`: the agent's stretch at
the step's cap, with when it was measured, from which the fit measures the job's drift).
Pure functions: the gateway's probe (`gateway.services.characterise`) and the bench's
simulated one (`flexgate.lab.probesim`) plan and record by the same rule."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from agents.protocol import CapPoint
from flexmodel.curves import cap_for_power, power_for_throughput
from flexmodel.jobs import JobMix

#: A probe's caps stay this far above the job's communication level: a cap at or below it
#: clips both phases flat, and the compute phase clipped just above it must still stand out
#: of the noise (four of its standard deviations at the couple of watts a job's reading
#: wanders) [W].
VISIBLE_SWING_W = 10.0


def probe_caps(mix: JobMix, j: int, floor: float, levels: int) -> list[float]:
    """Job j's probe: its uncapped limit, then `levels` caps (whole watts) evenly down to the
    cap where its curve meets throughput fraction `floor` (never below its minimum cap) [W]."""
    job = mix.jobs[j]
    curve = mix.curves.select(slice(j, j + 1))
    power = power_for_throughput(curve, floor * job.throughput)
    lowest = max(float(cap_for_power(curve, power)[0]), job.min_cap_w)
    steps = np.linspace(job.max_cap_w, lowest, levels + 1)
    return [float(round(c)) for c in steps]  # whole watts: one level to the agents too


def visible_caps(caps_w: list[float], comm_w: float | None) -> list[float] | None:
    """A probe's caps (uncapped first) where the job's power still shows its period, given its
    communication level measured uncapped (None: unknown, the caps as they are). A cap at or
    below that level clips both phases flat, and a flat trace has no period to measure: the
    caps below `VISIBLE_SWING_W` above it are replaced by as many spaced evenly from the
    lowest cap kept down to there, or fewer, never closer than that to each other: the lowest
    is then held on for the levels left (a longer stretch measures it better). None when no
    capped level is left."""
    lowest = None if comm_w is None else comm_w + VISIBLE_SWING_W
    if lowest is None or caps_w[-1] >= lowest:
        return caps_w
    kept = [c for c in caps_w if c >= lowest]
    if not kept:
        return None
    added = min(len(caps_w) - len(kept), math.floor((kept[-1] - lowest) / VISIBLE_SWING_W))
    if len(kept) == 1 and added < 1:
        return None
    steps = [float(c) for c in np.ceil(np.linspace(kept[-1], lowest, added + 1)[1:])]
    caps = [*kept, *steps]
    return caps + [caps[-1]] * (len(caps_w) - len(caps))


def after_reference(caps_w: list[float], reference: CapPoint) -> tuple[list[float], str | None]:
    """The caps a probe goes on with once a job's uncapped level is measured (`reference`),
    and why it goes no lower when it does not: no period even uncapped, or no room for a cap
    between its communication level and its limit (`visible_caps`)."""
    if reference.period_s is None:
        return caps_w[:1], (
            f"no clear iteration period uncapped ({reference.no_period_reason}): its "
            "throughput cannot be measured at any cap"
        )
    kept = visible_caps(caps_w, reference.comm_w)
    if kept is None:
        return caps_w[:1], (
            f"its communication phase draws {reference.comm_w:.0f} W, within "
            f"{VISIBLE_SWING_W:g} W of its {caps_w[0]:g} W limit: every cap would clip its power "
            "flat, with no period to measure"
        )
    return kept, None


#: Two caps within this are one level [W] (as the agents group them).
CAP_RESOLUTION_W = 0.5


def record_stretch(
    taken: list[dict[str, Any]], level: int, cap_w: float, stretches: list[CapPoint]
) -> None:
    """Add to `taken` (a job's stretches so far, in the order run) the agent's latest stretch
    at `cap_w`, level `level` of the probe, that ended after the last one taken. A job whose
    steps ran at one cap (a level held on, the references of a job that went no lower) has
    one stretch over them: kept once, as measured last. Nothing when the agent has none."""
    after = taken[-1]["end_s"] if taken else -math.inf
    found = [
        s
        for s in stretches
        if abs(s.cap_w - cap_w) < CAP_RESOLUTION_W and s.end_s is not None and s.end_s > after
    ]
    if not found:
        return
    latest = max(found, key=lambda s: s.end_s or 0.0)
    doc = {"level": level} | latest.model_dump(
        include={
            "cap_w",
            "start_s",
            "end_s",
            "power_w",
            "power_stderr_w",
            "period_s",
            "period_stderr_s",
            "periods",
            "compute_w",
            "compute_sm_clock_mhz",
            "compute_sm_clock_stderr_mhz",
        }
    )
    if taken and taken[-1]["start_s"] == doc["start_s"]:
        taken[-1] = doc
    else:
        taken.append(doc)
