"""Opening the store: SQLite (WAL) by default, PostgreSQL when the URL says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, create_engine, select

from gateway.errors import StoreVersionError
from gateway.store.models import SCHEMA_VERSION, SchemaVersion


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
    with Session(engine) as session:
        row = session.exec(select(SchemaVersion)).first()
        if row is None:
            session.add(SchemaVersion(version=SCHEMA_VERSION))
            session.commit()
        elif row.version != SCHEMA_VERSION:
            raise StoreVersionError(
                f"the database holds schema version {row.version}, this gateway uses "
                f"{SCHEMA_VERSION}; migrate it or point FLEXGATE_DATABASE_URL elsewhere"
            )


class Store:
    """The open store: sessions for the services (objects stay readable after commit)."""

    def __init__(self, url: str) -> None:
        self.engine = open_engine(url)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()
