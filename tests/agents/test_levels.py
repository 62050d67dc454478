"""Each job's points per cap level, from its GPUs' power and limits (agents.levels)."""

import numpy as np
import pytest

from agents.levels import uniform
from agents.simulated import SimulatedBackend
from agents.telemetry import Sampler
from flexmodel.curves import operating_point
from tests.agents.test_simulated import MIX, Clock

JOBS = {"big": [0, 1, 2, 3, 4, 5], "small": [6, 7]}


def run(sampler, clock, seconds, read_every_s=5.0):
    """Sample at 20 Hz, reading the telemetry every few seconds as the gateway would."""
    for k in range(int(seconds * 20)):
        clock.now += 0.05
        sampler.sample_once()
        if k % int(read_every_s * 20) == 0:
            sampler.job_telemetry()
    return {j.job_id: j for j in sampler.job_telemetry()}


def step(sim, gpus, cap):
    for g in gpus:
        sim.set_limit_w(g, cap)


def test_each_cap_level_gives_power_and_relative_throughput_within_their_errors():
    """Three levels of 40 s each through a 60 s window: every level is kept, and its mean
    power and T_ref / T match what the simulated GPUs do, within a few stated errors."""
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=8.0, seed=5)
    sampler = Sampler(sim, JOBS, sample_hz=20, window_s=60, clock=clock)
    caps = [700.0, 620.0, 560.0]
    for cap in caps:
        step(sim, JOBS["big"], cap)
        found = run(sampler, clock, 40.0)["big"]
    assert found.cap_w == 560.0
    assert found.reference_cap_w == 700.0
    assert [p.cap_w for p in found.points] == sorted(caps)
    curve = MIX.curves.select(slice(0, 1))
    points = {c: [float(v[0]) for v in operating_point(curve, c)] for c in caps}
    truth = {c: (p, t / points[700.0][1]) for c, (p, t, _) in points.items()}
    for point in found.points:
        want_power, want_relative = truth[point.cap_w]
        assert point.periods >= 10
        assert point.power_stderr_w is not None
        assert point.power_stderr_w > 0
        assert abs(point.power_w - want_power) <= 4 * point.power_stderr_w + 1.0
        assert point.relative_throughput is not None
        error = point.relative_throughput_stderr
        assert abs(point.relative_throughput - want_relative) <= max(4 * error, 0.01)
    assert found.points[-1].relative_throughput == 1.0


def test_every_stretch_is_kept_with_its_times_a_repeated_level_too():
    """Uncapped, capped, uncapped again (a probe's references): `points` keeps one per cap,
    `stretches` all three in order, each with when it was measured; a run longer than the
    60 s window stays one stretch as the window slides over it."""
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=8.0, seed=5)
    sampler = Sampler(sim, JOBS, sample_hz=20, window_s=60, clock=clock)
    for cap, seconds in ((700.0, 90.0), (600.0, 30.0), (700.0, 30.0)):
        step(sim, JOBS["big"], cap)
        found = run(sampler, clock, seconds, read_every_s=1.0)["big"]
    assert [p.cap_w for p in found.points] == [600.0, 700.0]
    assert [p.cap_w for p in found.stretches] == [700.0, 600.0, 700.0]
    starts = [p.start_s for p in found.stretches]
    ends = [p.end_s for p in found.stretches]
    assert all(s is not None and e is not None for s, e in zip(starts, ends, strict=True))
    assert starts == sorted(starts)
    assert all(e <= s for e, s in zip(ends[:-1], starts[1:], strict=False))  # type: ignore[operator]
    assert ends[-1] == pytest.approx(clock.now, abs=2.5)
    assert all(p.relative_throughput is None and p.period_s for p in found.stretches)
    # one period, repeated: the references agree within their errors
    first, last = found.stretches[0], found.stretches[-1]
    assert first.period_s == pytest.approx(last.period_s, rel=0.02)


def test_a_level_with_no_clear_period_says_why_and_invents_no_throughput():
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=8.0, seed=3)
    sampler = Sampler(sim, JOBS, sample_hz=20, window_s=60, clock=clock)
    run(sampler, clock, 30.0)
    step(sim, JOBS["big"], 420.0)  # below both levels: the waveform is clipped flat
    found = run(sampler, clock, 30.0)["big"]
    flat = next(p for p in found.points if p.cap_w == 420.0)
    assert flat.period_s is None
    assert flat.relative_throughput is None
    assert "period" in (flat.no_period_reason or "") or "level" in (flat.no_period_reason or "")
    assert flat.power_w == pytest.approx(420.0, rel=0.02)
    assert found.period_s is None or found.period_confidence is not None


def test_a_job_never_capped_has_one_level_its_own_reference():
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=8.0, seed=1)
    sampler = Sampler(sim, JOBS, sample_hz=20, window_s=60, clock=clock)
    found = run(sampler, clock, 30.0)["small"]
    assert [p.cap_w for p in found.points] == [700.0]
    assert found.points[0].relative_throughput == 1.0
    assert found.period_confidence is not None
    assert 0 < found.period_confidence <= 1
    assert np.isfinite(found.points[0].period_s)


def test_samples_taken_late_are_put_back_on_the_uniform_grid_and_gaps_stay_gaps():
    """A sampler that ran late and caught up: read at their real times, the samples of a ramp
    give the ramp on the grid; where no sample was taken for a while, nothing is invented."""
    dt = 0.05
    late = np.array([0.0, 0.01, 0.04, 0.045, 0.0, 0.02, 0.0, 0.0, 0.03, 0.0])
    times = 10.0 + dt * np.arange(late.size) + late
    times = np.concatenate([times, times[-1] + dt * np.arange(5, 10)])  # a 0.25 s gap first
    ramp = 3.0 * times + 100.0
    grid = uniform(times, ramp, dt)
    expected = 3.0 * (10.0 + dt * np.arange(grid.size)) + 100.0
    known = np.isfinite(grid)
    assert known.sum() >= 12
    np.testing.assert_allclose(grid[known], expected[known], atol=1e-9)
    gap = (10.0 + dt * np.arange(grid.size) > times[9] + 1.5 * dt) & (
        10.0 + dt * np.arange(grid.size) < times[10] - 1.5 * dt
    )
    assert gap.any()
    assert not known[gap].any()


def test_the_phase_is_corrected_by_the_sensors_lag():
    """FLEXGATE_AGENT_SENSOR_LAG_S (here 0.1 s, an H200's instant field): the phase reported
    is the one read plus the sensor's phase at the job's period, 2 pi 0.1 / T."""
    from flexmodel.sensors import SensorModel, sensor_of

    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=2.0, seed=5)
    sampler = Sampler(sim, JOBS, sample_hz=20, window_s=60, clock=clock)
    assert sampler.sensor.lag_s == 0.0  # simulated readings are instantaneous
    assert Sampler(sim, JOBS, sensor_lag_s=0.1).sensor.lag_s == pytest.approx(0.1)
    read = run(sampler, clock, 30.0)["big"]
    sampler.sensor = SensorModel.of_lag(0.1)
    corrected = {j.job_id: j for j in sampler.job_telemetry()}["big"]
    assert read.phase_rad is not None
    assert corrected.phase_rad is not None
    moved = (corrected.phase_rad - read.phase_rad) % (2 * np.pi)
    assert moved == pytest.approx(2 * np.pi * 0.1 / read.period_s, abs=1e-6)
    assert sensor_of("NVIDIA H200", 0.0).lag_s == pytest.approx(0.1)  # the instant field
    assert sensor_of("NVIDIA A100", 1.0).lag_s == pytest.approx(0.55)  # the 1 s average
