"""The 3.1 interval reports under the program's baseline rule (`FLEXGATE_REPORT_BASELINE`)
taken and stored by the OpenADR Alliance's 3.1.0 reference VTN (`refvtn`), sent with the VEN's
credentials as the VEN sends them: one interval per figure, each with its DATA_QUALITY, and a
report whose rule gives no baseline. The reports are those of the hand-worked settlement site
(`tests.gateway.test_ven_settled_reports`). Skipped, saying why, only where ../shared is
absent."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest

from gateway.openadr.reports31 import interval_report
from tests.gateway.test_settlement import START
from tests.gateway.test_ven_settled_reports import ASKED, SITE, event31, facility, settled_site
from tests.interop import refvtn

pytestmark = pytest.mark.timeout(refvtn.BUILD_S + 120)


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


def ven_token(vtn) -> str:
    answer = httpx.post(
        f"{vtn.url}/auth/token",
        data={
            "grant_type": "client_credentials",
            "client_id": refvtn.VEN_CLIENT,
            "client_secret": refvtn.VEN_SECRET,
        },
    )
    answer.raise_for_status()
    return str(answer.json()["access_token"])


@pytest.mark.parametrize("history_days", [20, 6], ids=["a baseline", "no baseline"])
def test_the_reference_vtn_stores_the_reports_under_the_programs_rule(
    vtn, database_url, history_days
):
    program = vtn.post("/programs", {"programName": f"settled-{history_days}"})
    event = vtn.post(
        "/events",
        {
            "programID": program["id"],
            "intervalPeriod": {"start": START.isoformat(), "duration": "PT15M"},
            "intervals": [{"id": 0, "payloads": [{"type": "SIMPLE", "values": [1]}]}],
        },
    )
    store, _, rule = settled_site(database_url, history_days=history_days)
    try:
        begin, end = START + timedelta(minutes=15), START + timedelta(minutes=30)
        settled = asyncio.run(rule.over("ev-1", begin, end))
    finally:
        store.close()
    body = event31(15, 2).model_copy(update={"id": event["id"]})
    report = interval_report(body, refvtn.VEN_CLIENT, ASKED, 1, begin, end, SITE, settled)
    answer = httpx.post(
        f"{vtn.url}/reports", json=report, headers={"Authorization": f"Bearer {ven_token(vtn)}"}
    )
    assert answer.status_code == 201, answer.text
    [kept] = [r for r in vtn.get("/reports") if r["eventID"] == event["id"]]
    expected = {"DEMAND": (70.0, "ESTIMATED"), "USAGE": (17.5, "ESTIMATED")}
    if history_days == 20:
        expected |= {"BASELINE": (110.0, "OK"), "DELTA_USAGE": (-40.0, "ESTIMATED")}
    assert facility(kept) == expected
    assert kept["resources"] == report["resources"]
