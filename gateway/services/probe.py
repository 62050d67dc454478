"""A probe (`gateway.services.characterise`): its record (`Probe`: what the audit log keeps
and `GET /v1/characterise` shows), the floor its caps stop at (`probe_floor`), and each of its
levels as caps per node (`level_caps`) and as a plan (`level_plan`). Pure: the characteriser
runs the probe (`gateway.services.proberun`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agents.protocol import GpuCap
from flexmodel.curves import operating_point
from flexmodel.jobs import Job, JobMix
from gateway.settings import GatewaySettings


@dataclass
class Probe:
    id: str
    jobs: dict[str, list[float]]  #: job id -> its caps, uncapped first [W]
    hold_s: list[float]  #: each level's hold [s]
    skipped: list[dict[str, str]]
    actor: str
    #: the levels in the order run (0 the uncapped reference, then caps going down)
    steps: list[int] = field(default_factory=list)
    status: str = "running"  #: running, completed, interrupted, failed
    level: int = 0
    step: int = 0
    reason: str | None = None
    stopped: dict[str, str] = field(default_factory=dict)  #: job id -> why it went no lower
    curves_changed: list[str] = field(default_factory=list)
    #: job id -> the agent's stretch at each step's cap, in the order run
    measured: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "actor": self.actor,
            "jobs": [
                {"id": j, "caps_w": caps, "measured": self.measured.get(j, [])}
                for j, caps in self.jobs.items()
            ],
            "hold_s": self.hold_s,
            "steps": self.steps,
            "level": self.level,
            "step": self.step,
            "skipped": self.skipped,
            "stopped": [{"id": j, "reason": r} for j, r in self.stopped.items()],
            "reason": self.reason,
            "curves_changed": self.curves_changed,
        }

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Probe:
        """The probe `doc()` described."""
        return cls(
            id=doc["id"],
            jobs={j["id"]: list(j["caps_w"]) for j in doc["jobs"]},
            hold_s=list(doc["hold_s"]),
            skipped=list(doc["skipped"]),
            actor=doc["actor"],
            # probes recorded before references: each level once, going down
            steps=list(doc.get("steps", range(len(doc["hold_s"])))),
            status=doc["status"],
            level=doc["level"],
            step=doc.get("step", doc["level"]),
            measured={j["id"]: list(j.get("measured", [])) for j in doc["jobs"]},
            reason=doc["reason"],
            stopped={s["id"]: s["reason"] for s in doc["stopped"]},
            curves_changed=list(doc["curves_changed"]),
        )


def probe_floor(job: Job, settings: GatewaySettings) -> float:
    """The throughput fraction a probe takes `job` no lower than: the stricter of its QoS
    floor and `probe_min_throughput_fraction`."""
    return max(job.min_throughput_fraction, settings.probe_min_throughput_fraction)


def level_caps(probe: Probe, level: int, mix: JobMix) -> dict[str, list[GpuCap]]:
    """The probe's caps at `level`, per node (none at the uncapped level)."""
    jobs = {job.id: job for job in mix.jobs}
    desired: dict[str, list[GpuCap]] = {}
    for job_id, caps in probe.jobs.items():
        job = jobs.get(job_id)
        if job is None or job_id in probe.stopped or level == 0 or job.protected:
            continue
        for where in job.placement or ():
            desired.setdefault(where.node, []).extend(
                GpuCap(gpu=g, cap_w=caps[level]) for g in where.gpus
            )
    return desired


def level_plan(
    probe: Probe,
    level: int,
    mix: JobMix,
    desired: dict[str, list[GpuCap]],
    nodes: Iterable[str],
) -> dict[str, Any]:
    """The probe's level as a plan (the shape of GET /v1/plans/{id}): per job its cap and
    what its curve expects there, per node of `nodes` its caps (`desired`: `level_caps`)."""
    index = {job.id: j for j, job in enumerate(mix.jobs)}
    jobs, shed_w = [], 0.0
    for job_id, caps in probe.jobs.items():
        if job_id in probe.stopped or job_id not in index:
            continue
        j = index[job_id]
        job = mix.jobs[j]
        power, thr, _ = operating_point(mix.curves.select(slice(j, j + 1)), caps[level])
        shed_w += job.gpus * (job.power_w - float(power[0]))
        jobs.append(
            {
                "id": job_id,
                "cap_w": caps[level],
                "power_w": float(power[0]),
                "throughput": float(thr[0]),
                "throughput_fraction": float(thr[0]) / job.throughput,
                "min_throughput_fraction": job.min_throughput_fraction,
            }
        )
    expected_kw = mix.overhead_factor * max(shed_w, 0.0) / 1000.0
    return {
        "strategy": "probe",
        "probe_id": probe.id,
        "level": level,
        "step": probe.step,
        "feasible": True,
        "requested_facility_kw": 0.0,
        "achieved_facility_kw": expected_kw,
        "max_facility_kw": expected_kw,
        "shortfall_kw": 0.0,
        "jobs": jobs,
        "unplaced_jobs": [],
        "commands": [
            {"node": node, "caps": [c.model_dump() for c in desired.get(node, [])]}
            for node in sorted(nodes)
        ],
        # Static per-GPU caps are held by each GPU's firmware: they couple no jobs.
        "sync": {"loops": [], "verdict": "safe"},
    }
