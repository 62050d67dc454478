import math

import numpy as np
import pytest

from agents.errors import InvalidSetupError
from agents.irregularity import Irregularity
from agents.simphysics import MAX_CLOCK_MHZ
from agents.simulated import CLOCK_STEP_MHZ, SimulatedBackend
from agents.telemetry import Sampler
from flexmodel.curves import EXPONENT, STATIC_SHARE, clock_fraction, operating_point
from flexmodel.jobmix import parse_job_mix
from flexmodel.phases import estimate_waveform
from flexmodel.sensors import SENSORS, SensorModel


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


def test_setting_the_limit_a_gpu_already_has_changes_nothing():
    """A renewal sets every GPU's limit again; the simulated GPUs skip the work, and what they
    draw must be exactly what they would draw had the limit been set again (the firmware's
    approach is exponential: starting it again from where it is follows the same path)."""
    clock_a, clock_b = Clock(), Clock()
    renewed = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock_a, noise_w=0.0)
    left = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock_b, noise_w=0.0)
    for sim in (renewed, left):
        for g in range(6):
            sim.set_limit_w(g, 420.0)
    trace_a, trace_b = [], []
    for step in range(400):
        clock_a.now = clock_b.now = 0.004 * (step + 1)
        if step % 7 == 0:  # mid-transition and after it
            for g in range(8):
                renewed.set_limit_w(g, renewed.enforced_limit_w(g))
        trace_a.append([renewed.power_w(g) for g in range(8)])
        trace_b.append([left.power_w(g) for g in range(8)])
    assert np.allclose(trace_a, trace_b, rtol=1e-12, atol=1e-9)
    assert renewed.job_throughput() == left.job_throughput()


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


def _trace(sim, clock, gpus, seconds, hz=20.0):
    values = []
    for _ in range(int(seconds * hz)):
        clock.now += 1.0 / hz
        values.append(np.mean([sim.power_w(g) for g in gpus]))
    return np.array(values)


def test_irregularity_is_off_by_default():
    runs = []
    for irregularity in (None, Irregularity()):
        clock = Clock()
        sim = SimulatedBackend(
            8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0, irregularity=irregularity
        )
        runs.append(_trace(sim, clock, [0], 30.0))
    assert np.array_equal(runs[0], runs[1])


IRREGULAR = Irregularity(
    jitter=0.03, pause_every=20, pause_periods=4.0, drift_w=10.0, drift_period_s=150.0
)


def test_an_irregular_job_keeps_its_period_and_duty_for_the_estimator():
    """Jitter, a pause of four iterations every twenty and drift: the estimator still finds
    the job's period and duty, and sets the pauses aside."""
    clock = Clock()
    sim = SimulatedBackend(
        8, mix=MIX, node_id="n1", clock=clock, noise_w=5.0, irregularity=IRREGULAR
    )
    power = _trace(sim, clock, range(6), 300.0)
    found = estimate_waveform(power, 0.05, max_period_s=20.0)
    assert found.period_s == pytest.approx(2.4, rel=0.02)
    assert found.duty == pytest.approx(0.75, abs=0.03)
    assert found.paused_share > 0.1  # 4 of every 24 periods
    regular = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=5.0)
    steady = estimate_waveform(_trace(regular, clock, range(6), 300.0), 0.05, max_period_s=20.0)
    assert found.confidence < steady.confidence  # jitter shows


