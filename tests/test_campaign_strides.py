"""The campaign benchmark's strides (bench/campaign_scoring.py `Trace`): when a hold may be stepped
through, and what stands for it in the scores."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from campaign_bench import METER_PERIOD_S
from campaign_scoring import Trace

SPAN_S = 300.0
STEADY_KW = 0.1  # 1% of a 10 kW request


def ticked(trace: Trace, seconds: float, true_kw, correction_kw=lambda t: 0.0) -> None:
    """Rows every meter period for `seconds` after the last: true kW and the loop's
    correction as functions of the time."""
    t0 = trace.rows[-1][0] if trace.rows else 0.0
    for k in range(1, round(seconds / METER_PERIOD_S) + 1):
        t = t0 + k * METER_PERIOD_S
        trace.rows.append((t, true_kw(t), 40.0, 20.0, true_kw(t), None))
        trace.corrections.append(correction_kw(t))
        trace.simulated += 1


def cycle(t: float) -> float:
    """A loop cycling a whole meter step (0.5 kW) every 80 s about 30.25 kW."""
    return 30.0 if (t // 40.0) % 2 else 30.5


def time_mean(rows, until_s: float) -> float:
    t = [r[0] for r in rows] + [until_s]
    return sum(r[1] * (t[i + 1] - t[i]) for i, r in enumerate(rows)) / (t[-1] - t[0])


def test_a_steady_cycle_is_repeated_through_a_stride_with_its_mean():
    trace = Trace(METER_PERIOD_S)
    ticked(trace, 2 * SPAN_S + METER_PERIOD_S, cycle)
    assert trace.moving(SPAN_S, STEADY_KW)  # a range of 0.5 kW: not a steady hold
    assert trace.repeating(SPAN_S, STEADY_KW)  # but it holds its mean
    start, end_s = len(trace.rows), trace.rows[-1][0]
    until_s = end_s + 3600.0 + METER_PERIOD_S
    trace.repeat(SPAN_S, until_s)
    strided = trace.rows[start - 1 :]
    times = [r[0] for r in strided]
    assert times == sorted(set(times))
    assert until_s - 2 * METER_PERIOD_S < times[-1] < until_s  # filled to the next sample
    assert math.isclose(time_mean(strided, until_s), 30.25, abs_tol=0.05)
    assert trace.simulated == start  # repeats are not samples
    assert len(trace.corrections) == len(trace.rows)


def test_after_a_stride_two_spans_are_ticked_before_the_next():
    trace = Trace(METER_PERIOD_S)
    ticked(trace, 2 * SPAN_S + METER_PERIOD_S, cycle)
    trace.repeat(SPAN_S, trace.rows[-1][0] + 1000.0)
    ticked(trace, SPAN_S, cycle)
    assert not trace.repeating(SPAN_S, STEADY_KW)
    ticked(trace, SPAN_S + METER_PERIOD_S, cycle)
    assert trace.repeating(SPAN_S, STEADY_KW)


def test_a_loop_still_settling_is_not_repeated():
    trace = Trace(METER_PERIOD_S)
    ticked(trace, 2 * SPAN_S, lambda t: 30.0 + 2.0 * math.exp(-t / 200.0))
    assert trace.moving(SPAN_S, STEADY_KW)
    assert not trace.repeating(SPAN_S, STEADY_KW)


def test_a_correction_still_integrating_would_creep_through_a_stride():
    """The true power flat, the correction moving 1 W/s: 3.6 kW over an hour's stride."""
    trace = Trace(METER_PERIOD_S)
    ticked(trace, 2 * SPAN_S, lambda t: 30.0, lambda t: 0.001 * t)
    assert not trace.moving(SPAN_S, STEADY_KW)
    assert math.isclose(trace.creep_kw(SPAN_S, 3600.0), 3.6, rel_tol=0.03)
    held = Trace(METER_PERIOD_S)
    ticked(held, 2 * SPAN_S, lambda t: 30.0, lambda t: 1.5)
    assert held.creep_kw(SPAN_S, 3600.0) == 0.0


def test_a_steady_hold_repeats_its_level():
    trace = Trace(METER_PERIOD_S)
    ticked(trace, SPAN_S, lambda t: 30.0 + 0.01 * math.sin(t))
    until_s = trace.rows[-1][0] + 600.0
    trace.repeat(SPAN_S, until_s)
    assert trace.rows[-1][0] > until_s - 2 * METER_PERIOD_S
    assert all(abs(r[1] - 30.0) <= 0.01 for r in trace.rows)
    assert math.isclose(time_mean(trace.rows, until_s), 30.0, abs_tol=0.002)


def test_plotting_results_that_are_not_there_or_not_a_campaign_is_refused_with_the_reason(
    tmp_path,
):
    """`--plot` with a missing file, or a JSON file that is not a campaign's results: exit 2,
    one line naming the file and what is wrong, no traceback, no plot written."""
    import subprocess

    bench = Path(__file__).resolve().parent.parent / "bench" / "campaign_bench.py"
    other = tmp_path / "other.json"
    other.write_text('{"benchmark": "pfi"}')
    for path, reason in [(tmp_path / "missing.json", "cannot be read"), (other, "no 'runs'")]:
        result = subprocess.run(
            [sys.executable, str(bench), "--plot", str(path)], capture_output=True, text=True
        )
        assert result.returncode == 2
        assert f"--plot {path}: " in result.stderr
        assert reason in result.stderr
        assert "Traceback" not in result.stderr
