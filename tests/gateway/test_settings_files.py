"""Settings a site keeps in files: the agents one a line (FLEXGATE_AGENTS_FILE) and the store's
password (FLEXGATE_DATABASE_PASSWORD_FILE), each refused with one clear error when wrong."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from gateway.settings import GatewaySettings
from gateway.settingsfiles import url_with_password
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN, POSTGRES, postgres_available

TOKENS = {"api_token": API_TOKEN, "agent_token": AGENT_TOKEN}


def settings(**values) -> GatewaySettings:
    return GatewaySettings(**TOKENS, **values)


def test_the_agents_file_lists_one_agent_a_line_with_comments(tmp_path):
    listed = tmp_path / "agents.txt"
    listed.write_text(
        "# rack A\nhttp://node-01:9100\n\n  http://node-02:9100/  # spare PSU\n"
        "#http://node-03:9100 (retired)\nhttps://node-04:9100\n"
    )
    assert settings(agents_file=listed).agent_urls == [
        "http://node-01:9100",
        "http://node-02:9100",
        "https://node-04:9100",
    ]


def test_the_agents_file_names_node_ids_over_nats_and_they_are_checked(tmp_path):
    listed = tmp_path / "nodes.txt"
    listed.write_text("node-01\nnode-02\n")
    nats = {"transport": "nats", "nats_token": "nats-token-0123456789"}
    assert settings(agents_file=listed, **nats).agent_urls == ["node-01", "node-02"]
    listed.write_text("node-01\nhttp://node-02:9100\n")
    with pytest.raises(ValidationError, match="over NATS lists node ids"):
        settings(agents_file=listed, **nats)


@pytest.mark.parametrize(
    ("content", "values", "expected"),
    [
        (None, {}, "no such file"),
        ("# nothing yet\n\n", {}, "lists no agent"),
        ("http://node-01:9100, http://node-02:9100\n", {}, "one agent a line"),
        ("http://node-01:9100\n", {"agents": "http://node-09:9100"}, "not both"),
    ],
)
def test_a_wrong_agents_file_is_refused_saying_why(tmp_path, content, values, expected):
    listed = tmp_path / "agents.txt"
    if content is not None:
        listed.write_text(content)
    with pytest.raises(ValidationError, match=expected) as refused:
        settings(agents_file=listed, **values)
    assert "FLEXGATE_AGENTS" in str(refused.value)


def test_the_password_file_goes_into_the_url_quoted(tmp_path):
    secret = tmp_path / "db-password"
    secret.write_text("p@ss:w/rd%1\n")  # a trailing newline, as `echo` and editors leave one
    url = "postgresql+psycopg://flexgate@db.example:5432/flexgate?sslmode=verify-full"
    loaded = settings(database_url=url, database_password_file=secret)
    assert loaded.database_url == (
        "postgresql+psycopg://flexgate:p%40ss%3Aw%2Frd%251@db.example:5432/flexgate"
        "?sslmode=verify-full"
    )


@pytest.mark.parametrize(
    ("url", "content", "expected"),
    [
        ("postgresql+psycopg://flexgate@db/flexgate", None, "no such file"),
        ("postgresql+psycopg://flexgate@db/flexgate", "\n", "the file is empty"),
        ("postgresql+psycopg://flexgate:inline@db/flexgate", "secret", "already has a password"),
        ("postgresql+psycopg://db/flexgate", "secret", "needs the role"),
        ("sqlite:///gateway.db", "secret", "is for PostgreSQL"),
    ],
)
def test_a_wrong_password_file_is_refused_saying_why(tmp_path, url, content, expected):
    secret = tmp_path / "db-password"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(ValidationError, match=expected) as refused:
        settings(database_url=url, database_password_file=secret)
    assert "FLEXGATE_DATABASE_PASSWORD_FILE" in str(refused.value)
    assert "inline" not in str(refused.value)  # a password never reaches the message


def test_the_store_connects_with_the_password_from_the_file(tmp_path):
    """A role with a password on the machine's PostgreSQL, reached through the file."""
    if not postgres_available():
        pytest.skip(f"no PostgreSQL server answers at {POSTGRES} (CI always runs these)")
    admin = create_engine(POSTGRES)
    with admin.begin() as connection:
        connection.execute(text("drop role if exists flexgate_file_test"))
        connection.execute(text("create role flexgate_file_test login password 'w/ith:@chars'"))
    secret = tmp_path / "db-password"
    secret.write_text("w/ith:@chars\n")
    host_and_db = POSTGRES.rpartition("@")[2]
    url = url_with_password(f"postgresql+psycopg://flexgate_file_test@{host_and_db}", secret)
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("select current_user")).scalar() == "flexgate_file_test"
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(text("drop role flexgate_file_test"))
        admin.dispose()