def test_an_irregular_job_iterates_alike_on_every_node_it_spans():
    doc = {
        "id": "wide",
        "gpus": 2,
        "power_w": 600.0,
        "throughput": 1000.0,
        "period_s": 1.5,
        "duty": 0.7,
        "placement": [{"node": "n1", "gpus": [0]}, {"node": "n2", "gpus": [0]}],
    }
    mix = parse_job_mix({"jobs": [doc]})
    traces = []
    for node in ("n1", "n2"):
        clock = Clock()
        sim = SimulatedBackend(
            1, mix=mix, node_id=node, clock=clock, noise_w=0.0, irregularity=IRREGULAR
        )
        traces.append(_trace(sim, clock, [0], 60.0))
    assert np.array_equal(traces[0], traces[1])
    assert np.ptp(traces[0]) > 100  # and it does wave


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"jitter": 0.5}, "jitter must be from 0 to 0.3"),
        ({"pause_every": -1}, "at least 0"),
        ({"drift_period_s": 0.0}, "must be positive"),
        ({"pace_drift_per_s": 0.01}, "pace_drift_per_s must be within"),
    ],
)
def test_impossible_irregularity_is_refused(options, message):
    with pytest.raises(InvalidSetupError, match=message):
        Irregularity(**options)


def cycle_position(sim: SimulatedBackend, job: str) -> float:
    return sim.job_phases()[job] % 1.0


def test_a_cap_slows_a_job_only_while_it_computes():
    clock = Clock()
    free = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0)
    in_comm = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0)
    in_compute = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0)
    duty = MIX.jobs[0].duty  # "big": compute in [0, 0.75) of each cycle
    while not 0.76 < cycle_position(free, "big") < 0.78:  # just into communication
        clock.now += 0.001
    for g in range(6):
        in_comm.set_limit_w(g, 400.0)
    clock.now += 0.4  # communication lasts 0.25 * 2.4 s = 0.6 s
    assert duty < cycle_position(free, "big") < 1.0
    for g in range(6):
        in_comm.set_limit_w(g, 700.0)
    clock.now += 2.0
    # capped only while communicating: not slowed at all
    assert in_comm.job_phases()["big"] == pytest.approx(free.job_phases()["big"], abs=1e-9)
    while not 0.05 < cycle_position(free, "big") < 0.06:  # early in a compute part
        clock.now += 0.001
    behind = free.job_phases()["big"] - in_compute.job_phases()["big"]
    for g in range(6):
        in_compute.set_limit_w(g, 400.0)
    clock.now += 0.4
    for g in range(6):
        in_compute.set_limit_w(g, 700.0)
    clock.now += 2.0
    lost = free.job_phases()["big"] - in_compute.job_phases()["big"] - behind
    _, _, capped = operating_point(MIX.curves, [400.0, 700.0])
    compute_s = capped[0] - (1 - duty) * MIX.jobs[0].period_s
    # 0.4 s of compute at the capped pace instead of the uncapped one
    assert lost == pytest.approx(0.4 / MIX.jobs[0].period_s - 0.4 * duty / compute_s, rel=1e-6)
    assert lost > 0.02


@pytest.mark.parametrize("cap", [650.0, 450.0, 250.0])
def test_over_whole_iterations_a_cap_gives_the_curves_period(cap):
    clock = Clock()
    sim = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0)
    for g in range(6):
        sim.set_limit_w(g, cap)
    start = sim.job_phases()["big"]
    _, _, period = operating_point(MIX.curves, [cap, 700.0])
    clock.now += 37.3 * period[0]
    assert sim.job_phases()["big"] - start == pytest.approx(37.3, abs=0.75)
    clock.now += 62.7 * period[0]
    assert sim.job_phases()["big"] - start == pytest.approx(100.0, abs=1e-6)


SENSED = parse_job_mix(
    {
        "jobs": [
            {
                "id": f"t{period:g}",
                "gpus": 1,
                "power_w": 500.0,
                "throughput": 1000.0,
                "pfi": 1.5,
                "period_s": period,
                "duty": 0.5,
                "comm_power_fraction": 0.4,
                "placement": [{"node": "n1", "gpus": [g]}],
            }
            for g, period in enumerate((0.6, 2.0, 4.0))
        ]
    }
)


