"""The agents' telemetry summaries as the NATS client keeps them: each node's last, and the
telemetry the fleet reads made of it."""

from __future__ import annotations

from agents.protocol import TelemetryResponse, TelemetrySummary


class KeptSummary:
    """A node's last summary, as it arrived, and as the telemetry the fleet reads: converted
    when first read, not on arrival (2,000 summaries a second come at 10,000 nodes; the fleet
    reads them at most once a `telemetry_max_age_s`, and not at all while no one asks)."""

    __slots__ = ("_telemetry", "arrived", "summary")

    def __init__(self, arrived: float, summary: TelemetrySummary) -> None:
        self.arrived, self.summary = arrived, summary
        self._telemetry: TelemetryResponse | None = None

    def telemetry(self) -> TelemetryResponse:
        if self._telemetry is None:
            self._telemetry = as_telemetry(self.summary)
        return self._telemetry


def as_telemetry(summary: TelemetrySummary) -> TelemetryResponse:
    """A summary as the telemetry the fleet reads: each GPU's mean power, one sample. Its
    jobs and delays are the summary's own, already validated, and pass through as they are."""
    gpus = [
        {"index": i, "power_w": [] if p is None else [p], "sample_interval_s": summary.period_s}
        for i, p in enumerate(summary.gpu_power_w)
    ]
    return TelemetryResponse.model_validate(
        {
            "node_id": summary.node_id,
            "gpus": gpus,
            "jobs": summary.jobs,
            "actuation_delay": summary.actuation_delay,
            "agent_time_s": summary.agent_time_s,
        }
    )
