import numpy as np
import pytest

from agents.simulated import SimulatedBackend
from agents.telemetry import Sampler
from flexmodel.curves import operating_point
from flexmodel.jobmix import parse_job_mix


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


MIX = parse_job_mix(
    {
        "jobs": [
            {
                "id": "big",
                "gpus": 6,
                "power_w": 640.0,
                "throughput": 30000.0,
                "pfi": 1.3,
                "period_s": 2.4,
                "duty": 0.75,
                "comm_power_fraction": 0.5,
                "placement": [{"node": "n1", "gpus": [0, 1, 2, 3, 4, 5]}],
            },
            {
                "id": "small",
                "gpus": 2,
                "power_w": 520.0,
                "throughput": 9000.0,
                "pfi": 2.1,
                "period_s": 1.1,
                "duty": 0.6,
                "comm_power_fraction": 0.5,
                "placement": [{"node": "n1", "gpus": [6, 7]}],
            },
        ]
    }
)


def mean_power(backend, clock, gpu, seconds, dt=0.005):
    values = []
    for _ in range(int(seconds / dt)):
        clock.now += dt
        values.append(backend.power_w(gpu))
    return float(np.mean(values))


@pytest.mark.parametrize("cap", [700.0, 550.0, 420.0, 300.0])
def test_simulated_gpus_do_what_the_model_predicts(cap):
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0)
    for g in range(6):
        sim.set_limit_w(g, cap)
    power, throughput, _ = operating_point(MIX.curves, cap)
    assert sim.job_throughput()["big"] == pytest.approx(throughput[0], rel=1e-12)
    clock.now += 1.0  # past the firmware's settling
    assert mean_power(sim, clock, 0, 24.0) == pytest.approx(power[0], rel=0.01)
    assert mean_power(sim, clock, 0, 24.0) <= cap


def test_the_firmware_settles_on_a_new_cap_within_tens_of_milliseconds():
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0)
    sim.set_limit_w(0, 300.0)
    clock.now += 0.15  # five firmware time constants
    assert sim.power_w(0) <= 300.0 * 1.01


def test_a_cap_stretches_the_iteration_and_telemetry_sees_it():
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=8.0, seed=3)
    sampler = Sampler(
        sim, {"big": [0, 1, 2, 3, 4, 5], "small": [6, 7]}, sample_hz=20, window_s=60, clock=clock
    )
    for g in range(6):
        sim.set_limit_w(g, 560.0)  # between the job's communication (460 W) and compute levels
    _, _, period = operating_point(MIX.curves, [560.0, 700.0])
    for _ in range(1200):
        clock.now += 0.05
        sampler.sample_once()
    found = {j.job_id: j for j in sampler.job_telemetry()}
    assert found["big"].period_s == pytest.approx(period[0], rel=0.05)
    assert found["small"].period_s == pytest.approx(period[1], rel=0.05)
    assert found["big"].phase_rad is not None
    assert found["small"].duty == pytest.approx(0.6, abs=0.05)
    for g in range(6):
        sim.set_limit_w(g, 420.0)  # below both levels: the waveform is clipped flat
    for _ in range(1200):
        clock.now += 0.05
        sampler.sample_once()
    flat = {j.job_id: j for j in sampler.job_telemetry()}["big"]
    assert flat.period_s is None  # said, not guessed
    assert flat.power_w == pytest.approx(420.0, rel=0.02)


def test_placement_must_fit_the_node():
    from agents.errors import InvalidSetupError

    with pytest.raises(InvalidSetupError, match="GPU 4 of n1, which has 4 GPUs"):
        SimulatedBackend(4, mix=MIX, node_id="n1")
