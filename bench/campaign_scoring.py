"""The campaign benchmark's record and scores (bench/campaign_bench.py): each event's samples
and the strides through its steady holds (`Trace`), its figures (`score`), the campaign's
summary per target type and fault, and its plot."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from campaign_bench import Plan

TYPES = ("delta", "setpoint", "limit")
FAULTS = ("freeze", "dropout", "offset")
INTERVAL_S = 60.0  #: the program's averaging interval for limits
WITHIN = 0.05


class Trace:
    """Samples of one event: time, true kW, oracle uncapped kW, oracle floor kW (every GPU at
    its lowest cap), meter kW (None: no reading), feed fault; each stands until the next."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s  #: the meter period the site is ticked at [s]
        self.rows: list[tuple[float, float, float, float, float | None, str | None]] = []
        self.corrections: list[float] = []  #: the loop's correction at each row [kW]
        self.simulated = 0  #: rows ticked through (the rest repeat them through strides)
        self._ticked_from = 0  #: the first row ticked since the last stride

    def _first(self, span_s: float) -> int:
        """The first row ticked since the last stride within the last `span_s`."""
        since_s = self.rows[-1][0] - span_s if self.rows else 0.0
        first = len(self.rows)
        while first > self._ticked_from and self.rows[first - 1][0] >= since_s:
            first -= 1
        return first

    def _since(self, span_s: float) -> list[float]:
        """True kW of the rows ticked since the last stride within the last `span_s`."""
        return [row[1] for row in self.rows[self._first(span_s) :]]

    def moving(self, span_s: float, within_kw: float) -> bool:
        """The true power moved by more than `within_kw` over the last `span_s`: a loop still
        settling, or cycling (a coarse meter's readings jump a whole step at a time)."""
        recent = self._since(span_s)
        return bool(recent) and max(recent) - min(recent) > within_kw

    def repeating(self, span_s: float, within_kw: float) -> bool:
        """Ticked through for two spans since the last stride, and the last span's mean true
        power within `within_kw` of the span's before: a loop cycling about a level it holds."""
        if not self.rows or self.rows[-1][0] - self.rows[self._ticked_from][0] < 2 * span_s:
            return False
        both, last = self._since(2 * span_s), self._since(span_s)
        before = both[: len(both) - len(last)]
        return bool(before) and abs(statistics.fmean(last) - statistics.fmean(before)) <= within_kw

    def creep_kw(self, span_s: float, stride_s: float) -> float:
        """How far the loop's correction would move through a stride of `stride_s` at the
        rate it moved over the last `span_s` [kW]: a loop still integrating an error (slowly:
        a coarse meter's step) is not at rest even where the true power holds."""
        recent = self.corrections[self._first(span_s) :]
        return abs(recent[-1] - recent[0]) / span_s * stride_s if recent else 0.0

    def repeat(self, span_s: float, until_s: float) -> None:
        """The last `span_s` of samples, again and again, up to `until_s` (the next sample
        after a stride of the clock): they stand for a steady hold or a steady cycle through
        the stride (the site is not simulated through it; the loop resumes where it was)."""
        t_end = self.rows[-1][0]
        last = self.rows[self._first(span_s) :]
        period_s = t_end - last[0][0] + self.period_s  # ticked every meter period
        shift_s, held = period_s, self.corrections[-1]
        while t_end - span_s + shift_s < until_s:
            copies = [(r[0] + shift_s, *r[1:]) for r in last if r[0] + shift_s < until_s]
            self.rows += copies
            self.corrections += [held] * len(copies)
            shift_s += period_s
        self._ticked_from = len(self.rows)

    def add(self, site: Any, start_s: float, reading: float | None) -> None:
        fault = site.sim.feed.state().get("fault")
        t = site.clock.monotonic() - start_s
        truth = (site.true_facility_kw(), site.oracle_uncapped_kw(), site.oracle_floor_kw())
        self.rows.append((t, *truth, reading, fault))
        pursuit = getattr(site.tracker, "pursuit", None)
        self.corrections.append(getattr(pursuit, "correction_kw", 0.0))
        self.simulated += 1


