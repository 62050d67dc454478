"""The facility meter through the real gateway: `/v1/site` shows it, and when it answers
nonsense `/v1/site`, `/health` and `/metrics` say so (real uvicorn servers on loopback)."""

from __future__ import annotations

import math

from fastapi import FastAPI

from flexgate.serve import ServerThread
from tests.gateway.conftest import running_site
from tests.promtext import samples


class MeterServer:
    """An HTTP meter whose reading the test sets."""

    def __init__(self) -> None:
        self.kw: float = 80.0
        self.app = FastAPI()

        @self.app.get("/meter")
        def read() -> dict[str, float | str]:
            return {"facility_power_kw": "NaN" if math.isnan(self.kw) else self.kw}


def test_the_meter_shows_in_the_site_and_a_bad_reading_degrades_health(tmp_path):
    meter = MeterServer()
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    with (
        ServerThread(meter.app) as meter_url,
        running_site(
            tmp_path, database, meter_url=f"{meter_url}/meter", meter_period_s=0.2
        ) as site,
    ):
        reading = site.wait(
            lambda: (doc := site.api.get("/v1/site").json())["meter"]["fault"] is None and doc,
            what="a good meter reading",
        )
        assert reading["meter"]["estimated"] is False
        assert reading["meter"]["source"] == f"{meter_url}/meter"
        assert reading["facility_power_kw"] == 80.0
        assert reading["overhead"]["source"] == "configured"
        assert site.api.get("/health").json()["status"] == "ok"
        meter.kw = math.nan
        health = site.wait(
            lambda: (doc := site.api.get("/health").json())["status"] == "degraded" and doc,
            what="health degraded",
        )
        assert health["meter"]["fault"].startswith("not_finite")
        assert "meter" in health["degraded"][0]
        doc = site.api.get("/v1/site").json()
        assert doc["meter"]["fault"] is not None
        assert doc["facility_power_kw"] != 80.0  # the estimate stands in
        metrics = samples(site.api.get("/metrics").text)
        assert metrics["flexgate_meter_fault"] == 1
        assert metrics['flexgate_meter_rejected_total{reason="not_finite"}'] >= 1
        meter.kw = 81.0
        site.wait(lambda: site.api.get("/health").json()["status"] == "ok", what="recovery")
