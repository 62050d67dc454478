"""Firm kW against what a site that is not as declared really sheds (issue 31, case 7).

The test suite's mismatched site (`test_tracking.mismatched`: GPUs drawing 15% less than
declared, overhead factor 1.45 for a declared 1.3, a 20 kW static load) is quoted on its
declaration by the gateway's quote service, and then driven with every job at its floor on
the stepped clock: what the true meter sheds there is the most the site can deliver.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from flexgate.lab.simsite import SimulatedSite
from gateway.services.quotes import Quotes
from gateway.store import repo
from gateway.store.models import EventRow
from tests.gateway.test_tracking import mismatched

WINDOW_S, CONFIDENCE = 3600.0, 0.9
SETTLE_S = 30.0


@pytest.fixture
def site(tmp_path):
    def make(tracking: bool) -> SimulatedSite:
        declared, truth = mismatched()
        return SimulatedSite(
            declared,
            truth,
            declared_overhead_factor=1.3,
            tracking=tracking,
            folder=tmp_path / "site",
        )

    made: list[SimulatedSite] = []
    yield lambda tracking=False: made.append(make(tracking)) or made[-1]
    for s in made:
        s.close()


def quotes_of(site: SimulatedSite) -> Quotes:
    return Quotes(site.settings, site.store, site.book, site.fleet)


def event(event_id: str, *, feasible: bool = True, status: str = "active") -> EventRow:
    now = datetime.now(UTC)
    return EventRow(
        id=event_id,
        source="manual",
        status=status,
        start=now,
        end=now + timedelta(hours=1),
        reduction_kw=20.0,
        intervals=[],
        feasible=feasible,
        created_at=now,
    )


def test_firm_kw_is_no_more_than_the_site_sheds_with_every_job_at_its_floor(site):
    site = site()

    async def run() -> tuple[dict, float]:
        await site.start()
        await site.run_for(SETTLE_S)
        quoted = quotes_of(site).firm(WINDOW_S, CONFIDENCE)
        uncapped_kw = site.meter.true_facility_kw()
        # Far beyond the site: the plan puts every job at its floor.
        await site.tracker.pursue("ev-floor", 1000.0, None)
        await site.run_for(SETTLE_S)
        return quoted, uncapped_kw - site.meter.true_facility_kw()

    quoted, floor_kw = asyncio.run(run())
    assert floor_kw == pytest.approx(16.68, abs=0.05)  # the true meter, every job at its floor
    assert quoted["achievable_kw"] == pytest.approx(21.05, abs=0.05)  # the declaration's
    assert quoted["firm_kw"] <= floor_kw
    assert quoted["firm_kw"] >= 0.6 * floor_kw  # not bought by promising nothing


def test_a_site_that_delivered_less_than_planned_quotes_less(site):
    """An event the model judged feasible (20 kW of a declared 21.05) that the site, with its
    loop, could not deliver: its record at the meter scales the next quotes' firm kW."""
    site = site(tracking=True)
    quotes = quotes_of(site)

    async def run() -> None:
        await site.start()
        with site.store.session() as s:
            repo.add_event(s, event=event("ev-1"))
            repo.add_event(s, event=event("ev-beyond", feasible=False, status="completed"))
            repo.add_delivery_sample(
                s,
                event_id="ev-beyond",
                meter_source="sim://facility",
                at=datetime.now(UTC),
                seconds=60.0,
                requested_kw=50.0,
                delivered_kw=16.0,
            )
            s.commit()
        await site.run_for(60.0)
        await site.tracker.pursue("ev-1", 20.0, None)
        await site.run_for(180.0)
        site.tracker.release()

    asyncio.run(run())
    model = quotes.firm(WINDOW_S, CONFIDENCE)["firm_kw"]
    assert quotes.history() == []  # an active event is not part of the record yet
    with site.store.session() as s:
        row = repo.get_event(s, event_id="ev-1")
        row.status = "completed"
        s.add(row)
        s.commit()
    quotes.history_changed()  # as `Events` does when an event completes
    doc = quotes.firm(WINDOW_S, CONFIDENCE)
    (used,) = quotes.history()  # the event asked beyond the model measures nothing of it
    assert used.event_id == "ev-1"
    ratio = used.delivered_kw / used.requested_kw
    assert 0.6 < ratio < 0.9  # the site sheds at most 16.7 kW of the 20 asked
    assert doc["firm_kw"] == pytest.approx(ratio * model)
