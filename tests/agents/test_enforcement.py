"""A simulated GPU holds a lowered limit as a real board does (agents/enforcement.py): the
average reaches the limit over the controller's time constant, the instants swing above it,
and the sensor reads all of it late. Stepped time throughout."""

import math

import numpy as np
import pytest

from agents.enforcement import H200, IDEAL, Enforcement
from agents.errors import InvalidSetupError
from agents.simulated import SimulatedBackend
from flexmodel.curves import operating_point
from flexmodel.jobmix import parse_job_mix
from flexmodel.sensors import SENSORS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def one_job(comm_power_fraction: float) -> object:
    return parse_job_mix(
        {
            "jobs": [
                {
                    "id": "train",
                    "gpus": 8,
                    "power_w": 640.0,
                    "throughput": 30000.0,
                    "pfi": 1.3,
                    "period_s": 2.4,
                    "duty": 0.75,
                    "comm_power_fraction": comm_power_fraction,
                    "placement": [{"node": "n1", "gpus": list(range(8))}],
                }
            ]
        }
    )


LIMIT_W = 400.0


def lowered(enforcement, *, sensor=None, steady=False):
    clock = Clock()
    mix = one_job(1.0 if steady else 0.5)
    sim = SimulatedBackend(
        8, mix=mix, node_id="n1", clock=clock, noise_w=0.0, sensor=sensor, enforcement=enforcement
    )
    clock.now = 10.0
    for g in range(8):
        sim.set_limit_w(g, LIMIT_W)
    return sim, clock, mix


def test_the_average_reaches_the_lowered_limit_over_the_controllers_time_constant():
    sim, clock, mix = lowered(H200)
    before = float(operating_point(mix.curves, 700.0)[0][0])
    held = float(operating_point(mix.curves, LIMIT_W)[0][0])
    assert held <= LIMIT_W
    assert sim.average_power_w(0, 10.0) == pytest.approx(before)
    # one time constant: 1/e of the step still to go; five: within 1% of it
    one = sim.average_power_w(0, 10.0 + H200.controller_s)
    assert one == pytest.approx(held + (before - held) / math.e, rel=1e-9)
    assert abs(sim.average_power_w(0, 10.0 + 5 * H200.controller_s) - held) < 0.01 * (before - held)
    # and the instants, averaged over whole swings and iterations, hold it
    clock.now = 12.0
    instants = []
    for _ in range(12000):  # 24 s, 2 ms apart
        clock.now += 0.002
        instants.append(sim.power_w(0))
    assert np.mean(instants) == pytest.approx(held, rel=0.01)
    assert np.mean(instants) <= LIMIT_W * 1.001  # the limit held on average (to sampling)


def test_instants_exceed_a_binding_limit_as_the_h200s_did_while_the_ideal_board_never_does():
    """The H200 at its 700 W limit peaked at 724-802 W (3-15% above): the simulated one, by
    the overshoot it is given (10%), and never beyond it."""
    peaks = {}
    for name, enforcement in (("h200", H200), ("ideal", IDEAL)):
        sim, clock, _ = lowered(enforcement, steady=True)
        clock.now = 14.0  # settled: 16 time constants
        values = []
        for _ in range(2000):  # 4 s: four swings
            clock.now += 0.002
            values.append(sim.power_w(0))
        peaks[name] = max(values)
    assert peaks["ideal"] <= LIMIT_W
    assert LIMIT_W * 1.09 < peaks["h200"] <= LIMIT_W * (1 + H200.overshoot) + 1e-9


def test_the_sensor_shows_the_step_later_than_the_power_held():
    """Through an H200's sensor (each reading held 100 ms, the mean of the last 100 ms) a
    node's summed reading reaches 90% of the step 0.05-0.2 s after the average does, and
    reads the old level until its first update after the change."""
    enforcement = Enforcement(controller_s=0.25, overshoot=0.0)
    sim, _, mix = lowered(enforcement, sensor=SENSORS["H200"], steady=True)
    times = 10.0 + np.arange(0, 2.0, 0.005)
    sensed, average = sim.site_power(times)
    before = 8 * float(operating_point(mix.curves, 700.0)[0][0])
    after = 8 * float(operating_point(mix.curves, LIMIT_W)[0][0])

    def t90(series):
        return times[np.argmax(before - series >= 0.9 * (before - after))] - 10.0

    assert t90(average) == pytest.approx(enforcement.controller_s * math.log(10), abs=0.006)
    assert 0.05 <= t90(sensed) - t90(average) <= 0.2
    assert sensed[times < 10.1][-1] == pytest.approx(before)  # the reading made before it


def test_site_power_sums_what_each_gpu_reads():
    sim, clock, _ = lowered(H200, sensor=SENSORS["H200"])
    times = 10.0 + np.arange(0, 1.0, 0.01)
    sensed, average = sim.site_power(times)
    for k in (3, 40, 99):
        clock.now = times[k]
        assert sensed[k] == pytest.approx(sum(sim.power_w(g) for g in range(8)))
        assert average[k] == pytest.approx(sum(sim.average_power_w(g) for g in range(8)))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"controller_s": -0.1}, "controller_s"),
        ({"controller_s": math.nan}, "controller_s"),
        ({"overshoot": 1.0}, "overshoot"),
        ({"overshoot": -0.01}, "overshoot"),
        ({"fluctuation_s": 0.0}, "fluctuation_s"),
    ],
)
def test_a_bad_enforcement_model_is_refused_naming_the_figure(kwargs, named):
    with pytest.raises(InvalidSetupError, match=named):
        Enforcement(**kwargs)
