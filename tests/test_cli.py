"""The `flexgate` command as a user runs it: a subprocess, its exit code, stdout and stderr."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from flexgate.serve import free_port
from tests.conftest import EXAMPLES, ROOT, wait_for
from tests.flexmodel.synthetic_traces import Loop, power_at, uneven_times, uniform_times


def flexgate(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flexgate.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def write(tmp_path: Path, name: str, content: str | dict) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


JOB = {"id": "a", "gpus": 8, "power_w": 600.0, "throughput": 20000.0, "pfi": 1.5}


def mix_with(**changes) -> dict:
    return {"overhead_factor": 1.3, "jobs": [{**JOB, **changes}]}


def assert_bad_input(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert result.stdout == ""


def test_allocate_json_follows_the_contract():
    result = flexgate("allocate", EXAMPLES / "site.json", "--reduction-kw", "25", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["strategy"] == "optimal"
    assert doc["feasible"] is True
    assert doc["achieved_facility_kw"] == pytest.approx(25.0)
    assert doc["target_gpu_kw"] == pytest.approx(25.0 / 1.3)
    ids = [j["id"] for j in json.loads((EXAMPLES / "site.json").read_text())["jobs"]]
    assert [j["id"] for j in doc["jobs"]] == ids
    for row in doc["jobs"]:
        assert row["power_w"] <= row["cap_w"] + 1e-9


def test_reduction_fraction_is_of_gpu_attributable_facility_power(tmp_path):
    # Placed: the fraction counts the placed jobs' GPU power only (docs/cli.md).
    path = write(tmp_path, "mix.json", mix_with(placement=[{"node": "n1", "gpus": list(range(8))}]))
    doc = json.loads(flexgate("allocate", path, "--reduction-fraction", "0.1", "--json").stdout)
    assert doc["requested_facility_kw"] == pytest.approx(0.1 * 1.3 * 8 * 600.0 / 1000.0)
    assert doc["reduction_fraction"] == 0.1


def test_infeasible_is_a_valid_answer(tmp_path):
    path = write(tmp_path, "mix.json", mix_with())
    result = flexgate("allocate", path, "--reduction-kw", "1000", "--strategy", "equal", "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["feasible"] is False
    assert doc["achieved_facility_kw"] == pytest.approx(doc["max_facility_kw"])


def test_human_output_is_a_table():
    result = flexgate("allocate", EXAMPLES / "site.json", "--reduction-kw", "25")
    assert result.returncode == 0, result.stderr
    assert "qwen3-32b-pt-x32" in result.stdout
    assert "feasible" in result.stdout


def test_pfi_from_csv_and_json_agree(tmp_path):
    csv_result = flexgate("pfi", EXAMPLES / "sweep.csv", "--json")
    assert csv_result.returncode == 0, csv_result.stderr
    doc = json.loads(csv_result.stdout)
    assert doc["grid_w"] == [200.0, 300.0, 400.0, 500.0, 600.0, 700.0]
    assert doc["points"] == 6
    points = [
        {"cap_w": 700, "power_w": 600.0, "throughput": 1000.0},
        {"cap_w": 300, "power_w": 300.0, "throughput": 600.0},
    ]
    path = write(tmp_path, "sweep.json", {"points": points})
    doc = json.loads(flexgate("pfi", path, "--json").stdout)
    contract = {k: doc[k] for k in ("pfi", "grid_w", "points")}
    assert contract == {"pfi": pytest.approx(1.25), "grid_w": [300.0, 700.0], "points": 2}
    assert doc["pfi_measured"] == pytest.approx(1.25)
    assert doc["set_aside"] == []


def test_pfi_sets_aside_points_the_cap_did_not_bind_and_says_so(tmp_path):
    rows = EXAMPLES.joinpath("sweep.csv").read_text() + "650,595.0,21789.1\n"  # 0.05% slower
    path = write(tmp_path, "sweep.csv", rows)
    result = flexgate("pfi", path, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    # Not 24.4 (no division by 0.05%): the 650 W run, its power within the noise of the
    # uncapped one's, is a repeat of it and pooled into the reference.
    assert doc["pfi"] == pytest.approx(1.6742, abs=1e-4)
    assert doc["points"] == 6
    assert [p["cap_w"] for p in doc["set_aside"]] == [650.0]
    assert "did not bind" in doc["set_aside"][0]["reason"]
    assert doc["pfi_stderr"] > 0
    assert len(doc["fit"]) == 7
    people = flexgate("pfi", path)
    assert "set aside: 650 W" in people.stdout
    assert "+-" in people.stdout
    wider = json.loads(flexgate("pfi", path, "--json", "--noise", "0.008").stdout)
    assert wider["noise_fraction"] >= 0.008  # or the repeats' own spread, if larger
    assert wider["pfi_stderr"] > doc["pfi_stderr"]


@pytest.mark.parametrize(
    ("content", "args", "fragments"),
    [
        (None, ["--reduction-kw", "1"], ["no such file"]),
        ("{not json", ["--reduction-kw", "1"], ["invalid JSON at line 1"]),
        (
            '{"jobs": [{"id": "a", "gpus": 8, "power_w": NaN, "throughput": 1}]}',
            ["--reduction-kw", "1"],
            ["NaN is not a number JSON allows"],
        ),
        (mix_with(colour="red"), ["--reduction-kw", "1"], ["job 'a'", "unknown field", "colour"]),
        (mix_with(power_w=-600.0), ["--reduction-kw", "1"], ["'power_w' must be from 50 to"]),
        (mix_with(power_w=0.662), ["--reduction-kw", "1"], ["0.662 looks like kW: 662 W?"]),
        (
            {
                "jobs": [
                    {**JOB, "id": job, "placement": [{"node": "n1", "gpus": list(range(8))}]}
                    for job in ("a", "b")
                ]
            },
            ["--reduction-kw", "1"],
            ["jobs 'a' and 'b' are both placed on node 'n1' GPU(s) 0, 1, 2, 3, 4, 5, 6, 7"],
        ),
        (mix_with(), ["--reduction-fraction", "25"], ["a percentage? 25% is 0.25"]),
        (mix_with(), ["--reduction-fraction", "-0.1"], ["expected a fraction from 0 to 1"]),
        (mix_with(gpus=0), ["--reduction-kw", "1"], ["'gpus' must be a whole number"]),
        (mix_with(power_w=800.0), ["--reduction-kw", "1"], ["above max_cap_w"]),
        (mix_with(min_cap_w=100.0, max_cap_w=90.0), ["--reduction-kw", "1"], ["min_cap_w"]),
        (mix_with(), ["--reduction-kw", "-5"], ["--reduction-kw must be at least 0"]),
        (mix_with(), ["--reduction-kw", "nan"], ["expected a finite number"]),
        (mix_with(), ["--reduction-kw", "lots"], ["expected a number"]),
        (mix_with(), [], ["one of the arguments --reduction-kw --reduction-fraction"]),
        (mix_with(), ["--reduction-kw", "1", "--strategy", "fair"], ["invalid choice: 'fair'"]),
        (mix_with(), ["--reduction-kw", "1", "--reduction-fraction", "0.1"], ["not allowed"]),
    ],
)
def test_allocate_bad_input_exits_2_with_one_line(tmp_path, content, args, fragments):
    path = tmp_path / "missing.json" if content is None else write(tmp_path, "mix.json", content)
    assert_bad_input(flexgate("allocate", path, *args), *fragments)


@pytest.mark.parametrize(
    ("name", "content", "fragments"),
    [
        (
            "s.csv",
            "cap,power,tput\n700,600,1000\n",
            ["CSV header must be cap_w,power_w,throughput"],
        ),
        ("s.csv", "cap_w,power_w,throughput\n700,600,1000\n300,abc,600\n", ["line 3", "power_w"]),
        ("s.csv", "cap_w,power_w,throughput\n700,600,1000\n", ["at least two points"]),
        (
            "s.csv",
            "cap_w,power_w,throughput\n700,600,1000\n600,590,1000\n",
            ["no cap slowed the job beyond the measurement noise", "600 W"],
        ),
        (
            "s.csv",
            "cap_w,power_w,throughput\n700,600,1000\n500,660,900\n300,300,700\n",
            ["power_w falls from 660 to 600 as the cap rises from 500 W to 700 W"],
        ),
        ("s.json", {"points": [{"cap_w": 700}]}, ["points[0] must have exactly"]),
        ("s.json", {"rows": []}, ['expected {"points"']),
    ],
)
def test_pfi_bad_input_exits_2_with_one_line(tmp_path, name, content, fragments):
    assert_bad_input(flexgate("pfi", write(tmp_path, name, content)), *fragments)


def test_pfi_refuses_a_noise_outside_0_1():
    assert_bad_input(
        flexgate("pfi", EXAMPLES / "sweep.csv", "--noise", "5"), "a percentage? 5% is 0.05"
    )


def _trace_csv(tmp_path: Path, loop: Loop, times: np.ndarray, extra: str = "") -> Path:
    power = power_at(loop, times)
    lines = ["t_s,power_w" + (",gpu" if extra else "")]
    lines += [
        f"{t:.4f},{p:.2f}" + (f",{extra}" if extra else "")
        for t, p in zip(times, power, strict=True)
    ]
    return write(tmp_path, "trace.csv", "\n".join(lines) + "\n")


def test_trace_gives_period_duty_levels_phase_and_confidence(tmp_path):
    """The reported case: a 100 Hz logger, 6.2 s compute and 0.5 s idle, samples uneven and
    some lost."""
    path = _trace_csv(tmp_path, Loop(), uneven_times(120.0, 100.0), extra="0")
    result = flexgate("trace", path, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["period_s"] == pytest.approx(6.7, rel=0.003)
    assert doc["duty"] == pytest.approx(6.2 / 6.7, abs=0.01)
    assert doc["compute_w"] == pytest.approx(116.0, abs=1.0)
    assert doc["comm_w"] == pytest.approx(51.0, abs=1.0)
    assert 0.0 <= doc["phase_rad"] < 2 * np.pi
    assert doc["confidence"] > 0.9
    assert doc["no_period"] is None
    assert doc["missing_share"] > 0  # the two-second gap is not invented
    people = flexgate("trace", path)
    assert "period 6.70" in people.stdout
    assert "duty 0.92" in people.stdout
    # The sensor's lag taken out: an H200's instant field (0.1 s) reads 2 pi 0.1 / 6.7 late.
    lagged = json.loads(flexgate("trace", path, "--json", "--sensor-lag-s", "0.1").stdout)
    moved = (lagged["phase_rad"] - doc["phase_rad"]) % (2 * np.pi)
    assert moved == pytest.approx(2 * np.pi * 0.1 / doc["period_s"], abs=1e-6)
    refused = flexgate("trace", path, "--sensor-lag-s", "-1")
    assert refused.returncode == 2
    assert "--sensor-lag-s" in refused.stderr


def test_trace_without_a_period_says_so(tmp_path):
    times = uniform_times(60.0, 50.0)
    noise = np.random.default_rng(1).normal(300.0, 5.0, times.size)
    lines = ["t_s,power_w"] + [f"{t:.3f},{p:.2f}" for t, p in zip(times, noise, strict=True)]
    path = write(tmp_path, "noise.csv", "\n".join(lines) + "\n")
    result = flexgate("trace", path, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["period_s"] is None
    assert doc["duty"] is None
    assert doc["confidence"] == 0.0
    assert "no clear iteration period" in doc["no_period"]
    assert "no period:" in flexgate("trace", path).stdout


_TIMES = "".join(f"{0.1 * i:.1f},{100 + 50 * (i % 10 < 5)}\n" for i in range(3, 60))


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("time,watts\n0,1\n", ["must name the columns t_s,power_w", "missing t_s,power_w"]),
        ("t_s,gpu\n0,1\n", ["missing power_w"]),
        ("t_s,power_w\n0,100\n0.1,lots\n", ["line 3", "power_w must be a finite number"]),
        ("t_s,power_w\n0,100\n0.1,nan\n", ["line 3", "power_w must be a finite number"]),
        ("t_s,power_w\n0,100\n0.1,-5\n", ["line 3", "power_w must be at least 0"]),
        ("t_s,power_w\n0,100\n0.2,100\n0.1,100\n", ["line 4", "does not follow 0.2"]),
        ("t_s,power_w\n0,100\n0.1,110\n", ["at least 32 samples, got 2"]),
        ("t_s,power_w\n" + _TIMES + "0.3,100\n", ["does not follow"]),
    ],
)
def test_trace_bad_input_exits_2_with_one_line(tmp_path, content, fragments):
    assert_bad_input(flexgate("trace", write(tmp_path, "t.csv", content)), *fragments)


def test_trace_refuses_a_missing_file_and_a_trace_too_short(tmp_path):
    assert_bad_input(flexgate("trace", tmp_path / "none.csv"), "no such file")
    path = _trace_csv(tmp_path, Loop(), uniform_times(10.0, 10.0))
    assert_bad_input(flexgate("trace", path, "--min-period-s", "5"), "too short to find periods")


SWEEP_ROWS = [("700", "600", "1000"), ("300", "300", "600"), ("500", "450", "900")]


def test_a_spreadsheet_csv_with_a_byte_order_mark_is_read(tmp_path):
    """Excel's "CSV UTF-8" starts the file with a BOM, which used to spoil the first header."""
    path = tmp_path / "sweep.csv"
    with path.open("w", encoding="utf-8-sig", newline="") as handle:
        rows = [("cap_w", "power_w", "throughput"), *SWEEP_ROWS]
        csv.writer(handle, lineterminator="\r\n").writerows(rows)
    assert path.read_bytes().startswith(b"\xef\xbb\xbfcap_w")
    result = flexgate("pfi", path, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["pfi"] == pytest.approx(1.875)


@pytest.mark.parametrize(("delimiter", "name"), [(";", "semicolons"), ("\t", "tabs")])
def test_a_csv_with_another_delimiter_is_refused_naming_it(tmp_path, delimiter, name):
    """Semicolon files come with decimal commas (600,5): guessing could read wrong numbers."""
    path = tmp_path / "sweep.csv"
    with path.open("w", encoding="utf-8-sig", newline="") as handle:
        rows = [("cap_w", "power_w", "throughput"), ("700", "600,5", "1000"), *SWEEP_ROWS[1:]]
        csv.writer(handle, delimiter=delimiter).writerows(rows)
    assert_bad_input(
        flexgate("pfi", path), f"columns are separated by {name}, not commas", "'.' for decimals"
    )


def test_a_job_mix_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(mix_with()), encoding="utf-8-sig")
    result = flexgate("allocate", path, "--reduction-kw", "1", "--json")
    assert result.returncode == 0, result.stderr


