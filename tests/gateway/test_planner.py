"""The planner alone: targets beyond the site, and nodes planned as down."""

import json

import pytest

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


def test_the_loops_are_judged_on_measured_periods_and_the_delays_distribution():
    """Caps stretch periods and delays are spread: the verdict reads what the agents measure
    (the capped periods, the dispatch's and the actuation's delays), not the declaration."""
    mix = site_mix(JOBS, OVERHEAD)
    declared = plan(mix, 30.0, NODES, SETTINGS)["sync"]["loops"]
    longest = max(j.period_s for j in mix.waving)
    gateway = next(loop for loop in declared if loop["name"] == "gateway")
    assert gateway["window_s"] == pytest.approx(3 * longest)
    assert gateway["delays_measured"] == 0
    stretched = {j.id: 1.5 * j.period_s for j in mix.waving}
    measured = LoopMeasurements(stretched, {}, dispatch_s=(0.02, 0.04), actuation_s=(0.1, 0.3, 0.2))
    loops = plan(mix, 30.0, NODES, SETTINGS, measured=measured)["sync"]["loops"]
    gateway = next(loop for loop in loops if loop["name"] == "gateway")
    assert gateway["window_s"] == pytest.approx(3 * 1.5 * longest)
    assert gateway["delays_measured"] == 6  # every dispatch with every actuation
    assert gateway["delay_s"] == pytest.approx(SETTINGS.reconcile_period_s + 0.03 + 0.2)
    assert gateway["delay_p99_s"] > gateway["delay_s"]


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