def agent_phases(sensor: SensorModel | None, sensor_lag_s: float | None) -> dict[str, float]:
    """Each job's phase as the agent reports it, carried to one instant [rad]."""
    clock = Clock()
    sim = SimulatedBackend(3, mix=SENSED, node_id="n1", clock=clock, noise_w=2.0, sensor=sensor)
    jobs = {j.id: [g] for j, g in zip(SENSED.jobs, range(3), strict=True)}
    sampler = Sampler(sim, jobs, sample_hz=20, window_s=30, clock=clock, sensor_lag_s=sensor_lag_s)
    # The agent's 20 Hz does not keep time with the sensor's 10 Hz updates (an NVML reading's
    # age at a sample is anything from 0 to 100 ms): 50.6 ms apart, the ages sweep it evenly.
    for _ in range(600):
        clock.now += 0.0506
        sampler.sample_once()
    out = {}
    for job in sampler.job_telemetry():
        assert job.phase_rad is not None
        assert job.phase_at is not None
        assert job.period_s is not None
        out[job.job_id] = job.phase_rad + 2 * np.pi * (clock.now - job.phase_at) / job.period_s
    return out


def test_the_agent_takes_its_gpus_sensor_lag_out_of_the_phases_it_reports():
    """A simulated H200 reads through its sensor (each reading held 100 ms, the mean of the
    last 100 ms): the agent knows it from the backend and corrects the phase it reports to
    within 0.3 rad of what it reads from the power as it is, at periods 0.6-4 s; told the
    sensor has no lag, it reports the phase late by the sensor's `2 pi 0.1 / T`."""
    truth = agent_phases(None, None)
    corrected = agent_phases(SENSORS["H200"], None)
    ignored = agent_phases(SENSORS["H200"], 0.0)

    def gap(a: float, b: float) -> float:
        return float(np.angle(np.exp(1j * (a - b))))

    for job in SENSED.jobs:
        assert abs(gap(corrected[job.id], truth[job.id])) < 0.3, job.id
        late = 2 * np.pi * SENSORS["H200"].lag_s / job.period_s
        assert gap(truth[job.id], ignored[job.id]) == pytest.approx(late, abs=0.3), job.id


def test_a_drifting_pace_changes_throughput_by_its_rate_capped_or_not():
    """`pace_drift_per_s` 2e-4: 100 s in, the job iterates exp(0.02) times as fast as it did at
    the start, at its limit (exactly, at any instant) and under a cap (over whole iterations)."""
    clock = Clock()
    irregular = Irregularity(pace_drift_per_s=2e-4)
    drifting = SimulatedBackend(
        8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0, irregularity=irregular
    )
    steady = SimulatedBackend(8, mix=MIX, node_id="n1", clock=clock, noise_w=0.0)

    def phase(sim: SimulatedBackend) -> float:
        return sim.job_phases()["big"]

    clock.now = 100.0
    before = phase(drifting)
    clock.now += 0.01
    rate = (phase(drifting) - before) / 0.01 * MIX.jobs[0].period_s
    assert rate == pytest.approx(math.exp(2e-4 * 100.0), rel=1e-3)
    for sim in (drifting, steady):
        for g in range(6):
            sim.set_limit_w(g, 450.0)
    start, before = clock.now, {sim: phase(sim) for sim in (drifting, steady)}
    clock.now += 500.0
    ratio = (phase(drifting) - before[drifting]) / (phase(steady) - before[steady])
    want = (irregular.job_time(clock.now) - irregular.job_time(start)) / 500.0
    assert ratio == pytest.approx(want, rel=5e-3)
    assert want > 1.03


def shaped_mix(static_share: float | None, exponent: float | None):
    doc = {
        "id": "shaped",
        "gpus": 2,
        "power_w": 600.0,
        "throughput": 10000.0,
        "pfi": 1.5,
        "period_s": 2.0,
        "duty": 0.8,
        "comm_power_fraction": 0.5,
        "placement": [{"node": "n1", "gpus": [0, 1]}],
    }
    if static_share is not None:
        doc |= {"static_share": static_share, "exponent": exponent}
    return parse_job_mix({"jobs": [doc]})


