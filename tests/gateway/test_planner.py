"""The planner alone: targets beyond the site, and nodes planned as down."""

import json

import pytest

from flexmodel.loopresponse import ClosedLoopResponse
from flexmodel.loops import ControlLoop, job_unit_coupling
from gateway.services.fleet import LoopMeasurements
from gateway.services.jobbook import site_mix
from gateway.services.overhead import OverheadModel
from gateway.services.planner import plan
from gateway.settings import GatewaySettings
from tests.conftest import EXAMPLES

SETTINGS = GatewaySettings(api_token="planner-api-token-0123", agent_token="planner-agent-0123")
JOBS = json.loads((EXAMPLES / "site.json").read_text())["jobs"]
NODES = {p["node"] for j in JOBS for p in j["placement"]}
OVERHEAD = OverheadModel(
    SETTINGS.overhead_factor, SETTINGS.overhead_factor_stderr, SETTINGS.static_load_kw, "configured"
)


@pytest.mark.parametrize("facility_kw", [1e6, 1e300, 1.7e308])
def test_a_target_beyond_the_site_is_delivered_at_its_most(facility_kw):
    mix = site_mix(JOBS, OVERHEAD)
    most = plan(mix, 1e5, NODES, SETTINGS)
    doc = plan(mix, facility_kw, NODES, SETTINGS)
    assert doc["feasible"] is False
    assert doc["achieved_facility_kw"] == pytest.approx(most["achieved_facility_kw"])
    assert doc["shortfall_kw"] == pytest.approx(facility_kw - doc["achieved_facility_kw"])
    json.dumps(doc, allow_nan=False)  # stored and served as JSON


def test_a_node_down_gets_no_caps_and_its_jobs_give_nothing():
    mix = site_mix(JOBS, OVERHEAD)
    doc = plan(mix, 30.0, NODES, SETTINGS, down=frozenset({"node-09"}))
    assert doc["unreachable_nodes"] == ["node-09"]
    assert doc["unplaced_jobs"] == ["gpt-oss-20b-ft-x8"]
    assert doc["feasible"] is True
    assert doc["achieved_facility_kw"] == pytest.approx(30.0)
    commands = {c["node"]: c["caps"] for c in doc["commands"]}
    assert commands["node-09"] == []
    assert set(commands) == NODES
    everyone = {c["node"]: c["caps"] for c in plan(mix, 30.0, NODES, SETTINGS)["commands"]}
    assert everyone["node-09"]  # the most flexible job is capped when its node answers


def test_the_loops_are_judged_on_measured_periods_and_the_site_loop_as_it_runs():
    """Caps stretch periods: the verdict reads what the agents measure, not the declaration,
    and judges the site loop it is given (its closed-loop response); no site loop, no verdict
    on one."""
    mix = site_mix(JOBS, OVERHEAD)
    assert [loop["name"] for loop in plan(mix, 30.0, NODES, SETTINGS)["sync"]["loops"]] == [
        "firmware"
    ]
    site = ClosedLoopResponse(period_s=5.0, gain=0.5, window_s=20.0, dead_s=10.0, lag_s=3.0)
    declared = plan(mix, 30.0, NODES, SETTINGS, site_loop=site)["sync"]["loops"]
    gateway = next(loop for loop in declared if loop["name"] == "gateway")
    assert gateway["window_s"] == 20.0
    assert gateway["delay_s"] == pytest.approx(13.0)  # the meter's dead time and lag
    stretched = {j.id: 1.5 * j.period_s for j in mix.waving}
    measured = LoopMeasurements(stretched, {})
    unit = job_unit_coupling(mix.waving, list(stretched.values()), mix.overhead_factor)
    expected = ControlLoop("gateway", site, couples_jobs=True).evaluate(
        list(stretched.values()), [j.duty for j in mix.waving], gain_per_s=unit
    )
    loops = plan(mix, 30.0, NODES, SETTINGS, measured=measured, site_loop=site)["sync"]["loops"]
    gateway = next(loop for loop in loops if loop["name"] == "gateway")
    assert gateway["coupling_per_s"] == pytest.approx(expected["coupling_per_s"])
    assert gateway["verdict"] == expected["verdict"]


def test_scattering_during_an_event_spreads_rates_at_the_same_total():
    mix = site_mix(JOBS, OVERHEAD)
    plain = plan(mix, 30.0, NODES, SETTINGS)
    scattered = plan(mix, 30.0, NODES, SETTINGS, rate_spread=0.02)
    assert scattered["achieved_facility_kw"] == pytest.approx(
        plain["achieved_facility_kw"], abs=0.01
    )
    assert abs(scattered["scattering"]["power_change_facility_kw"]) < 0.01
    offsets = [j["rate_offset"] for j in scattered["jobs"]]
    assert max(offsets) - min(offsets) > 0.03  # of 0.04: some jobs sit at their bounds
    cost = scattered["scattering"]["throughput_cost_fraction"]
    lost = plain["throughput_after"] - scattered["throughput_after"]
    assert cost == pytest.approx(lost / plain["throughput_before"], rel=1e-9)
    assert 0.0 <= cost < 0.01
    for job, answer in zip(mix.jobs, scattered["jobs"], strict=True):
        floor = job.min_throughput_fraction
        assert answer["throughput_fraction"] >= floor - 1e-9
        if job.protected:
            assert answer["rate_offset"] == 0.0


def test_scattering_outside_events_only_slows_and_sheds_a_little():
    mix = site_mix(JOBS, OVERHEAD)
    doc = plan(mix, 0.0, NODES, SETTINGS, rate_spread=0.01)
    offsets = [j["rate_offset"] for j in doc["jobs"]]
    assert max(offsets) == 0.0
    assert min(offsets) == pytest.approx(-0.02)
    assert doc["achieved_facility_kw"] > 0.0  # caps can only slow: power falls too
    assert 0.0 < doc["scattering"]["throughput_cost_fraction"] < 0.02
    assert any(c["caps"] for c in doc["commands"])
