"""The jobs a simulated node runs (`agents.simulated`): where they are placed, where each is
in its iteration, and its pace at the caps in force.

Each job runs a two-level power waveform: a compute level and a communication level
(`flexmodel.curves.waveform_levels`), duty `duty`, period `period_s`. A cap slows the compute
phase exactly as flexmodel's curve says: the iteration period becomes
`period_s * X / x(cap)` (`flexmodel.curves.operating_point`), the communication time stays,
so the compute share grows (`SimJob.pace_at`).

A cap slows a job only while it computes. The phase [cycles] is the job's progress through
its iteration, compute in `[0, duty)` and communication in `[duty, 1)` of each cycle; it
advances at the capped pace (`duty / compute time`) in the compute part and at the uncapped
pace (`1 / period_s`) in the communication part (`advance`). Over whole iterations that is the
curve's period, so the throughput a cap leaves is the model's; within one, a cap that moves
at the iteration's rhythm slows jobs by where they are in their cycle. That is how a loop over
shared power couples jobs here: from the physics, not from a flag. A job's phase is one across
the nodes it spans (`job_phase`), as the GPUs of one synchronous job iterate together.

Each job shows the telemetry features of its true PFI (`job_features`): the DRAM copy product
of the feature model (`flexmodel.predictor.dram_copy_product`, with its scatter `feature_noise`
drawn from the job's id, so every node agrees), split into memory copy utilisation (what NVML
reads) and DRAM activity (what DCGM reads), constant while the job runs.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from agents.errors import InvalidSetupError
from flexmodel.curves import EXPONENT, STATIC_SHARE, Curves, operating_point, waveform_levels
from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import Job, JobMix
from flexmodel.predictor import DRAM_NOISE, dram_copy_product

#: Curve readings kept per job (`SimJob.readings`) before they are cleared
READINGS_KEPT = 64
#: The job a node runs when the mix places none on it.
DEFAULT_JOB = {
    "id": "default",
    "power_w": 650.0,
    "throughput": 20000.0,
    "period_s": 2.0,
    "duty": 0.8,
    "comm_power_fraction": 0.5,
}


def job_features(job_id: str, pfi: float, noise: float = DRAM_NOISE) -> tuple[float, float]:
    """(memory copy utilisation, DRAM activity), fractions, of a simulated job of this PFI:
    their product is the feature model's DRAM copy product, its scatter drawn from the id."""
    rng = np.random.default_rng(zlib.crc32(job_id.encode()))
    product = float(dram_copy_product(pfi, rng, noise))
    copy = min(1.0, 1.25 * math.sqrt(product))
    return copy, product / copy


def _true_pfi(job: Job) -> float:
    try:
        return job.pfi_value
    except FlexModelError:  # a sweep no cap slowed: as flexible as it gets
        return 10.0


def advance(phase: float, elapsed_s: float, duty: float, compute_s: float, comm_s: float) -> float:
    """The phase [cycles] `elapsed_s` later, at `duty / compute_s` cycles per second in the
    compute part of each cycle (`[0, duty)`) and `(1 - duty) / comm_s` in the rest."""
    if compute_s <= 0.0 or comm_s <= 0.0 or not 0.0 < duty < 1.0:
        return phase + elapsed_s / (compute_s + comm_s)
    whole = math.floor(elapsed_s / (compute_s + comm_s))
    start, left_s = math.floor(phase) + whole, elapsed_s - whole * (compute_s + comm_s)
    into = phase - math.floor(phase)  #: where in its cycle [0, 1)
    computing = into < duty
    for _ in range(3):  # less than a cycle is left: at most three parts of one
        rate = duty / compute_s if computing else (1.0 - duty) / comm_s
        part_s = ((duty if computing else 1.0) - into) / rate
        if left_s < part_s:
            break
        left_s -= part_s
        start, into = (start, duty) if computing else (start + 1, 0.0)
        computing = not computing
    rate = duty / compute_s if computing else (1.0 - duty) / comm_s
    return start + into + left_s * rate


def job_phase(job_id: str, period_s: float, now: float) -> float:
    """A job's phase [cycles] at `now`, the same on every node it spans (its GPUs iterate
    together): as if it had run uncapped since the clock's zero from an offset its id draws."""
    return (zlib.crc32(job_id.encode()) / 2**32 + now / period_s) % 1.0


