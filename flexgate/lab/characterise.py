"""`flexgate lab --characterise`: jobs with no declared PFI, measured on site, then an event.

The agents run the lab's jobs with their true PFIs; the gateway is told the jobs without any
(the fleet default is all it knows). A first gateway on the lab's store probes every job
(`POST /v1/characterise`; in the lab every job may be probed at once, with short probes) and
the measured curves good enough stay in the store, so the event's gateway plans on them. The
report compares each estimate with the truth on the same grid (the probed caps the fit kept),
and the event's throughput kept, on the true curves at the event's caps, with an oracle: the
`optimal` plan on the true curves for the same true shed, and the same planner on the fleet
default.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from flexgate.serve import ServerThread
from flexmodel.allocate import allocate_mix
from flexmodel.curves import operating_point
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import JobMix
from flexmodel.pfi import pfi_of_sweep
from gateway.app import create_app
from gateway.settings import LAB_API_TOKEN, GatewaySettings

#: The lab's probes: every job at once (a lab risks no one's work), two capped levels of eight
#: iterations each, and a measured curve used once its PFI is known within 0.25.
PROBE_SETTINGS = {
    "probe_budget": 1.0,
    "probe_levels": 2,
    "probe_periods": 8.0,
    "probe_settle_s": 1.0,
    "curve_max_pfi_stderr": 0.25,
}
PROBE_WAIT_S = 600.0


def undeclared(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs as the gateway is told them: without their PFIs."""
    return [{k: v for k, v in j.items() if k not in ("pfi", "pfi_stderr")} for j in jobs]


def characterise(
    folder: Path, settings: dict[str, Any], jobs: list[dict[str, Any]], console: Console
) -> dict[str, Any]:
    """Probe every job through a gateway on the lab's store; each job's curve as
    `GET /v1/jobs/{id}` shows it, and the probe."""
    gateway = GatewaySettings(
        database_url=f"sqlite:///{folder / 'gateway.db'}", **settings, **PROBE_SETTINGS
    )
    with (
        ServerThread(create_app(gateway)) as url,
        httpx.Client(
            base_url=url, timeout=20, headers={"Authorization": f"Bearer {LAB_API_TOKEN}"}
        ) as api,
    ):
        api.put("/v1/jobs", json={"jobs": jobs}).raise_for_status()
        probe = _start(api)
        console.print(
            f"characterising {len(probe['jobs'])} jobs: levels held "
            + ", ".join(f"{h:.0f}" for h in probe["hold_s"])
            + " s"
        )
        deadline = time.monotonic() + PROBE_WAIT_S
        while probe["status"] == "running" and time.monotonic() < deadline:
            time.sleep(1.0)
            probe = api.get("/v1/characterise").json()["probe"]
        curves = {j["id"]: api.get(f"/v1/jobs/{j['id']}").json()["curve"] for j in jobs}
    console.print(f"probe {probe['status']}" + (f": {probe['reason']}" if probe["reason"] else ""))
    return {"probe": probe, "curves": curves}


def _start(api: httpx.Client) -> dict[str, Any]:
    """Start the probe once the gateway's restore at its start is over."""
    deadline = time.monotonic() + 30.0
    while True:
        answer = api.post("/v1/characterise")
        if answer.status_code == 202:
            return dict(answer.json())
        if "stepping back" not in answer.text or time.monotonic() > deadline:
            answer.raise_for_status()
            raise RuntimeError(f"the probe did not start: {answer.text}")
        time.sleep(0.5)