def compute_clocks(backend, clock, seconds=6.0, dt=0.01):
    """The SM clock readings of GPU 0 while its job computes (power at the compute level)."""
    job = backend.jobs[0]
    out = []
    for _ in range(int(seconds / dt)):
        clock.now += dt
        if backend.job_phases()[job.id] % 1.0 < job.duty - 0.02:
            out.append(backend.sm_clock_mhz(0))
    return np.array(out)


@pytest.mark.parametrize(("static_share", "exponent"), [(0.08, 1.3), (0.22, 2.0), (None, None)])
def test_the_sm_clock_follows_the_job_s_own_dvfs_physics_in_steps(static_share, exponent):
    """Uncapped, the GPU runs at its boost clock; capped, the compute phase runs at the clock
    whose power fraction `s + (1 - s) f^a` of the job's own shape (the family's where it gives
    none) is what the cap leaves of its compute level, read in 15 MHz steps with noise."""
    clock = Clock()
    backend = SimulatedBackend(2, mix=shaped_mix(static_share, exponent), node_id="n1", clock=clock)
    assert set(compute_clocks(backend, clock, 2.0)) == {MAX_CLOCK_MHZ}
    job = backend.jobs[0]
    cap = 0.7 * job.compute_w
    backend.set_limit_w(0, cap)
    clock.now += 1.0
    read = compute_clocks(backend, clock)
    s = STATIC_SHARE if static_share is None else static_share
    a = EXPONENT if exponent is None else exponent
    expected = MAX_CLOCK_MHZ * float(clock_fraction(0.7, s, a))
    assert np.all(read % CLOCK_STEP_MHZ == 0)
    assert read.mean() == pytest.approx(expected, abs=3.0)
    assert 0 < read.std() < 20.0
    assert backend.sm_clock_mhz(1) == MAX_CLOCK_MHZ  # its limit unchanged: not held back


def test_the_agent_reports_each_gpu_s_clock_and_each_level_s_compute_clock():
    """Telemetry carries the SM clock: each GPU's recent mean, the job's mean, and per cap
    level the mean in the compute phase, which is the clock the cap left (within a few MHz)."""
    clock = Clock()
    backend = SimulatedBackend(2, mix=shaped_mix(0.1, 1.8), node_id="n1", clock=clock, seed=4)
    sampler = Sampler(backend, {"shaped": [0, 1]}, sample_hz=20.0, window_s=120.0, clock=clock)
    cap = 0.75 * backend.jobs[0].compute_w
    for seconds, limit in ((30.0, 700.0), (30.0, cap)):
        for g in (0, 1):
            backend.set_limit_w(g, limit)
        for _ in range(int(seconds * 20)):
            clock.now += 0.05
            sampler.sample_once()
    reading = sampler.job_telemetry()[0]
    capped = next(p for p in reading.points if p.cap_w == cap)
    uncapped = next(p for p in reading.points if p.cap_w == 700.0)
    assert uncapped.compute_sm_clock_mhz == MAX_CLOCK_MHZ
    assert capped.compute_sm_clock_mhz == pytest.approx(
        MAX_CLOCK_MHZ * float(clock_fraction(0.75, 0.1, 1.8)), abs=4.0
    )
    assert capped.compute_sm_clock_stderr_mhz is not None
    # The mean over the whole level mixes in the communication phase at the full clock.
    assert capped.compute_sm_clock_mhz < capped.sm_clock_mhz < MAX_CLOCK_MHZ
    assert reading.sm_clock_mhz is not None
    assert reading.sm_clock_mhz < MAX_CLOCK_MHZ
    gpus = sampler.gpu_power(last=20)
    assert all(g.sm_clock_mhz is not None for g in gpus)
