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

#: `make test` runs the suite on several pytest-xdist workers; the tests of one group run one
#: after another on one worker (README.md, "How the suite runs"). By file: a shared server, or
#: a costly module fixture computed once rather than once per worker.
XDIST_GROUPS = {
    "tests/interop/test_reference_vtn31.py": "reference-vtn",  # one VTN; fixed MQTT client id
    "tests/interop/test_reference_vtn31_settled.py": "reference-vtn",  # the same port and id
    "tests/test_compose_lab.py": "docker",  # images built once; one stack at a time
    "tests/test_agent_image.py": "docker",  # the same base image and build CA file
    "tests/gateway/test_settings_files.py": "postgresql",  # a role made on the machine's server
    "tests/gateway/test_slurm.py": "slurm",  # one cluster for the module
    "tests/gateway/test_dashboard.py": "chromium",  # one browser at a time
    "tests/gateway/test_ven31_mqtt.py": "mosquitto",  # the machine's broker (a precaution)
    "tests/test_campaign.py": "campaign",  # its fixture runs the 20-event campaign (a minute)
}
#: PostgreSQL's `test` database: each test drops and creates the schema, and
#: tests/gateway/test_restart.py stops the server. Its tests: the `postgresql` variant of
#: `database_url`, and tests/gateway's tests named for PostgreSQL.
POSTGRES_GROUP = "postgresql"


def xdist_group(nodeid: str) -> str | None:
    """The group of the test `nodeid`, or None for a test that runs beside any other."""
    path, _, rest = nodeid.partition("::")
    if path in XDIST_GROUPS:
        return XDIST_GROUPS[path]
    name, _, params = rest.partition("[")
    if "postgresql" in params.rstrip("]").split("-"):
        return POSTGRES_GROUP
    if path.startswith("tests/gateway/") and "postgresql" in name:
        return POSTGRES_GROUP
    return None


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load scheduling, the tests of a group sent to one worker as one unit.
    (Its own `--dist loadgroup` renames items to mark their group, which pytest 9 ignores.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return GroupScheduling(config, log)


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