def test_unknown_command_is_bad_input():
    assert_bad_input(flexgate("frobnicate"), "invalid choice")


def test_quote_json_follows_the_contract():
    result = flexgate(
        "quote", EXAMPLES / "site.json", "--reduction-kw", "20", "--window-s", "1800", "--json"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) >= {
        "window_s",
        "overhead_factor",
        "confidence",
        "achievable_kw",
        "firm_kw",
        "supply_curve",
        "requested_kw",
        "requested_feasible",
        "requested_throughput_loss",
        "jobs",
    }
    assert (doc["window_s"], doc["confidence"]) == (1800.0, 0.9)
    assert doc["firm_kw"] <= doc["achievable_kw"]
    assert set(doc["supply_curve"][0]) == {
        "facility_kw",
        "throughput_loss",
        "throughput_loss_fraction",
    }
    assert set(doc["jobs"][0]) >= {"id", "max_reduction_w", "supply_curve"}


def test_quote_human_output():
    result = flexgate("quote", EXAMPLES / "site.json", "--reduction-kw", "20")
    assert result.returncode == 0, result.stderr
    assert "achievable" in result.stdout
    assert "firm at 90%" in result.stdout


def test_simulate_json_and_plot(tmp_path):
    plot = tmp_path / "sim.png"
    small = ["simulate", "--workloads", "5", "--jobs", "20", "--reductions", "0,0.3", "--seed", "4"]
    result = flexgate(*small, "--plot", plot, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["workloads"], doc["jobs"], doc["seed"]) == (5, 20, 4)
    assert [r["reduction"] for r in doc["results"]] == [0.0, 0.3]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(flexgate(*small, "--json").stdout)["results"] == doc["results"]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["quote", EXAMPLES / "site.json", "--confidence", "1.5"], ["confidence"]),
        (["quote", EXAMPLES / "site.json", "--window-s", "-1"], ["window"]),
        (["quote", EXAMPLES / "site.json", "--reduction-kw", "-3"], ["reduction"]),
        (["quote", "nope.json"], ["no such file"]),
        (["simulate", "--workloads", "0"], ["expected at least 1"]),
        (["simulate", "--jobs", "ten"], ["expected a whole number"]),
        (["simulate", "--reductions", "0,1.5"], ["fractions in [0, 1)"]),
        (["simulate", "--reductions", "0,30"], ["a percentage? 30% is 0.3"]),
        (["quote", "examples/site.json", "--confidence", "90"], ["a percentage? 90% is 0.9"]),
        (["lab", "--reduction", "25"], ["a percentage? 25% is 0.25"]),
        (["simulate", "--mix", "busy"], ["invalid choice"]),
        (["simulate", "--seed", "-1"], ["expected 0 or more"]),
        (["simulate", "--workloads", "1", "--plot", "/no/such/dir/x.png"], ["does not exist"]),
    ],
)
def test_quote_and_simulate_bad_input(args, fragments):
    assert_bad_input(flexgate(*args), *fragments)


