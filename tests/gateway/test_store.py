"""The store: its schema version, and what it keeps."""

import pytest
from sqlmodel import Session

from gateway.errors import StoreVersionError
from gateway.store import repo
from gateway.store.db import open_engine
from gateway.store.models import SchemaVersion


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
