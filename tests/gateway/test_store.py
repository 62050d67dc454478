"""The store: its schema version, and what it keeps."""

import math
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlmodel import Session, create_engine

from flexmodel.calibration import OverheadCalibration
from flexmodel.meterpath import MeterPath
from gateway.errors import StoreVersionError
from gateway.store import repo
from gateway.store.db import open_engine
from gateway.store.models import SCHEMA_VERSION, EventRow, JobCurveRow, SchemaVersion, as_utc


@pytest.mark.parametrize(
    ("version", "message"),
    [(999, "schema version 999"), (2, r"schema version 2, .* upgrades from 3 on")],
)
def test_a_database_of_a_version_it_cannot_upgrade_is_refused_and_left_alone(
    tmp_path, version, message
):
    """Newer than this gateway, or older than its upgrades reach."""
    url = f"sqlite:///{tmp_path / 'g.db'}"
    engine = open_engine(url)
    with Session(engine) as s:
        s.get(SchemaVersion, 1).version = version
        s.commit()
    engine.dispose()
    with pytest.raises(StoreVersionError, match=message):
        open_engine(url)
    with Session(create_engine(url)) as s:
        assert s.get(SchemaVersion, 1).version == version


def test_generations_only_rise_across_sessions(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path / 'g.db'}")
    seen = []
    for _ in range(3):
        with Session(engine) as s:
            seen.append(repo.next_generation(s))
            s.commit()
    engine.dispose()
    reopened = open_engine(f"sqlite:///{tmp_path / 'g.db'}")
    with Session(reopened) as s:
        seen.append(repo.next_generation(s))
    reopened.dispose()
    assert seen == [1, 2, 3, 4]


def test_the_latest_calibration_is_the_newest_fit_and_survives_a_reopen(database_url):
    engine = open_engine(database_url)
    with Session(engine) as s:
        assert repo.latest_calibration(s) is None
    fits = [
        (
            datetime(2026, 3, 1, 12, tzinfo=UTC),
            OverheadCalibration(1.31, 0.01, 150.0, 2.0, MeterPath(5.0, 28.0), 7),
        ),
        (
            datetime(2026, 3, 2, 12, tzinfo=UTC),
            OverheadCalibration(
                1.27, 0.02, 160.0, 3.0, MeterPath(8.0, 30.0, 2.0, 0.5, 1.5, "identified"), 5
            ),
        ),
        (
            datetime(2026, 3, 1, 18, tzinfo=UTC),
            OverheadCalibration(1.40, 0.03, 140.0, 4.0, MeterPath(5.0, 25.0), 4),
        ),
    ]
    for at, fit in fits:  # the last one saved is not the newest
        with Session(engine) as s:
            repo.add_calibration(s, fit=fit, meter_source="modbus://10.0.0.5:502", at=at)
            s.commit()
    engine.dispose()
    reopened = open_engine(database_url)
    with Session(reopened) as s:
        latest = repo.latest_calibration(s)
        assert latest is not None
        saved = (latest.k, latest.k_stderr, latest.static_kw, latest.static_stderr_kw)
        assert saved == (1.27, 0.02, 160.0, 3.0)
        assert (latest.points, latest.meter_source) == (5, "modbus://10.0.0.5:502")
        path = (latest.dead_s, latest.dead_stderr_s, latest.tau_s, latest.tau_stderr_s)
        assert path == (8.0, 0.5, 30.0, 1.5)
        assert (latest.averaging_s, latest.path_source) == (2.0, "identified")
        assert latest.lag_s == pytest.approx(8.0 + 30.0 * math.log(2))
        assert as_utc(latest.at) == fits[1][0]
    reopened.dispose()


def test_a_database_of_the_previous_schema_is_upgraded_and_keeps_its_rows(database_url):
    """A version 3 database (no deliveries table, calibrations without the meter path) opens:
    the table is made, the columns added, the version recorded, and its rows are still there."""
    engine = open_engine(database_url)
    with Session(engine) as s:
        s.add(
            EventRow(
                id="ev-old",
                source="manual",
                status="completed",
                start=datetime(2026, 3, 1, 12, tzinfo=UTC),
                end=datetime(2026, 3, 1, 13, tzinfo=UTC),
                reduction_kw=5.0,
                intervals=[],
                created_at=datetime(2026, 3, 1, 11, tzinfo=UTC),
            )
        )
        s.get(SchemaVersion, 1).version = 3
        s.commit()
    with engine.begin() as connection:
        connection.execute(text("drop table deliveries"))
        for column in ("dead_s", "dead_stderr_s", "tau_s", "tau_stderr_s", "averaging_s"):
            connection.execute(text(f"alter table calibrations drop column {column}"))
        connection.execute(text("alter table calibrations drop column path_source"))
        connection.execute(
            text(
                "insert into calibrations (at, meter_source, k, k_stderr, static_kw, "
                "static_stderr_kw, lag_s, points) values "
                "('2026-03-01 12:00:00', 'modbus://m', 1.3, 0.01, 150, 2, 20, 5)"
            )
        )
    engine.dispose()
    reopened = open_engine(database_url)
    with Session(reopened) as s:
        assert s.get(SchemaVersion, 1).version == SCHEMA_VERSION
        assert repo.get_event(s, event_id="ev-old").reduction_kw == 5.0
        assert repo.deliveries(s, event_ids=["ev-old"]) == {}
        old = repo.latest_calibration(s)
        assert (old.k, old.lag_s, old.tau_s, old.path_source) == (1.3, 20.0, None, None)
    reopened.dispose()


def test_each_job_s_latest_curve_is_its_last_fit_and_survives_a_reopen(database_url):
    engine = open_engine(database_url)
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    for job_id, pfi in (("a", 1.2), ("b", 2.0), ("a", 1.3)):
        with Session(engine) as s:
            point = {"cap_w": 600.0, "power_w": 560.0, "throughput": 900.0, "periods": 20.0}
            repo.add_job_curve(
                s,
                curve=JobCurveRow(
                    job_id=job_id, at=at, source="measured", points=[point], fit={"pfi": pfi}
                ),
            )
            s.commit()
    engine.dispose()
    reopened = open_engine(database_url)
    with Session(reopened) as s:
        latest = repo.latest_job_curves(s)
    reopened.dispose()
    assert {job: row.fit["pfi"] for job, row in latest.items()} == {"a": 1.3, "b": 2.0}
    assert latest["a"].points[0]["cap_w"] == 600.0
