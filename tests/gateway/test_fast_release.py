"""The end of a fast event along the ramp-up limit (issue 39; docs/fast.md, "The end of a
fast event"). On the stepped clock, a whole simulated site in one process (`SimulatedSite`:
its agents hold armed plans and leases as real ones; the truth is the declared mix, so the
model is exact): a 40 % trigger for 60 s, then the site's power as it comes back. With
FLEXGATE_RAMP_UP_KW_PER_MIN set, neither the plans nor the site's power rise faster than the
limit, and nothing jumps at the trigger's end; unset, the caps end at once, as before."""

from __future__ import annotations

import asyncio
import copy

import pytest

from flexgate.lab.simsite import SimulatedSite, Truth
from gateway.agentclient.fast import MemoryFast
from gateway.services.fast import FastPath
from tests.gateway.conftest import site_jobs

SECRET = "fast-secret-0123456789abcdef"
PERIOD_S = 5.0
DURATION_S = 60.0
DEPTH = 40.0


async def settle() -> None:
    """Let every task the last step woke run to its next sleep."""
    for _ in range(50):
        await asyncio.sleep(0)


def run(
    tmp_path,
    up_kw_per_min: float | None,
    restart_at_s: float | None = None,
    ordinary_kw: float | None = None,
) -> tuple[list[float], float, FastPath, str]:
    """The site's shed (its uncapped facility power less its power now) every period from the
    trigger, the depth's planned reduction, the fast path and the event's id. `restart_at_s`:
    the gateway's fast path stops then, and a new one starts on the same store.
    `ordinary_kw`: an ordinary event's target held from before the trigger to the end."""
    declared = site_jobs()
    truth = Truth(copy.deepcopy(declared), overhead_factor=1.3, static_kw=0.0)
    site = SimulatedSite(
        declared,
        truth,
        declared_overhead_factor=1.3,
        folder=tmp_path / "site",
        meter_period_s=PERIOD_S,
        tracking=False,
        lease_s=60.0,
        fast_depths="20,40",
        fast_secret=SECRET,
        ramp_up_kw_per_min=up_kw_per_min,
    )

    def fast_path() -> FastPath:
        return FastPath(
            site.settings,
            site.store,
            site.clock,
            site.fleet,
            site.book,
            MemoryFast(site.client, site.clock),
            release=site.targets,
        )

    fast = fast_path()

    async def go() -> tuple[list[float], str, float]:
        nonlocal fast
        await site.start()
        assert await fast.rearm() == len(site.nodes)
        await site.run_for(3 * PERIOD_S)
        uncapped_kw = site.meter.true_facility_kw()
        if ordinary_kw is not None:
            await site.targets.hold(ordinary_kw, "ev-ordinary")
            await site.run_for(6 * PERIOD_S)
        answer = await fast.trigger(DEPTH, DURATION_S)
        expected_kw = fast.expected_kw[DEPTH]
        sheds = []
        for k in range(round(600.0 / PERIOD_S)):
            if restart_at_s is not None and k * PERIOD_S == restart_at_s:
                fast.stop()
                fast = fast_path()
                await fast.start()
                assert fast.holding
                fast.expected_kw = {}  # not armed again yet: the release reads the record
            sheds.append(uncapped_kw - site.meter.true_facility_kw())
            await site.tick()
            for node in site.nodes.values():  # the agents' lease watcher
                node.controller.expire()
            await settle()
        return sheds, answer["event_id"], expected_kw

    try:
        sheds, event_id, expected_kw = asyncio.run(go())
    finally:
        fast.stop()
        site.targets.stop()
        site.close()
    return sheds, expected_kw, fast, event_id


def steepest_rise_kw_per_min(sheds: list[float]) -> float:
    """The largest fall of the shed (the site's power rising) within any minute."""
    span = round(60.0 / PERIOD_S)
    return max(
        sheds[i] - sheds[j]
        for i in range(len(sheds))
        for j in range(i + 1, min(i + span + 1, len(sheds)))
    )


def test_the_end_of_a_fast_event_releases_along_the_ramp_up_limit(tmp_path):
    free, depth_kw, _, _ = run(tmp_path / "free", None)
    end = round(DURATION_S / PERIOD_S)
    assert free[end - 1] == pytest.approx(depth_kw, rel=0.1)  # the depth held to the end
    assert abs(free[end + 1]) < 0.05 * depth_kw  # then all of it back at once
    up = depth_kw / 3.0  # three minutes to release the whole depth
    sheds, depth_kw, fast, event_id = run(tmp_path / "limited", up)
    assert sheds[end - 1] == pytest.approx(depth_kw, rel=0.1)
    # The site's power never rises faster than the limit, from the trigger's end on ...
    assert steepest_rise_kw_per_min(sheds[end - 2 :]) <= 1.05 * up
    # ... and no step at the end: the ordinary plan had taken the shed over.
    assert sheds[end + 1] >= sheds[end - 1] - up * 2 * PERIOD_S / 60.0 - 0.02 * depth_kw
    # It comes all the way back once the limit has had its time.
    assert abs(sheds[-1]) < 0.05 * depth_kw
    assert sheds[end + round(120.0 / PERIOD_S)] > 0.2 * depth_kw  # not before
    # The planned reductions kept to the limit, as the fast event's ramp record says.
    report = fast.release.ramp.reports[event_id].doc()
    assert report["steepest_up_kw_per_min"] <= up + 1e-6
    assert report["steepest_up_kw_per_min"] > 0.8 * up


def test_a_gateway_restarted_during_a_fast_event_still_releases_it_along_the_limit(tmp_path):
    """The fast path started again 30 s into the 60 s event: it holds the event from the
    store and releases it along the limit, from the depth its record planned."""
    _, depth_kw, _, _ = run(tmp_path / "free", None)
    up = depth_kw / 3.0
    sheds, _, _, _ = run(tmp_path / "restarted", up, restart_at_s=30.0)
    end = round(DURATION_S / PERIOD_S)
    assert sheds[end - 1] == pytest.approx(depth_kw, rel=0.1)
    assert steepest_rise_kw_per_min(sheds[end - 2 :]) <= 1.05 * up
    assert abs(sheds[-1]) < 0.05 * depth_kw


def test_a_fast_event_over_an_ordinary_one_ends_into_it_along_the_limit(tmp_path):
    """An ordinary event holds a quarter of the fast depth when the 40% trigger comes: at
    the fast event's end the site goes back to the ordinary event's shed, not at once (it
    did: the fast caps' lease ended under a plan of the ordinary shed) but along the up
    limit, down to that event's shed."""
    _, depth_kw, _, _ = run(tmp_path / "free", None)
    up = depth_kw / 3.0
    ordinary_kw = depth_kw / 4.0
    sheds, _, _, _ = run(tmp_path / "over", up, ordinary_kw=ordinary_kw)
    end = round(DURATION_S / PERIOD_S)
    assert sheds[end - 1] == pytest.approx(depth_kw, rel=0.1)
    assert steepest_rise_kw_per_min(sheds[end - 2 :]) <= 1.05 * up
    assert sheds[end + 1] >= sheds[end - 1] - up * 2 * PERIOD_S / 60.0 - 0.02 * depth_kw
    # The ordinary event's shed once the limit has had its time (2.25 minutes for the 3/4 of
    # the depth), before its plan's lease would need a renewal (no events service here).
    settled = sheds[end + round(150.0 / PERIOD_S)]
    assert settled == pytest.approx(ordinary_kw, abs=0.05 * depth_kw)