@dataclass
class SimJob:
    id: str
    gpus: list[int]
    curve: Curves  #: one row
    period_s: float
    duty: float
    compute_w: float
    comm_w: float
    phase0: float = 0.0  #: cycles at t0
    t0: float = 0.0
    compute_s: float = 0.0  #: the compute part of an iteration at the present caps [s]
    compute_share: float = 0.0  #: of the iteration's time
    scale: float = 1.0
    throughput: float = 0.0
    static_share: float = STATIC_SHARE  #: the job's DVFS physics (`NodePhysics.clock_mhz`)
    exponent: float = EXPONENT
    mem_copy_util: float = 0.0  #: telemetry features (`job_features`)
    dram_active: float = 0.0
    stale: bool = True  #: the caps changed since the pace was computed
    mean_w: float = 0.0  #: per GPU, over an iteration at the present caps
    #: the curve read at each cap seen (mean power, throughput, period): a job's caps take
    #: few values, and a command sets its GPUs one by one
    readings: dict[float, tuple[float, float, float]] = field(default_factory=dict, repr=False)

    @property
    def comm_s(self) -> float:
        """The communication part of an iteration [s]: no cap slows it."""
        return (1.0 - self.duty) * self.period_s

    def reading(self, cap_w: float) -> tuple[float, float, float]:
        """The job's curve at `cap_w`: (mean power per GPU [W], throughput, period [s])."""
        if cap_w not in self.readings:
            if len(self.readings) >= READINGS_KEPT:
                self.readings.clear()
            mean, throughput, period = (float(v[0]) for v in operating_point(self.curve, cap_w))
            self.readings[cap_w] = (mean, throughput, period)
        return self.readings[cap_w]

    def pace_at(self, cap_w: float) -> None:
        """The pace, throughput and levels' scale at `cap_w`, the lowest limit of its GPUs:
        both levels clipped at the cap and scaled so that the mean power is the curve's."""
        mean, throughput, period = self.reading(cap_w)
        self.mean_w = mean
        self.compute_s = period - self.comm_s
        self.throughput = throughput
        self.compute_share = self.compute_s / period
        levels = self.compute_share * min(cap_w, self.compute_w) + (1 - self.compute_share) * min(
            cap_w, self.comm_w
        )
        self.scale = mean / levels if levels > 0 else 1.0
        self.stale = False


def place_jobs(
    mix: JobMix | None, node_id: str, gpus: int, feature_noise: float = DRAM_NOISE
) -> list[SimJob]:
    """The jobs `mix` places on node `node_id` of `gpus` GPUs; where it places none, one
    `DEFAULT_JOB` on every GPU. `InvalidSetupError` for a GPU the node lacks or placed twice."""
    taken: set[int] = set()
    jobs = []
    for job, indices, curve in _placements(mix, node_id, gpus):
        sim = _simulated(job, indices, curve, feature_noise)
        for g in indices:
            if g in taken:
                raise InvalidSetupError(f"GPU {g} of {node_id} is placed twice")
            taken.add(g)
        jobs.append(sim)
    return jobs


def _placements(mix: JobMix | None, node_id: str, gpus: int) -> list[tuple[Job, list[int], Curves]]:
    placed: list[tuple[Job, list[int], Curves]] = []
    if mix is not None:
        for j, job in enumerate(mix.jobs):
            for where in job.placement or ():
                if where.node == node_id:
                    bad = [g for g in where.gpus if g >= gpus]
                    if bad:
                        raise InvalidSetupError(
                            f"job '{job.id}' is placed on GPU {bad[0]} of {node_id}, which "
                            f"has {gpus} GPUs"
                        )
                    placed.append((job, list(where.gpus), mix.curves.select(slice(j, j + 1))))
    if not placed:
        default = parse_job_mix({"jobs": [DEFAULT_JOB | {"gpus": gpus}]})
        placed = [(default.jobs[0], list(range(gpus)), default.curves)]
    return placed


def _simulated(job: Job, indices: list[int], curve: Curves, feature_noise: float) -> SimJob:
    compute, comm = waveform_levels(job.power_w, job.duty, job.comm_power_fraction, job.max_cap_w)
    sim = SimJob(
        id=job.id,
        gpus=indices,
        curve=curve,
        period_s=job.period_s,
        duty=job.duty,
        compute_w=float(compute),
        comm_w=float(comm),
        static_share=STATIC_SHARE if job.static_share is None else job.static_share,
        exponent=EXPONENT if job.exponent is None else job.exponent,
    )
    sim.mem_copy_util, sim.dram_active = job_features(job.id, _true_pfi(job), feature_noise)
    return sim