def test_sync_check_json_follows_the_contract():
    result = flexgate(
        "sync", "check", "--period-s", "2", "--duty", "0.5", "--delay-s", "0.2", "--json"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {
        "period_s",
        "duty",
        "delay_s",
        "window_s",
        "spread",
        "gain_per_s",
        "harmonics",
        "in_phase_stable",
        "verdict",
        "max_safe_delay_s",
        "advice",
    }
    assert doc["verdict"] == "safe"
    assert doc["advice"] == []
    assert doc["max_safe_delay_s"] == pytest.approx(1 / 3)
    assert set(doc["harmonics"][0]) == {
        "m",
        "weight",
        "significant",
        "coupling_per_s",
        "attractive",
        "critical_coupling_per_s",
    }


def test_sync_check_over_a_job_mix():
    result = flexgate(
        "sync", "check", "--delay-s", "1.2", "--job-mix", EXAMPLES / "site.json", "--json"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    ids = [j["id"] for j in json.loads((EXAMPLES / "site.json").read_text())["jobs"]]
    assert [j["id"] for j in doc["jobs"]] == ids
    assert doc["verdict"] == "unsafe"
    assert set(doc["jobs"][0]) == {"id", "verdict", "worst_m", "max_safe_delay_s"}
    human = flexgate("sync", "check", "--delay-s", "0.1", "--job-mix", EXAMPLES / "site.json")
    assert "verdict:" in human.stdout


def test_sync_check_calls_unsafe_the_loop_that_the_simulator_locks_on_harmonic_3():
    """T = 2 s, d = 0.5, tau = 0.5 s, spread 0.005, gain 0.4 rad/s: harmonic 3's onset is at
    0.29 rad/s, so the check must say unsafe, and 300 simulated jobs lock on harmonic 3."""
    loop = ["--period-s", "2", "--duty", "0.5", "--delay-s", "0.5", "--spread", "0.005"]
    check = flexgate("sync", "check", *loop, "--gain-per-s", "0.4", "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["verdict"] == "unsafe"
    run = flexgate("sync", "simulate", "--jobs", "300", *loop, "--gain-per-s", "0.4", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["final"]["r3"] > 0.4


def test_sync_simulate_json_and_plot(tmp_path):
    plot = tmp_path / "sync.png"
    result = flexgate(
        "sync",
        "simulate",
        "--jobs",
        "2",
        "--period-s",
        "2",
        "--duty",
        "0.5",
        "--delay-s",
        "1.4",
        "--gain-per-s",
        "0.3",
        "--duration-s",
        "120",
        "--plot",
        plot,
        "--json",
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["final"]["phase_difference"] == pytest.approx(0.0, abs=0.1)
    assert doc["aggregate_swing_ratio"] == pytest.approx(np.sqrt(2), rel=0.05)
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["sync", "check", "--duty", "0.5", "--delay-s", "0.2"], ["--period-s and --duty"]),
        (
            ["sync", "check", "--period-s", "2", "--duty", "1", "--delay-s", "0"],
            ["between 0 and 1"],
        ),
        (["sync", "check", "--period-s", "-2", "--duty", "0.5", "--delay-s", "0"], ["positive"]),
        (["sync", "check", "--period-s", "2", "--duty", "0.5"], ["--delay-s"]),
        (
            [
                "sync",
                "simulate",
                "--jobs",
                "0",
                "--period-s",
                "2",
                "--duty",
                "0.5",
                "--delay-s",
                "1",
            ],
            ["at least 1"],
        ),
        (
            [
                "sync",
                "simulate",
                "--jobs",
                "2",
                "--period-s",
                "2",
                "--duty",
                "0.5",
                "--delay-s",
                "1",
                "--throttle",
                "soft",
            ],
            ["invalid choice"],
        ),
        (["sync", "frob"], ["invalid choice"]),
    ],
)
def test_sync_bad_input(args, fragments):
    assert_bad_input(flexgate(*args), *fragments)


@pytest.mark.parametrize(
    ("env", "args", "fragments"),
    [
        ({"FLEXGATE_AGENT_TOKEN": "changeme"}, [], ["FLEXGATE_AGENT_TOKEN", "placeholders"]),
        ({}, [], ["FLEXGATE_AGENT_TOKEN"]),
        ({"FLEXGATE_AGENT_TOKEN": "x" * 20}, ["--gpus", "0"], ["expected at least 1"]),
        ({"FLEXGATE_AGENT_TOKEN": "x" * 20}, ["--job-mix", "missing.json"], ["no such file"]),
        ({"FLEXGATE_AGENT_TOKEN": "x" * 20}, ["--backend", "rocm"], ["invalid choice"]),
        (
            {"FLEXGATE_AGENT_TOKEN": "x" * 20},
            ["--gpus", "4", "--job-mix", "examples/site.json", "--node-id", "node-01"],
            ["is placed on GPU 4 of node-01, which has 4 GPUs", "set --gpus"],
        ),
    ],
)
def test_agent_refuses_bad_settings_before_starting(env, args, fragments):

    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")}
    result = subprocess.run(
        [sys.executable, "-m", "flexgate.cli", "agent", "--port", "0", "--backend", "sim", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
        env=clean | env,
    )
    assert_bad_input(result, *fragments)


def test_sync_check_with_no_delay_limit_is_valid_json():
    """A window of whole periods blinds the loop: no delay is unsafe, and JSON says null."""
    result = flexgate(
        "sync",
        "check",
        "--period-s",
        "2",
        "--duty",
        "0.5",
        "--delay-s",
        "1",
        "--window-s",
        "6",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["max_safe_delay_s"] is None
    human = flexgate(
        "sync", "check", "--period-s", "2", "--duty", "0.5", "--delay-s", "1", "--window-s", "6"
    )
    assert "safe at any delay" in human.stdout


def test_sync_check_takes_the_loops_controller():
    """An integrating loop attracts at 0.45 T, where the proportional throttle repels: the
    quarter-period lag of integral action (docs/sync.md)."""
    common = ("sync", "check", "--period-s", "2", "--duty", "0.5", "--delay-s", "0.9", "--json")
    proportional = json.loads(flexgate(*common).stdout)
    integral = json.loads(
        flexgate(*common, "--proportional-gain", "0", "--integral-gain-per-s", "0.2").stdout
    )
    assert not proportional["harmonics"][0]["attractive"]
    assert integral["harmonics"][0]["attractive"]
    assert integral["verdict"] == "unsafe"
    refused = flexgate(
        "sync",
        "check",
        "--period-s",
        "2",
        "--duty",
        "0.5",
        "--delay-s",
        "1",
        "--hold-s",
        "-1",
    )
    assert refused.returncode == 2


def _every_parser():
    """The top-level parser and every sub-command's, found by walking the real parser."""
    import argparse

    from flexgate.cli.parser import build_parser

    pending = [build_parser()]
    while pending:
        parser = pending.pop()
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())


def test_every_option_of_every_command_says_what_it_is():
    import argparse

    missing = [
        f"{parser.prog} {action.option_strings or action.dest}"
        for parser in _every_parser()
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert missing == []


def test_help_cites_only_pages_users_have():
    for parser in _every_parser():
        text = parser.format_help()
        for word in ("CONTRACT", "shared/design", "MODEL.md"):
            assert word not in text, (parser.prog, word)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("agent", ["FLEXGATE_AGENT_TOKEN", "--port 9102", "--lab"]),
        ("gateway", ["FLEXGATE_API_TOKEN", "FLEXGATE_AGENT_TOKEN", "FLEXGATE_AGENTS"]),
        ("simulate", ["workloads", "jobs per workload", "random seed"]),
        ("lab", ["simulated GPU nodes", "GPUs per node", "[s]"]),
    ],
)
def test_service_help_names_what_must_be_set(command, words):
    result = flexgate(command, "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for word in words:
        assert word in text, word


def test_version_is_the_installed_package_version():
    from importlib.metadata import version

    result = flexgate("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"flexgate {version('flexgate')}")


def test_an_unsafe_sync_check_says_which_loop_setting_makes_it_safe():
    demo = ("sync", "check", "--delay-s", "1.2", "--job-mix", EXAMPLES / "site.json")
    shown = flexgate(*demo)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "verdict: unsafe" in text
    assert "what to do (any one of these makes it safe" in text
    doc = json.loads(flexgate(*demo, "--json").stdout)
    delay, window, spread = doc["advice"]
    assert delay.startswith("a faster loop: --delay-s below 0.25 s")
    assert "FLEXGATE_METER_PERIOD_S" in delay  # the loop that couples jobs: the site loop
    assert window.startswith("a loop that averages over whole iteration periods: --window-s 6")
    assert spread.startswith("--spread 0 means identical jobs")
    # Each advised setting, applied, gives a safe loop with nothing more to advise.
    for change in (["--delay-s", "0.24"], ["--window-s", "6"]):
        again = json.loads(flexgate(*demo, *change, "--json").stdout)
        assert (again["verdict"], again["advice"]) == ("safe", [])


@pytest.mark.parametrize(("agents", "warned"), [("", True), ("http://127.0.0.1:9", False)])
def test_a_gateway_without_agents_warns_that_it_caps_nothing(tmp_path, agents, warned):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")}
    env = clean | {
        "FLEXGATE_AGENTS": agents,
        "FLEXGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
    }
    port, log = free_port(), tmp_path / "gateway.log"
    with log.open("w") as stderr:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "flexgate.cli", "gateway", "--lab", "--port", str(port)],
            cwd=tmp_path,
            env=env | {"PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:

        def answers():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code
            except httpx.HTTPError:
                return None

        wait_for(answers, "the gateway", 30)
        text = log.read_text()
        assert ("FLEXGATE_AGENTS is empty: no agent is known" in text) is warned, text
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=20)


def _wave(times_s, mean_w: float) -> str:
    rows = [f"{t:g},{mean_w * (1 + 0.2 * np.sin(i / 10))}" for i, t in enumerate(times_s)]
    return "t_s,power_w\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize(
    ("command", "name", "content", "fragment"),
    [
        (
            "pfi",
            "kw.csv",
            "cap_w,power_w,throughput\n0.2,0.19,100\n0.45,0.4,150\n0.7,0.6,170\n",
            "line 2: cap_w must be from 50 to 2000 W, got 0.2 (0.2 looks like kW: 200 W?)",
        ),
        ("trace", "kw.csv", _wave(np.arange(3000) * 0.02, 0.6), "looks like kW"),
        ("trace", "ms.csv", _wave(np.arange(3000) * 20.0, 600.0), "t_s in milliseconds?"),
    ],
)
def test_unit_slips_in_sweeps_and_traces_are_refused(
    tmp_path, capsys, command, name, content, fragment
):
    """As the job mix refuses them: a sweep or trace in kW, a trace timed in ms (in-process:
    `main` is what the command runs)."""
    from flexgate.cli import main

    assert main([command, str(write(tmp_path, name, content))]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert fragment in err


def test_sync_check_on_a_mix_states_one_bound_for_every_job(capsys):
    """Not "safe below 0.367 s" (the worst job's) beside advice to go below 0.25 s."""
    from flexgate.cli import main

    args = ["sync", "check", "--job-mix", str(EXAMPLES / "site.json"), "--delay-s", "1"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    bound = min(j["max_safe_delay_s"] for j in doc["jobs"] if j["max_safe_delay_s"] is not None)
    assert doc["fleet_max_safe_delay_s"] == bound < doc["max_safe_delay_s"]
    assert main(args) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"every job is safe below a delay of {bound:.3g} s" in said
    assert f"--delay-s below {bound:.3g} s" in said


def test_pfi_gives_the_real_a40_sweep_a_pfi_from_its_repeats(tmp_path):
    """Issue 34, case 4: refused before ("throughput falls ... beyond the measurement noise")."""
    rows = [(100, 12957.11, 100.36), (150, 6796.56, 147.24), (200, 6282.47, 182.08)]
    rows += [(250, 6475.60, 183.99), (300, 6640.18, 181.33)]
    text = "cap_w,power_w,throughput\n" + "".join(
        f"{c},{p},{1000.0 / ms:.6f}\n" for c, ms, p in rows
    )
    result = flexgate("pfi", write(tmp_path, "a40.csv", text), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pfi"] == pytest.approx(0.898, abs=0.002)
    assert doc["repeats"] == 3
    assert doc["grid_w"] == [100.0, 300.0]