def estimates(curves: dict[str, Any], truth: JobMix) -> list[dict[str, Any]]:
    """Each job's measured PFI against the truth on the same grid (and its declared PFI on the
    study's grid, which is another grid: not comparable)."""
    out = []
    for j, job in enumerate(truth.jobs):
        measured = (curves.get(job.id) or {}).get("measured") or {}
        row: dict[str, Any] = {
            "id": job.id,
            "true_pfi_study_grid": job.pfi,
            "pfi": measured.get("pfi"),
            "pfi_stderr": measured.get("pfi_stderr"),
            "grid_w": measured.get("grid_w"),
            "in_force": measured.get("in_force", False),
            "true_pfi": None,
        }
        if row["pfi"] is not None and row["grid_w"]:
            curve = truth.curves.select(slice(j, j + 1))
            points = [
                (c, *(float(v[0]) for v in operating_point(curve, c)[:2])) for c in row["grid_w"]
            ]
            row["true_pfi"] = pfi_of_sweep(points).pfi
            row["error"] = row["pfi"] - row["true_pfi"]
        out.append(row)
    return out


def throughput_kept(
    plan: dict[str, Any] | None, truth: JobMix, default: JobMix
) -> dict[str, Any] | None:
    """The event's throughput kept on the true curves at its caps, against the oracle (`optimal`
    on the true curves) and the same planner on the fleet default, each at the same true shed."""
    if not plan:
        return None
    caps = {j["id"]: j["cap_w"] for j in plan["jobs"]}
    cap = np.array([caps.get(job.id, job.max_cap_w) for job in truth.jobs])
    shed_w, kept = _true_outcome(truth, cap)
    before = float(truth.array("throughput").sum())
    return {
        "true_gpu_shed_kw": shed_w / 1000.0,
        "kept": kept / before,
        "oracle_kept": _kept_at(truth, truth, shed_w) / before,
        "default_pfi_kept": _kept_at(truth, default, shed_w) / before,
    }


def _true_outcome(truth: JobMix, cap: np.ndarray) -> tuple[float, float]:
    power, thr, _ = operating_point(truth.curves, cap)
    return float(np.sum(truth.array("gpus") * (truth.array("power_w") - power))), float(thr.sum())


def _kept_at(truth: JobMix, belief: JobMix, shed_w: float) -> float:
    """Throughput kept when `optimal` on `belief` is asked for what sheds `shed_w` on the true
    curves (a site loop at the meter corrects its request until it does)."""
    lo, hi, kept = 0.0, 2.0 * shed_w + 1.0, float(truth.array("throughput").sum())
    k = belief.overhead_factor
    for _ in range(40):
        asked = 0.5 * (lo + hi)
        plan = allocate_mix(belief, k * asked / 1000.0, strategy="optimal")
        cap = np.array([j["cap_w"] for j in plan["jobs"]])
        got, kept = _true_outcome(truth, cap)
        lo, hi = (asked, hi) if got < shed_w else (lo, asked)
    return kept


def show(found: list[dict[str, Any]], kept: dict[str, Any] | None, console: Console) -> None:
    table = Table(title="characterisation: measured PFI against the truth on the probed grid")
    for name in ("job", "measured PFI", "true PFI (same grid)", "error", "grid W", "in force"):
        table.add_column(name, justify="left" if name == "job" else "right")
    for row in found:
        if row["pfi"] is None:
            table.add_row(row["id"], "-", "-", "-", "-", "no")
            continue
        table.add_row(
            row["id"],
            f"{row['pfi']:.2f} ± {row['pfi_stderr']:.2f}",
            f"{row['true_pfi']:.2f}",
            f"{row['error']:+.2f}",
            ", ".join(f"{c:g}" for c in row["grid_w"]),
            "yes" if row["in_force"] else "no",
        )
    console.print(table)
    if kept:
        console.print(
            f"throughput kept on the true curves: {kept['kept']:.2%} (oracle "
            f"{kept['oracle_kept']:.2%}, the same planner on the default PFI "
            f"{kept['default_pfi_kept']:.2%}) at {kept['true_gpu_shed_kw']:.1f} kW of GPU power"
        )


def mixes(jobs: list[dict[str, Any]], overhead_factor: float) -> tuple[JobMix, JobMix]:
    """(the truth, what the gateway was told) as mixes."""
    truth = parse_job_mix({"overhead_factor": overhead_factor, "jobs": jobs})
    default = parse_job_mix({"overhead_factor": overhead_factor, "jobs": undeclared(jobs)})
    return truth, default
