"""The figures an operator reads: every trace named in a legend that says what it is."""

from __future__ import annotations

import pytest

from flexgate.lab.plots import lab_figure, plot_lab, sync_figure
from flexmodel.syncsim import simulate_sync


def _labels(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def lab_trace() -> list[tuple[float, float, float, str]]:
    """A lab run: 24 kW before, 18 kW against an 18 kW target during, 24 kW after."""
    rows = [(0.5 * i, 24.0, 24.0, "pending") for i in range(10)]
    rows += [(5 + 0.5 * i, 18.0, 18.0, "active") for i in range(20)]
    rows += [(15 + 0.5 * i, 24.0, 24.0, "completed") for i in range(10)]
    return rows


def test_the_lab_figure_shades_the_event_and_names_the_baseline_and_what_x_k_means():
    (ax,) = lab_figure(lab_trace(), 6.0).axes
    labels = _labels(ax)
    assert "event (the VTN's request)" in labels
    assert "target: baseline - 6.0 kW" in labels
    assert "baseline: site power before the event (uncapped)" in labels
    (power,) = [label for label in labels if label.startswith("site power")]
    assert "x k, the facility kW per GPU kW" in power  # "x k" said in words
    (shade,) = ax.patches  # the event, from its first active sample to its last
    assert shade.get_label() == "event (the VTN's request)"
    assert (shade.get_x(), shade.get_x() + shade.get_width()) == (5.0, 14.5)
    baseline = next(line for line in ax.get_lines() if line.get_label().startswith("baseline"))
    assert set(baseline.get_ydata()) == {24.0}  # the baseline holds through the event


def test_the_lab_plot_is_a_png(tmp_path):
    path = tmp_path / "lab.png"
    plot_lab(lab_trace(), 6.0, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_trace_of_the_sync_figure_is_in_a_legend_that_says_what_r1_and_r3_mean():
    run = simulate_sync(jobs=8, period_s=2.0, duty=0.5, delay_s=1.5, duration_s=20.0, seed=1)
    top, bottom = sync_figure(run).axes
    for ax in (top, bottom):
        traces = [line.get_label() for line in ax.get_lines()]
        assert not [label for label in traces if label.startswith("_")], traces
        assert _labels(ax) == traces
    r1, r3 = _labels(bottom)
    assert r1.startswith("r1: how far the jobs' iterations line up (1: all in step")
    assert r3.startswith("r3: the same for three groups a third of a period apart")


@pytest.fixture(autouse=True)
def _close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")
