"""A probe on simulated GPUs on simulated time: what the agents report of one job (bench, tests).

The job runs on one simulated node (its true curve, noise, optionally real jobs' irregularity);
its caps step through `caps_w` (the uncapped limit first), each held for `periods` iterations at
that cap plus the agents' settling, while the agent's sampler reads power and limits at 20 Hz on
a stepped clock. After the uncapped level the caps are kept where the job's power still shows
its period, as the gateway's probe keeps them (`gateway.services.probecaps.after_reference`).
The sampling instants jitter about their schedule (uniformly, within 40% of an
interval, never accumulating), as a sampler thread's do: a period that is a whole number of
sampling intervals would otherwise alias, every iteration sampled at the same phases, and bias
the mean power by up to a sample's share of the period. The answer is the agent's telemetry for
the job (`JobTelemetry` with its points per cap level), read at the end of every level as the
gateway reads it, and the truth at each cap. With `reference_every` the probe runs as the
gateway's does now (`flexmodel.drift.probe_steps`: the uncapped level again after the last cap
and after every `reference_every` caps) and records each step's stretch as it does
(`gateway.services.probecaps.record_stretch`): `measured`, what its drift fit reads.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.irregularity import Irregularity
from agents.levels import SETTLE_S
from agents.protocol import JobTelemetry
from agents.simulated import SimulatedBackend
from agents.telemetry import Sampler
from flexmodel.curves import operating_point
from flexmodel.drift import probe_steps
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import Job, JobMix
from gateway.services.probecaps import after_reference, record_stretch

SAMPLE_HZ = 20.0
#: The most GPUs of a job one simulated node runs (a synchronous job's GPUs iterate together,
#: so a larger job's relative curve is the same).
NODE_GPUS = 8
#: How far a sampling instant strays from its schedule, in sampling intervals.
JITTER = 0.4


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class ProbeRun:
    job: Job  #: the job as simulated (on one node)
    reading: JobTelemetry  #: the agent's last telemetry for it
    truth: dict[float, tuple[float, float]]  #: cap -> (mean power per GPU, throughput)
    caps_w: list[float]  #: the caps it ran, uncapped first
    seconds: float  #: simulated time the probe took [s]
    #: each step's stretch, in the order run (with `reference_every`; else empty)
    measured: list[dict[str, Any]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)  #: the levels in the order run


def run_probe(
    truth_doc: dict[str, Any],
    caps_w: list[float],
    *,
    periods: float = 20.0,
    noise_w: float = 5.0,
    seed: int = 0,
    irregularity: Irregularity | None = None,
    keep_visible: bool = True,
    reference_every: int | None = None,
) -> ProbeRun:
    """Step the job's caps through `caps_w` on a simulated node and read what the agent sees;
    `keep_visible`: after the uncapped level, the caps kept where the job's power shows its
    period, as the gateway's probe keeps them (`after_reference`: none lower when its power
    shows no period there, or has no room); `reference_every`: with uncapped references as the
    gateway's probe runs them (None: down once, no references)."""
    doc = copy.deepcopy(truth_doc)
    gpus = min(int(doc["gpus"]), NODE_GPUS)
    doc |= {"gpus": gpus, "placement": [{"node": "sim", "gpus": list(range(gpus))}]}
    mix = parse_job_mix({"jobs": [doc]})
    clock = _Clock()
    backend = SimulatedBackend(
        gpus,
        mix=mix,
        node_id="sim",
        clock=clock,
        noise_w=noise_w,
        seed=seed,
        irregularity=irregularity,
    )
    probe = _Probe(mix, backend, gpus, clock, periods, caps_w, seed)
    steps = (
        list(range(len(caps_w)))
        if reference_every is None
        else probe_steps(len(caps_w) - 1, reference_every)
    )
    measured: list[dict[str, Any]] = []
    for step, level in enumerate(steps):
        if level >= len(caps_w):  # the job goes no lower (`after_reference`)
            continue
        cap = caps_w[level]
        reading = probe.hold(cap)
        if step == 0 and keep_visible and reading.points:  # as the gateway's probe does
            caps_w, _ = after_reference(caps_w, reading.points[-1])
        if reference_every is not None:
            record_stretch(measured, level, cap, reading.stretches)
    return ProbeRun(
        job=mix.jobs[0],
        reading=reading,
        truth=probe.truth,
        caps_w=caps_w,
        seconds=probe.seconds,
        measured=measured,
        steps=steps,
    )


class _Probe:
    """The agent's sampler on the simulated node, each cap held for its level's time while the
    sampling instants jitter about their schedule."""

    def __init__(
        self,
        mix: JobMix,
        backend: SimulatedBackend,
        gpus: int,
        clock: _Clock,
        periods: float,
        caps_w: list[float],
        seed: int,
    ) -> None:
        self.mix, self.backend, self.gpus = mix, backend, gpus
        self.clock, self.periods = clock, periods
        longest_s = max(self.at(cap)[2] for cap in caps_w)  # the deepest planned level's
        self.sampler = Sampler(
            backend,
            {mix.jobs[0].id: list(range(gpus))},
            sample_hz=SAMPLE_HZ,
            window_s=longest_s + 5.0,
            clock=clock,
        )
        self.rng = np.random.default_rng(seed + 1)
        self.samples = 0
        self.seconds = 0.0  #: simulated time held so far [s]
        self.truth: dict[float, tuple[float, float]] = {}  #: cap -> (mean power per GPU, thr.)

    def at(self, cap: float) -> tuple[float, float, float]:
        """(true mean power per GPU, throughput, the level's hold [s]) at `cap`."""
        power, thr, period = (float(v[0]) for v in operating_point(self.mix.curves, cap))
        return power, thr, self.periods * period + SETTLE_S + 0.5

    def hold(self, cap: float) -> JobTelemetry:
        """The cap held for its level's time, sampled; the agent's telemetry for the job then."""
        power, thr, hold_s = self.at(cap)
        self.truth[cap] = (power, thr)
        for g in range(self.gpus):
            self.backend.set_limit_w(g, cap)
        dt = 1.0 / SAMPLE_HZ
        for _ in range(int(hold_s * SAMPLE_HZ)):
            self.samples += 1
            self.clock.now = self.samples * dt + float(self.rng.uniform(-JITTER, JITTER)) * dt
            self.sampler.sample_once()
        self.seconds += hold_s
        return self.sampler.job_telemetry()[0]
