"""The store: its schema version, and what it keeps."""

from datetime import UTC, datetime

import pytest
from sqlmodel import Session

from flexmodel.calibration import OverheadCalibration
from gateway.errors import StoreVersionError
from gateway.store import repo
from gateway.store.db import open_engine
from gateway.store.models import SchemaVersion, as_utc


def test_a_database_of_another_schema_version_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.db'}"
    engine = open_engine(url)
    with Session(engine) as s:
        s.get(SchemaVersion, 1).version = 999
        s.commit()
    engine.dispose()
    with pytest.raises(StoreVersionError, match="schema version 999"):
        open_engine(url)


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
            OverheadCalibration(1.31, 0.01, 150.0, 2.0, 28.0, 7),
        ),
        (
            datetime(2026, 3, 2, 12, tzinfo=UTC),
            OverheadCalibration(1.27, 0.02, 160.0, 3.0, 30.0, 5),
        ),
        (
            datetime(2026, 3, 1, 18, tzinfo=UTC),
            OverheadCalibration(1.40, 0.03, 140.0, 4.0, 25.0, 4),
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
        assert (latest.lag_s, latest.points, latest.meter_source) == (
            30.0,
            5,
            "modbus://10.0.0.5:502",
        )
        assert as_utc(latest.at) == fits[1][0]
    reopened.dispose()


def test_each_job_s_latest_curve_is_its_last_fit_and_survives_a_reopen(database_url):
    from gateway.store.models import JobCurveRow

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
    assert {job: row.fit["pfi"] for job, row in latest.items()} == {"a": 1.3, "b": 2.0}
    assert latest["a"].points[0]["cap_w"] == 600.0
    reopened.dispose()
