"""Safe mode (issue 32, ElaadNL's Grid Aware Charging profile): a program's fallback import
limit [kW], configured or taken from an event the operator designates by name, held while the
mock VTN (a real uvicorn server) answers 503 for longer than FLEXGATE_VTN_FALLBACK_AFTER_S,
lifted when it answers again, and recorded as an event of its own."""

from __future__ import annotations

import logging

import pytest

from flexgate.lab.mockvtn31 import LAB_CLIENT_ID, MockVtn31
from flexgate.serve import ServerThread, free_port
from gateway.openadr.safemode31 import parse_limits
from tests.gateway.test_ven31 import (
    SECRET,
    capped,
    mock_vtn,
    simple_event,
    stored,
    uncapped,
    ven_site,
)
from tests.gateway.test_ven31_security import settings

FALLBACK = "fallback-flexgate-dr"  #: the mock's program is named flexgate-dr


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="flexgate.ven31")
    return caplog


def limit_event(vtn, limit_kw):
    """The operator's designated event: it names the limit, it is not a request."""
    body = simple_event(vtn, start_s=1.0, interval_s=3600, intervals=1, eventName="safe-mode")
    body["intervals"][0]["payloads"] = [{"type": "IMPORT_CAPACITY_LIMIT", "values": [limit_kw]}]
    return vtn.add_event(body)


@pytest.mark.parametrize("source", ["configured", "designated event"])
def test_the_fallback_limit_holds_while_the_vtn_is_away_and_lifts_on_its_return(
    tmp_path, database_url, logs, source
):
    with mock_vtn() as vtn:
        configured = {"vtn_fallback_limits": "flexgate-dr=35"} if source == "configured" else {}
        with ven_site(
            tmp_path,
            database_url,
            vtn,
            webhook=False,
            vtn_poll_s=0.2,
            vtn_fallback_event="safe-mode",
            vtn_fallback_after_s=1.0,
            **configured,
        ) as site:
            baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
            limit_kw = round(0.8 * baseline, 1)
            if source == "configured":  # the limit the operator gave, below the site's load
                limit_kw = 35.0
                assert baseline - 15.0 < limit_kw < baseline
            else:
                designated = limit_event(vtn, limit_kw)
                site.wait(lambda: "fallback limit is" in logs.text, what="the limit learned")
                assert stored(site, designated["id"]) is None  # a definition, not acted on
            assert uncapped(site)

            vtn.down = True
            held = site.wait(
                lambda: (e := stored(site, FALLBACK)) and e["status"] == "active" and e,
                what="the fallback limit held",
            )
            assert held["reduction_kw"] == pytest.approx(max(baseline - limit_kw, 0), rel=1e-3)
            site.wait(lambda: capped(site), what="caps under the fallback limit")
            assert "safe mode: the VTN unreachable" in logs.text

            vtn.down = False
            site.wait(lambda: stored(site, FALLBACK)["status"] == "cancelled", what="lifted")
            site.wait(lambda: uncapped(site), what="the restore")
            assert "lifted" in logs.text
        assert not [r for r in vtn.reports if FALLBACK in r["eventID"]]  # the VTN's not told


@pytest.mark.parametrize("limits", ["flexgate-dr:40", "flexgate-dr=-5", "=40", "a=b"])
def test_a_fallback_limit_that_is_not_program_equals_kw_is_refused_at_start(limits):
    with pytest.raises(ValueError, match=r"FLEXGATE_VTN_FALLBACK_LIMITS: .* is not programName=kW"):
        settings(vtn_url="https://vtn.example/openadr3/3.1.0", vtn_fallback_limits=limits)
    good = settings(vtn_url="https://vtn.example/openadr3/3.1.0", vtn_fallback_limits="a b=1.5")
    assert parse_limits(good.vtn_fallback_limits) == {"a b": 1.5}


def test_the_fallback_limit_holds_while_the_vtn_is_stopped_and_lifts_when_it_restarts(
    tmp_path, database_url, logs
):
    """The VTN's server stopped (connections refused, not a 503) and started again on the same
    port: the configured limit is held while it is gone and lifted once it answers."""
    vtn = MockVtn31(clients={LAB_CLIENT_ID: SECRET})
    port = free_port()
    server = ServerThread(vtn.app, port=port)
    vtn.url = server.__enter__()
    vtn.program = vtn.add_program({"programName": "flexgate-dr"})
    try:
        with ven_site(
            tmp_path,
            database_url,
            vtn,
            webhook=False,
            vtn_poll_s=0.2,
            vtn_fallback_limits="flexgate-dr=35",
            vtn_fallback_after_s=1.0,
        ) as site:
            assert uncapped(site)
            server.__exit__(None, None, None)  # the VTN is gone: nothing listens on its port
            site.wait(
                lambda: (e := stored(site, FALLBACK)) and e["status"] == "active",
                what="the fallback limit held",
            )
            site.wait(lambda: capped(site), what="caps under the fallback limit")
            server = ServerThread(vtn.app, port=port)  # back, the same VTN on the same port
            server.__enter__()
            site.wait(lambda: stored(site, FALLBACK)["status"] == "cancelled", what="lifted")
            site.wait(lambda: uncapped(site), what="the restore")
    finally:
        server.__exit__(None, None, None)
