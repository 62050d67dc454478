"""Shared fixtures: where ../shared is, the example files, and measured recovery times."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import settings

# The suite's gateways serve their reads openly, as all but the read token's tests expect; those
# (tests/test_environment.py, tests/gateway/test_security.py) clear or set it to see the rule.
# Subprocesses started with a cleaned environment set it themselves.
os.environ.setdefault("FLEXGATE_READ_PUBLIC", "true")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
EXAMPLES = ROOT / "examples"

# Property tests draw the same examples on every run (CI included): a failure is reproducible,
# and a run's verdict does not depend on luck. `--hypothesis-profile explore` draws anew.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("default")

#: `make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`); the tests of
#: one group run one after another on one worker. PostgreSQL's `test` database is one: each of
#: its tests drops and creates the schema, and tests/gateway/test_restart.py stops the server.
POSTGRES_GROUP = "postgresql"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """The PostgreSQL variants of the `database_url` tests join the PostgreSQL group; a test in
    two groups is refused (pytest-xdist would make a third group of the pair, which runs beside
    both)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("database_url") == "postgresql":
            item.add_marker(pytest.mark.xdist_group(POSTGRES_GROUP))
        groups = {mark.args[0] for mark in item.iter_markers("xdist_group")}
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} is in more than one xdist_group: {groups}")


def wait_for(check, what: str, seconds: float = 15.0, every_s: float = 0.02):
    """`check()`'s first truthy value, polled every `every_s`; fails naming `what` after
    `seconds`."""
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(every_s)
    return value


@pytest.fixture
def shared() -> Path:
    """The design folder beside the clone (CI always has it; a user's clone may not)."""
    if not (SHARED / "data" / "h200_pfi_table.csv").exists():
        pytest.skip(f"../shared is not beside this clone ({SHARED} missing)")
    return SHARED


#: Recovery times [s] the fault tests measured in this session, by name.
RECOVERY: dict[str, float] = {}


@pytest.fixture
def recovery():
    """`recovery(name, seconds)`: record a measured recovery time. With
    FLEXGATE_RECOVERY_REPORT set (`make reliability`), they are merged into that JSON file."""

    def record(name: str, seconds: float) -> None:
        RECOVERY[name] = round(seconds, 3)

    return record


def pytest_sessionfinish(session):
    target = os.environ.get("FLEXGATE_RECOVERY_REPORT")
    if target and RECOVERY:  # merged into what is there, so a partial run updates its own
        with open(target, "a+", encoding="utf-8") as report:
            fcntl.flock(report, fcntl.LOCK_EX)  # pytest-xdist's workers each merge their own
            report.seek(0)
            text = report.read()
            known = json.loads(text) if text.strip() else {}
            report.seek(0)
            report.truncate()
            report.write(json.dumps(known | RECOVERY, indent=2, sort_keys=True) + "\n")
