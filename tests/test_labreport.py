"""The lab's report (flexgate.lab.report): what it says about a finished event."""

from __future__ import annotations

import json

from rich.console import Console

from flexgate.lab.report import ACHIEVED_WINDOW, RECORDED_WINDOW, report


def test_the_lab_report_names_the_window_of_each_delivered_figure(tmp_path):
    """The settled-half figure and the gateway's whole-event record differ (5.90 against
    5.64 kW in a lab run): each is shown with its window, in the table and the JSON."""
    trace = [(t * 0.5, 100.0, 94.0, "pending") for t in range(20)]
    trace += [(10 + t * 0.5, 94.1, 94.0, "active") for t in range(40)]
    delivery = {"delivered_kw": 5.64, "measured_s": 19.0}
    event = {"id": "ev-1", "status": "completed", "opt": "in", "delivery": delivery}
    result = {
        "tracking": True,
        "trace": trace,
        "event": event,
        "plan": None,
        "sync": {"loops": [], "verdict": "safe"},
        "nodes": [],
        "delivered_kw": 5.9,
    }
    console = Console(record=True, width=200)
    report([result], [], 6.0, tmp_path, console)
    said = console.export_text()
    assert "achieved at the meter (settled half)" in said
    assert "the gateway's record (whole event)" in said
    assert "5.64 kW over 19 s" in said
    doc = json.loads((tmp_path / "lab-report.json").read_text())
    assert (doc["achieved_window"], doc["delivery_window"]) == (ACHIEVED_WINDOW, RECORDED_WINDOW)