def score(
    plan: Plan,
    trace: Trace,
    depth_kw: float,
    level_kw: float | None,
    allowance_s: float,
    fault_s: float | None,
    changed_s: float,
) -> dict[str, Any]:
    """The event's figures; `overshoot` is the step response's (until `changed_s`, the site's
    first change under the event: a job, a drift, a cooling step, a fault), `peak_over` the
    largest excess over the request anywhere before a fault (what each change's dead time costs).
    """
    import numpy as np

    t = np.array([r[0] for r in trace.rows])
    true_kw = np.array([r[1] for r in trace.rows])
    oracle_kw = np.array([r[2] for r in trace.rows])
    floor_kw = np.array([r[3] for r in trace.rows])
    meter_kw = np.array([np.nan if r[4] is None else r[4] for r in trace.rows])
    dt = np.diff(np.append(t, plan.duration_s))
    # What any loop could shed now: a job that ended mid-event may leave GPUs that shed
    # nothing (idle ones), and the request beyond that is the site's shortfall, not the loop's.
    feasible_kw = np.maximum(oracle_kw - floor_kw, 0.0)
    if level_kw is None:
        asked_kw = np.minimum(depth_kw, feasible_kw)
        delivered = oracle_kw - true_kw
        at_meter = oracle_kw - meter_kw
    else:
        # Against the depth asked at the start: below the level is over-delivery, unless
        # the site would draw less than the level anyway (a job ended), where nothing is asked,
        # or could draw no less than its floor, where the floor is all that can be asked.
        asked_kw = np.full_like(t, depth_kw)
        needed_kw = np.minimum(np.maximum(level_kw, floor_kw), oracle_kw)
        delivered = depth_kw + needed_kw - true_kw
        at_meter = depth_kw + needed_kw - meter_kw
    nothing = asked_kw < 1e-3 * depth_kw  # nothing can be shed: nothing is asked
    ratio = np.where(nothing, 1.0, delivered / np.maximum(asked_kw, 1e-9))
    settled = t >= allowance_s
    if fault_s is not None:
        settled &= t < fault_s  # the fault-free part, scored as such; the rest apart
    weights = dt * settled
    error = float(np.sum((ratio - 1) * weights) / np.sum(weights)) if np.sum(weights) > 0 else None

    def first(series: np.ndarray) -> float | None:
        hit = np.nonzero(series >= 0.9)[0]
        return float(t[hit[0]]) if hit.size else None

    out: dict[str, Any] = {
        **{k: v for k, v in asdict(plan).items() if k not in ("churn",)},
        "churn": [list(c) for c in plan.churn],
        "requested_kw": depth_kw,
        "clipped": depth_kw < plan.depth * trace.rows[0][2] * 0.999,
        # the share of the settled time the site could not shed what was asked (a job ended)
        "short_by_site": float(np.sum(weights * (feasible_kw < depth_kw)) / np.sum(weights))
        if np.sum(weights) > 0
        else 0.0,
        "level_kw": level_kw,
        "settled_error": error,
        "within": error is not None and abs(error) <= WITHIN,
        "t90_true_s": first(ratio),
        "t90_meter_s": first(np.where(nothing, 1.0, at_meter / np.maximum(asked_kw, 1e-9))),
        "overshoot": float(max(np.max(ratio[t < changed_s], initial=0.0) - 1.0, 0.0)),
        "response_s": changed_s,
        "peak_over": float(max(np.max(ratio[t < (fault_s or math.inf)]) - 1.0, 0.0)),
        "allowance_s": allowance_s,
        "samples": trace.simulated,
    }
    if level_kw is not None:
        out["intervals_above"], out["intervals"] = intervals_above(
            t, true_kw, dt, level_kw, allowance_s, fault_s or plan.duration_s
        )
    if fault_s is not None:
        faulted = [r for r in trace.rows if r[0] >= fault_s and r[5]]
        out["fault_detected_s"] = faulted[0][0] - fault_s if faulted else None
        out["fault_reason"] = faulted[0][5] if faulted else None
        after = (t >= fault_s) & (t < fault_s + plan.fault_for_s)
        w = dt * after
        out["fault_error"] = float(np.sum((ratio - 1) * w) / np.sum(w)) if np.sum(w) > 0 else None
        out["fault_worst"] = float(np.max(np.abs(ratio[after] - 1))) if after.any() else None
    return out


