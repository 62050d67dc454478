"""Fuzzed input to the `flexgate` command (hypothesis): every answer is a result (exit 0) or a
one-line error naming the problem (exit 2), never a failure (exit 1) or a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexgate.cli import main

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
)
FIELDS = [
    "id",
    "gpus",
    "power_w",
    "throughput",
    "pfi",
    "pfi_stderr",
    "min_cap_w",
    "max_cap_w",
    "period_s",
    "duty",
    "protected",
    "weight",
    "remaining_s",
    "placement",
    "sweep",
    "min_throughput_fraction",
    "comm_power_fraction",
    "pfi_grid_w",
]
VALID_JOB = {"id": "a", "gpus": 8, "power_w": 600.0, "throughput": 20000.0, "pfi": 1.5}
jobs = st.lists(
    st.fixed_dictionaries({}, optional={f: numbers for f in FIELDS}).map(
        lambda changes: {**VALID_JOB, **changes}
    ),
    max_size=4,
)
mixes = st.one_of(
    st.fixed_dictionaries(
        {"jobs": jobs},
        optional={"overhead_factor": numbers, "static_load_kw": numbers, "extra": numbers},
    ),
    st.recursive(numbers, lambda inner: st.lists(inner, max_size=3), max_leaves=5),
)


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse refusing an argument
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def assert_answered(code: int, stderr: str) -> None:
    assert code in (0, 2), stderr
    assert "Traceback" not in stderr
    if code == 2:
        assert stderr.strip(), "exit 2 without a message"


@SETTINGS
@given(mix=mixes, reduction=numbers, command=st.sampled_from(["allocate", "quote"]))
def test_fuzzed_job_mixes_are_answered_or_refused(mix, reduction, command):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mix.json"
        path.write_text(json.dumps(mix, allow_nan=True))
        code, stdout, stderr = run(command, str(path), "--reduction-kw", str(reduction), "--json")
    assert_answered(code, stderr)
    if code == 0:
        json.loads(stdout)  # one JSON document
    else:
        assert len(stderr.strip().splitlines()) == 1


@SETTINGS
@given(rows=st.lists(st.lists(numbers, min_size=3, max_size=3), max_size=6), header=st.booleans())
def test_fuzzed_sweeps_are_answered_or_refused(rows, header):
    lines = (["cap_w,power_w,throughput"] if header else []) + [
        ",".join(str(v) for v in row) for row in rows
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.csv"
        path.write_text("\n".join(lines) + "\n")
        code, _, stderr = run("pfi", str(path), "--json")
    assert_answered(code, stderr)


@SETTINGS
@given(rows=st.lists(st.lists(numbers, min_size=2, max_size=2), max_size=40), header=st.booleans())
def test_fuzzed_traces_are_answered_or_refused(rows, header):
    lines = (["t_s,power_w"] if header else []) + [",".join(str(v) for v in row) for row in rows]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.csv"
        path.write_text("\n".join(lines) + "\n")
        code, stdout, stderr = run("trace", str(path), "--json")
    assert_answered(code, stderr)
    if code == 0:
        json.loads(stdout)


@SETTINGS
@given(period=numbers, duty=numbers, delay=numbers, window=numbers)
def test_fuzzed_sync_checks_are_answered_or_refused(period, duty, delay, window):
    code, _, stderr = run(
        "sync",
        "check",
        "--period-s",
        str(period),
        "--duty",
        str(duty),
        "--delay-s",
        str(delay),
        "--window-s",
        str(window),
        "--json",
    )
    assert_answered(code, stderr)
