"""`flexgate lab --scenario fast`: a dip to 49.6 Hz on the lab's line-stream grid fires the
armed fast plans by the droop (10 % at the crossing, 30 % at the bottom: hand-worked below),
the site's GPU power falls, and the plot, CSV and report are written."""

from __future__ import annotations

import json

from rich.console import Console

from flexgate.lab.fast import dip_hz, fast_report, run_fast
from tests.test_cli import assert_bad_input, flexgate


def test_the_dip_is_nominal_then_falls_holds_and_recovers():
    assert [dip_hz(t, 49.6, 2.0) for t in (0.0, 3.0, 3.5, 4.0, 5.5, 6.5, 7.0, 9.0)] == [
        50.0,
        50.0,
        49.8,
        49.6,
        49.6,
        49.8,
        50.0,
        50.0,
    ]


def test_the_fast_lab_fires_the_droop_and_the_gpu_power_falls(tmp_path):
    result = run_fast(nodes=2, gpus_per_node=8, low_hz=49.6, hold_s=3.0, say=lambda _: None)
    # One excursion, one fast event: it starts at 10 % and deepens to 30 % (its stretches).
    [event] = result["events"]
    # droop: 49.985 Hz to 49.5 Hz spans 40 %; 10 % is reached at 49.864 Hz, 49.6 Hz asks 31.8 %
    assert event["reason"].startswith("fast trigger at 10% of the site: the frequency feed read")
    assert "it crossed at" in event["reason"]
    depths = [stretch["depth_pct"] for stretch in event["intervals"]]
    assert depths[0] == 10.0
    assert 30.0 in depths
    assert fast_report(result, 3.0, tmp_path, Console(file=None, quiet=True)) == 0
    doc = json.loads((tmp_path / "lab-fast-report.json").read_text())
    assert doc["gpu_kw_held"] < doc["gpu_kw_before"]
    assert (tmp_path / "lab-fast.png").stat().st_size > 0
    assert (tmp_path / "lab-fast.csv").read_text().startswith("t_s,hz,gpu_kw\n0.")


def test_the_event_labs_options_are_refused_by_the_fast_lab():
    result = flexgate("lab", "--scenario", "fast", "--openadr", "3.1")
    assert_bad_input(result, "--scenario fast plays a frequency dip", "--openadr")
    # The meter's options too: the fast lab has no facility meter (it ran, ignoring them).
    for option in (("--fault", "meter-freeze@10"), ("--meter-dead-s", "5")):
        result = flexgate("lab", "--scenario", "fast", *option)
        assert_bad_input(result, "--scenario fast plays a frequency dip", option[0])