def intervals_above(
    t: Any, kw: Any, dt: Any, level_kw: float, from_s: float, to_s: float
) -> tuple[int, int]:
    """1-minute intervals from the ramp allowance whose mean power exceeds the limit."""
    import numpy as np

    energy = np.concatenate([[0.0], np.cumsum(kw * dt)])
    edges = np.append(t, t[-1] + dt[-1])
    starts = np.arange(from_s, to_s - INTERVAL_S + 1e-9, INTERVAL_S)
    if starts.size == 0:
        return 0, 0
    means = np.interp(starts + INTERVAL_S, edges, energy) - np.interp(starts, edges, energy)
    means /= INTERVAL_S
    return int(np.sum(means > level_kw * (1 + 1e-6))), int(starts.size)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    import numpy as np

    def pct(values: list[float], q: float) -> float | None:
        return float(np.percentile(values, q)) if values else None

    out: dict[str, Any] = {}
    for kind in TYPES:
        free = [r for r in runs if r["kind"] == kind and not r["fault"]]
        t90 = [r["t90_true_s"] for r in free if r["t90_true_s"] is not None]
        t90m = [r["t90_meter_s"] for r in free if r["t90_meter_s"] is not None]
        clean = [r for r in free if not r.get("unseen_step")]
        doc: dict[str, Any] = {
            "fault_free_events": len(free),
            "within_5pct": sum(r["within"] for r in free) / max(len(free), 1),
            "abs_error_median": pct(
                [abs(r["settled_error"]) for r in free if r["settled_error"] is not None], 50
            ),
            "abs_error_max": max(
                (abs(r["settled_error"]) for r in free if r["settled_error"] is not None),
                default=None,
            ),
            "t90_true_p50_s": pct(t90, 50),
            "t90_true_p95_s": pct(t90, 95),
            "t90_never": len(free) - len(t90),
            "t90_meter_p95_s": pct(t90m, 95),
            "overshoot_p95": pct([r["overshoot"] for r in clean], 95),
            "overshoot_max": max((r["overshoot"] for r in clean), default=None),
            # a cooling step still on its way through the meter at the start (`run_event`)
            "unseen_step_events": len(free) - len(clean),
            "unseen_step_overshoot_max": max(
                (r["overshoot"] for r in free if r.get("unseen_step")), default=None
            ),
            "peak_over_p95": pct([r["peak_over"] for r in free], 95),
            # events where a job's end left the site unable to shed all that was asked for a
            # while (scored against what it could shed then)
            "short_by_site_events": sum(r["short_by_site"] > 0 for r in free),
        }
        if kind == "limit":
            above = sum(r["intervals_above"] for r in free)
            total = sum(r["intervals"] for r in free)
            doc["intervals_above_share"] = above / max(total, 1)
            doc["events_never_above"] = sum(r["intervals_above"] == 0 for r in free) / max(
                len(free), 1
            )
        out[kind] = doc
    out["faulted"] = faults(runs)
    out["fell_short"] = [
        {
            k: r[k]
            for k in (
                "site",
                "kind",
                "depth",
                "settled_error",
                "t90_true_s",
                "meter",
                "churn",
                "short_by_site",
                "drift_to",
            )
        }
        for r in runs
        if not r["fault"] and not r["within"]
    ]
    return out


def faults(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fault: events, detected, how fast, the error while it lasted. An offset meter reads
    like a static load step that stays: a level (held at the meter) follows it one for one,
    so its error is set against the offset's share of the request (`offset_share_median`);
    a delta on the site's gain reads none of it unless it lands inside an answer."""
    import numpy as np

    def pct(values: list[float], q: float) -> float | None:
        return float(np.percentile(values, q)) if values else None

    def errors(rs: list[dict[str, Any]]) -> list[float]:
        return [abs(r["fault_error"]) for r in rs if r["fault_error"] is not None]

    out: dict[str, Any] = {}
    for f in FAULTS:
        rs = [r for r in runs if r["fault"] == f]
        if not rs:
            continue
        detected = [r["fault_detected_s"] for r in rs if r["fault_detected_s"] is not None]
        doc: dict[str, Any] = {
            "events": len(rs),
            "detected": len(detected),
            "detected_p50_s": pct(detected, 50),
            "error_during_median": pct(errors(rs), 50),
            "error_during_max": max(errors(rs), default=None),
        }
        if f == "offset":
            levels = [r for r in rs if r["level_kw"] is not None]
            deltas = [r for r in rs if r["level_kw"] is None]
            # a level's site power before the event is its level plus the depth asked
            shares = [
                abs(r["fault_kw"]) * (r["level_kw"] + r["requested_kw"]) / r["requested_kw"]
                for r in levels
            ]
            doc |= {
                "levels_error_median": pct(errors(levels), 50),
                "offset_share_median": pct(shares, 50),
                "deltas_error_median": pct(errors(deltas), 50),
                "deltas_error_max": max(errors(deltas), default=None),
            }
        out[f] = doc
    return out


def plot(docs: dict[str, dict[str, Any]], path: Path) -> None:
    """Settled error and time to 90% per fault-free event, per loop and target type."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n, doc in enumerate(docs.values()):
        for m, kind in enumerate(TYPES):
            free = [r for r in doc["runs"] if r["kind"] == kind and not r["fault"]]
            x = n * 4 + m
            errors = [100 * r["settled_error"] for r in free if r["settled_error"] is not None]
            t90 = [r["t90_true_s"] for r in free if r["t90_true_s"] is not None]
            axes[0].scatter([x] * len(errors), errors, s=8, alpha=0.6)
            axes[1].scatter([x] * len(t90), t90, s=8, alpha=0.6)
    ticks = [n * 4 + m for n in range(len(docs)) for m in range(3)]
    labels = [f"{name}\n{kind}" for name in docs for kind in TYPES]
    for ax in axes:
        ax.set_xticks(ticks, labels, fontsize=7)
    axes[0].axhspan(-100 * WITHIN, 100 * WITHIN, color="green", alpha=0.15)
    axes[0].set_ylabel("settled error, % of the request")
    axes[1].axhline(30.0, color="green", lw=1)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("time to 90% on the true power [s]")
    fig.suptitle("Campaign: fault-free events on realistic sites")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
