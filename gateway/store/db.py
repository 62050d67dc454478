"""Opening the store: SQLite (WAL) by default, PostgreSQL when the URL says so."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect, text
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, create_engine, select

from gateway.errors import StoreVersionError
from gateway.store.models import SCHEMA_VERSION, SchemaVersion

log = logging.getLogger("flexgate.gateway")

#: The schema's upgrades: for each version, the columns that bring a database of the version
#: before to it, as (table, column and its SQL type, which SQLite and PostgreSQL both read). A
#: table a version only adds needs nothing: `create_all` makes every missing table (whole: its
#: columns are then there already, and not added again). A database older than the first
#: version listed here less one is refused.
UPGRADES: dict[int, tuple[tuple[str, str], ...]] = {
    4: (),  # the tables deliveries, job_curves and pfi_records
    5: (  # the meter path beside each calibration, a ceiling's compliance in its delivery
        *(
            ("calibrations", column)
            for column in (
                "dead_s FLOAT",
                "dead_stderr_s FLOAT",
                "tau_s FLOAT",
                "tau_stderr_s FLOAT",
                "averaging_s FLOAT",
                "path_source VARCHAR",
            )
        ),
        *(
            ("deliveries", column)
            for column in (
                "limit_kw FLOAT",
                "limit_intervals INTEGER",
                "limit_intervals_above INTEGER",
                "limit_worst_kw FLOAT",
            )
        ),
    ),
    6: (),  # the tables meter_samples and meter_intervals
    7: (("events", "counted JSON"),),  # what the opt-in decision counted under a baseline
}


def open_engine(url: str) -> Engine:
    """An engine with the schema created and its version checked."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if str(path) != ":memory:":
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    SQLModel.metadata.create_all(engine)
    check_version(engine)
    return engine


def _sqlite_pragmas(connection: Any, _: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def check_version(engine: Engine) -> None:
    """Record the version of a new database, upgrade an older one, refuse anything else."""
    with Session(engine) as session:
        row = session.exec(select(SchemaVersion)).first()
        if row is None:
            session.add(SchemaVersion(version=SCHEMA_VERSION))
            session.commit()
            return
        held = row.version
        if held == SCHEMA_VERSION:
            return
        if not min(UPGRADES) - 1 <= held < SCHEMA_VERSION:
            raise StoreVersionError(
                f"the database holds schema version {held}, this gateway uses "
                f"{SCHEMA_VERSION} and upgrades from {min(UPGRADES) - 1} on; point "
                "FLEXGATE_DATABASE_URL elsewhere or run the gateway that wrote it"
            )
        for version in range(held + 1, SCHEMA_VERSION + 1):
            for table, column in UPGRADES[version]:
                present = {c["name"] for c in inspect(session.connection()).get_columns(table)}
                if column.split()[0] not in present:
                    session.execute(text(f"ALTER TABLE {table} ADD COLUMN {column}"))
        row.version = SCHEMA_VERSION
        session.add(row)
        session.commit()  # one transaction: a failed upgrade leaves the old version
        log.warning("upgraded the database from schema version %d to %d", held, SCHEMA_VERSION)


class Store:
    """The open store: sessions for the services (objects stay readable after commit)."""

    def __init__(self, url: str) -> None:
        self.engine = open_engine(url)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def ping(self) -> None:
        """One round trip to the store; `OperationalError` when it does not answer."""
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def close(self) -> None:
        self.engine.dispose()
